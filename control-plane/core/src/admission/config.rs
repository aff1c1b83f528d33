//! The two YAML files smg 1.13.0 reads for tenants:
//! `--priority-scheduler-config` (per-class queues, each tenant's highest
//! class) and `--tenant-rate-limit-config` (per-tenant rates), with the
//! checks made when they are loaded. The control plane reads the files;
//! these are their shapes.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Deserialize;

use super::class::{Class, ClassQueue};

/// One class's entry under `classes:` (smg's field names). The slot
/// reservations and preemption are read but not applied here.
#[derive(Debug, Clone, Deserialize)]
pub struct ClassYaml {
    /// smg: slots kept for this class (not applied).
    #[serde(default)]
    pub reserved_floor: u32,
    /// smg: share of slots kept for this class (not applied).
    #[serde(default)]
    pub reserved_per_slot: f64,
    /// Waiters of this class at most.
    pub queue_size: u32,
    /// Longest wait, seconds.
    pub queue_timeout_secs: u64,
    /// Head-of-queue age past which this class goes first, seconds.
    pub starvation_threshold_secs: u64,
    /// smg: may preempt lower classes before their first byte (not applied).
    #[serde(default)]
    pub can_preempt: bool,
}

/// A tenant's entry under `tenant_policies:`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct TenantClassYaml {
    /// The highest class the tenant's requests get.
    pub max_class: Class,
}

/// `--priority-scheduler-config`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SchedulerYaml {
    /// Per-class overrides of smg's built-in queues.
    #[serde(default)]
    pub classes: HashMap<Class, ClassYaml>,
    /// Each listed tenant's highest class, by canonical tenant key.
    #[serde(default)]
    pub tenant_policies: HashMap<String, TenantClassYaml>,
}

/// One tenant's (or the default) rates, `--tenant-rate-limit-config`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantRate {
    /// The canonical tenant key; none on `default_policy`, required on
    /// every entry of `tenants`.
    #[serde(default)]
    pub tenant_key: Option<String>,
    /// smg: LLM tokens per minute (checked > 0, not enforced here).
    pub tokens_per_minute: u32,
    /// Requests per minute, with a burst of as many.
    pub requests_per_minute: u32,
    /// smg: per-model rules; none are supported here yet.
    #[serde(default)]
    pub model_rules: Vec<serde_json::Value>,
}

/// `--tenant-rate-limit-config`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitYaml {
    /// For tenants not listed.
    pub default_policy: TenantRate,
    /// Listed tenants.
    #[serde(default)]
    pub tenants: Vec<TenantRate>,
}

/// Why a tenant configuration was refused at start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A class's timeout or starvation bound is zero.
    #[error("class {0}: queue_timeout_secs and starvation_threshold_secs must be > 0")]
    ZeroDuration(&'static str),
    /// `default_policy` names a tenant.
    #[error("default_policy must not set tenant_key")]
    DefaultHasTenant,
    /// A `tenants` entry without a key.
    #[error("tenants[{0}] is missing tenant_key")]
    MissingTenant(usize),
    /// A key no request can have.
    #[error("tenant key {0:?} is not auth:<id>, header:<id>, ip:<address> or anonymous")]
    NotCanonical(String),
    /// A tenant listed twice.
    #[error("duplicate tenant_key {0:?}")]
    Duplicate(String),
    /// A zero rate.
    #[error("policy {0:?}: tokens_per_minute and requests_per_minute must be > 0")]
    ZeroRate(String),
    /// Per-model rules.
    #[error("policy {0:?}: model_rules are not supported by this router yet")]
    ModelRules(String),
}

/// Whether `key` is a tenant key a request can have (see `tenants.rs`).
pub fn is_tenant_key(key: &str) -> bool {
    if key == "anonymous" {
        return true;
    }
    if let Some(id) = key.strip_prefix("auth:").or(key.strip_prefix("header:")) {
        return !id.is_empty() && id.trim() == id;
    }
    key.strip_prefix("ip:")
        .and_then(|a| a.parse::<std::net::IpAddr>().ok().map(|ip| (a, ip)))
        .is_some_and(|(a, ip)| ip.to_string() == a)
}

impl SchedulerYaml {
    /// Every class's queue: smg's defaults, overridden by `classes:`.
    pub fn queues(&self) -> Result<[ClassQueue; 4], ConfigError> {
        let mut queues = Class::ALL.map(ClassQueue::smg_default);
        for (class, c) in &self.classes {
            if c.queue_timeout_secs == 0 || c.starvation_threshold_secs == 0 {
                return Err(ConfigError::ZeroDuration(class.as_str()));
            }
            queues[*class as usize] = ClassQueue {
                size: c.queue_size as usize,
                timeout: Duration::from_secs(c.queue_timeout_secs),
                starvation: Duration::from_secs(c.starvation_threshold_secs),
            };
        }
        Ok(queues)
    }
}

impl RateLimitYaml {
    /// smg's load-time checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.default_policy.tenant_key.is_some() {
            return Err(ConfigError::DefaultHasTenant);
        }
        check_rate("default", &self.default_policy)?;
        let mut seen = HashSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            let key = t
                .tenant_key
                .as_deref()
                .filter(|k| !k.trim().is_empty())
                .ok_or(ConfigError::MissingTenant(i))?;
            if !is_tenant_key(key) {
                return Err(ConfigError::NotCanonical(key.to_string()));
            }
            if !seen.insert(key) {
                return Err(ConfigError::Duplicate(key.to_string()));
            }
            check_rate(key, t)?;
        }
        Ok(())
    }
}

fn check_rate(label: &str, rate: &TenantRate) -> Result<(), ConfigError> {
    if rate.tokens_per_minute == 0 || rate.requests_per_minute == 0 {
        return Err(ConfigError::ZeroRate(label.to_string()));
    }
    if !rate.model_rules.is_empty() {
        return Err(ConfigError::ModelRules(label.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(key: Option<&str>, rpm: u32) -> TenantRate {
        TenantRate {
            tenant_key: key.map(str::to_string),
            tokens_per_minute: 100,
            requests_per_minute: rpm,
            model_rules: Vec::new(),
        }
    }

    #[test]
    fn rate_configs_are_checked_as_smg_checks_them() {
        let ok = RateLimitYaml {
            default_policy: rate(None, 1),
            tenants: vec![rate(Some("header:a"), 2), rate(Some("ip:10.0.0.1"), 2)],
        };
        assert_eq!(ok.validate(), Ok(()));
        let bad = |tenants| RateLimitYaml {
            default_policy: rate(None, 1),
            tenants,
        };
        assert!(bad(vec![rate(Some("team-red"), 1)]).validate().is_err());
        assert!(bad(vec![rate(Some("ip:not-an-ip"), 1)]).validate().is_err());
        assert!(bad(vec![rate(None, 1)]).validate().is_err());
        assert!(bad(vec![rate(Some("header:a"), 0)]).validate().is_err());
        let twice = bad(vec![rate(Some("header:a"), 1), rate(Some("header:a"), 1)]);
        assert_eq!(
            twice.validate(),
            Err(ConfigError::Duplicate("header:a".into()))
        );
    }

    #[test]
    fn class_overrides_replace_smg_defaults() {
        let mut yaml = SchedulerYaml::default();
        yaml.classes.insert(
            Class::Bulk,
            ClassYaml {
                reserved_floor: 0,
                reserved_per_slot: 0.0,
                queue_size: 3,
                queue_timeout_secs: 7,
                starvation_threshold_secs: 9,
                can_preempt: false,
            },
        );
        let q = yaml.queues().unwrap();
        assert_eq!(q[Class::Bulk as usize].size, 3);
        assert_eq!(q[Class::Bulk as usize].timeout, Duration::from_secs(7));
        assert_eq!(
            q[Class::Default as usize],
            ClassQueue::smg_default(Class::Default)
        );
    }
}
