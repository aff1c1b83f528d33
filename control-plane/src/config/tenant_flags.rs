//! smg 1.13.0's tenant and priority flags, under its names: who a request
//! belongs to, how many requests a tenant may send per minute, and which
//! priority class its queue place has. `config/tenant_files.rs` reads the
//! files they name; core `admission/` enforces them.

use std::path::PathBuf;

use clap::Args;

use sglang_envoy_core::admission::class::Class;

/// Tenants and priority classes on admission control.
#[derive(Debug, Clone, Args)]
pub struct TenantFlags {
    /// Believe the tenant header (`--tenant-header-name`) as the tenant of
    /// a request that did not authenticate with an API key. Only for an
    /// Envoy behind a proxy that sets it: clients can send any header.
    #[arg(long)]
    pub trust_tenant_header: bool,

    /// The header naming the tenant, with `--trust-tenant-header`.
    #[arg(long, default_value = "x-smg-tenant-id")]
    pub tenant_header_name: String,

    /// Queue waiting requests by priority class (`x-smg-priority`:
    /// system, interactive, default, bulk), the highest served first.
    #[arg(long)]
    pub priority_scheduler_enabled: bool,

    /// Highest class of a tenant not listed in the scheduler's YAML.
    #[arg(long, default_value = "default")]
    pub priority_scheduler_default_max_class: Class,

    /// The priority scheduler's YAML (`classes:`, `tenant_policies:`);
    /// without it smg's built-in class queues apply.
    #[arg(long)]
    pub priority_scheduler_config: Option<PathBuf>,

    /// smg's cap on per-tenant scheduler metric labels (accepted; this
    /// router exports no per-tenant scheduler metrics).
    #[arg(long, default_value_t = 32)]
    pub priority_scheduler_tenant_metric_top_n: u32,

    /// Limit each tenant's requests per minute (`--tenant-rate-limit-config`).
    #[arg(long)]
    pub tenant_rate_limit_enabled: bool,

    /// The tenant rate limit's YAML (`default_policy:`, `tenants:`);
    /// required with `--tenant-rate-limit-enabled`.
    #[arg(long)]
    pub tenant_rate_limit_config: Option<PathBuf>,
}
