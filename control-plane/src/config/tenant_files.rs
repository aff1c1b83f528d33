//! smg's tenant flags to admission options: `--priority-scheduler-*` and
//! `--tenant-rate-limit-*`, reading their YAML files at start-up.

use std::path::{Path, PathBuf};

use sglang_envoy_core::admission::class::ClassQueue;
use sglang_envoy_core::admission::config::{
    is_tenant_key, ConfigError, RateLimitYaml, SchedulerYaml,
};
use sglang_envoy_core::admission::{Class, Priorities, TenantOptions};

use super::Args;

/// Why the tenant flags cannot start the router.
#[derive(Debug, thiserror::Error)]
pub enum TenantConfigError {
    /// A file cannot be read.
    #[error("{flag} {path}: {source}")]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file is not the YAML smg reads.
    #[error("{flag} {path}: {source}")]
    Parse {
        flag: &'static str,
        path: PathBuf,
        source: serde_yaml::Error,
    },
    /// A file's content is refused.
    #[error("{flag} {path}: {source}")]
    Invalid {
        flag: &'static str,
        path: PathBuf,
        source: ConfigError,
    },
    /// `--tenant-rate-limit-enabled` without its file.
    #[error("--tenant-rate-limit-enabled needs --tenant-rate-limit-config")]
    NoRateFile,
}

const SCHEDULER_FLAG: &str = "--priority-scheduler-config";
const RATE_FLAG: &str = "--tenant-rate-limit-config";

fn read<T: serde::de::DeserializeOwned>(
    flag: &'static str,
    path: &Path,
) -> Result<T, TenantConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| TenantConfigError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })?;
    serde_yaml::from_str(&text).map_err(|source| TenantConfigError::Parse {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

fn invalid<'a>(
    flag: &'static str,
    path: &'a Path,
) -> impl Fn(ConfigError) -> TenantConfigError + 'a {
    move |source| TenantConfigError::Invalid {
        flag,
        path: path.to_path_buf(),
        source,
    }
}

impl Args {
    /// The tenant options of the flags. smg reads the files only when
    /// their feature is enabled; so does this.
    pub fn tenant_options(&self) -> Result<TenantOptions, TenantConfigError> {
        let priority = if self.tenants.priority_scheduler_enabled {
            Some(self.priorities()?)
        } else {
            None
        };
        let rates = if self.tenants.tenant_rate_limit_enabled {
            let path = self
                .tenants
                .tenant_rate_limit_config
                .as_deref()
                .ok_or(TenantConfigError::NoRateFile)?;
            let yaml: RateLimitYaml = read(RATE_FLAG, path)?;
            yaml.validate().map_err(invalid(RATE_FLAG, path))?;
            Some(yaml)
        } else {
            None
        };
        Ok(TenantOptions {
            trust_header: self.tenants.trust_tenant_header,
            priority,
            rates,
        })
    }

    fn priorities(&self) -> Result<Priorities, TenantConfigError> {
        let default_max = self.tenants.priority_scheduler_default_max_class;
        let Some(path) = self.tenants.priority_scheduler_config.as_deref() else {
            return Ok(Priorities {
                queues: Class::ALL.map(ClassQueue::smg_default),
                default_max,
                tenant_max: Default::default(),
            });
        };
        let yaml: SchedulerYaml = read(SCHEDULER_FLAG, path)?;
        let queues = yaml.queues().map_err(invalid(SCHEDULER_FLAG, path))?;
        if let Some(key) = yaml.tenant_policies.keys().find(|k| !is_tenant_key(k)) {
            return Err(invalid(SCHEDULER_FLAG, path)(ConfigError::NotCanonical(
                key.clone(),
            )));
        }
        Ok(Priorities {
            queues,
            default_max,
            tenant_max: yaml
                .tenant_policies
                .into_iter()
                .map(|(k, v)| (k, v.max_class))
                .collect(),
        })
    }
}
