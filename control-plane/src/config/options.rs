//! What the flags mean to each part of the control plane: the options
//! struct each part is built from, so that no part reads the whole flag bag.

use std::time::Duration;

use super::tenant_files::TenantConfigError;
use super::{Args, PolicyKind};
use crate::admission::AdmissionOptions;
use crate::retry::RetryOptions;
use crate::workers::probe_schedule::ProbePlan;
use crate::workers::{CircuitConfig, HealthOptions, WorkerTls};

impl Args {
    /// The `--prefill` workers as (URL, bootstrap port; `None` for `none`).
    pub fn prefill_workers(&self) -> Result<Vec<(String, Option<u16>)>, String> {
        self.prefill_groups
            .iter()
            .map(|entry| match entry.as_slice() {
                [url] => Ok((url.clone(), None)),
                [url, port] => Ok((url.clone(), parse_bootstrap_port(port)?)),
                _ => Err("--prefill takes URL [BOOTSTRAP_PORT|none]".into()),
            })
            .collect()
    }

    /// The prefill policy (`--prefill-policy`, else `--policy`).
    pub fn prefill_policy(&self) -> PolicyKind {
        self.prefill_policy.unwrap_or(self.policy)
    }

    /// The decode policy (`--decode-policy`, else `--policy`).
    pub fn decode_policy(&self) -> PolicyKind {
        self.decode_policy.unwrap_or(self.policy)
    }

    /// The largest gRPC message the control plane accepts: a question
    /// carrying a whole body, its routing text (at most twice the body's
    /// size) and headers, with room to spare.
    pub fn grpc_message_limit(&self) -> usize {
        self.max_payload_size
            .saturating_mul(3)
            .saturating_add(1 << 20)
            .max(4 << 20)
    }

    /// How failed attempts are retried.
    pub fn retry_options(&self) -> RetryOptions {
        RetryOptions {
            max_attempts: if self.disable_retries {
                1
            } else {
                self.retry_max_retries
            },
            max_fallbacks: self.max_fallback_workers,
            stream_start_timeout: (self.stream_start_timeout_secs > 0)
                .then(|| Duration::from_secs(self.stream_start_timeout_secs)),
        }
    }

    /// Admission control, when `--max-concurrent-requests` is positive or
    /// tenants' rates are limited; the tenant YAML files are read here, and
    /// one that cannot be read or is not valid stops the start-up.
    pub fn admission(&self) -> Result<Option<AdmissionOptions>, TenantConfigError> {
        let tenants = self.tenant_options()?;
        if self.max_concurrent_requests <= 0 && tenants.rates.is_none() {
            return Ok(None);
        }
        Ok(Some(AdmissionOptions {
            limit: usize::try_from(self.max_concurrent_requests)
                .ok()
                .filter(|n| *n > 0)
                .unwrap_or(usize::MAX),
            queue_size: self.queue_size,
            queue_timeout: Duration::from_secs(self.queue_timeout_secs),
            tenants,
        }))
    }

    /// `--tenant-header-name`, lower-cased as Envoy hands headers over,
    /// when `--trust-tenant-header` says to believe it.
    pub fn trusted_tenant_header(&self) -> Option<String> {
        self.tenants
            .trust_tenant_header
            .then(|| self.tenants.tenant_header_name.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
    }

    /// How the workers' circuit breakers behave.
    pub fn circuit_config(&self) -> CircuitConfig {
        CircuitConfig {
            failure_threshold: self.cb_failure_threshold,
            success_threshold: self.cb_success_threshold,
            open_for: Duration::from_secs(self.cb_timeout_duration_secs),
            window: Duration::from_secs(self.cb_window_duration_secs),
            enabled: !self.disable_circuit_breaker,
        }
    }

    /// The TLS flags for connections to workers.
    pub fn worker_tls(&self) -> WorkerTls {
        WorkerTls {
            client_cert: self.client_cert_path.clone(),
            client_key: self.client_key_path.clone(),
            ca_certs: self.ca_cert_paths.clone(),
        }
    }

    /// How workers' health is checked.
    pub fn health_options(&self) -> HealthOptions {
        HealthOptions {
            path: self.health_check_endpoint.clone(),
            timeout: Duration::from_secs(self.health_check_timeout_secs),
            plan: ProbePlan {
                interval: Duration::from_secs(self.health_check_interval_secs),
                fast_window: Duration::from_secs(self.worker_startup_timeout_secs),
            },
            failure_threshold: self.health_failure_threshold,
            success_threshold: self.health_success_threshold,
            disabled: self.disable_health_check,
        }
    }

    /// How often the workers' load reports are read; `None` when off.
    pub fn load_monitor_interval(&self) -> Option<Duration> {
        (!self.disable_load_monitoring)
            .then(|| Duration::try_from_secs_f64(self.load_monitor_interval).ok())
            .flatten()
    }
}

/// A bootstrap port as written on the command line or in the admin API:
/// a port number, or `none` (decode workers then use their default).
pub fn parse_bootstrap_port(text: &str) -> Result<Option<u16>, String> {
    if text.eq_ignore_ascii_case("none") || text.eq_ignore_ascii_case("null") {
        return Ok(None);
    }
    match text.parse::<u16>() {
        Ok(p) if p > 0 => Ok(Some(p)),
        _ => Err(format!(
            "bootstrap port must be 1..65535 or `none`, got `{text}`"
        )),
    }
}
