//! Command-line flags. Names and defaults follow sglang-router 0.3.2 where a
//! flag means the same thing, so an operator's launch line carries over.

use std::net::IpAddr;

use clap::{Parser, ValueEnum};

/// Routing policy for choosing a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Uniformly random healthy worker.
    Random,
    /// Healthy workers in turn.
    RoundRobin,
    /// Two random healthy workers; the one with fewer requests in flight.
    PowerOfTwo,
    /// sglang-router's cache-aware policy: prefix match on approximate radix
    /// trees, shortest queue when loads are imbalanced.
    CacheAware,
}

/// The control plane's flags.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "sglang-envoy-control-plane",
    about = "Routes SGLang requests for Envoy: worker registry, health checks, loads, cache-aware policies, EDS and admin API"
)]
pub struct Args {
    /// Worker URLs to route to (http://host:port).
    #[arg(long, num_args = 0.., value_delimiter = ' ')]
    pub worker_urls: Vec<String>,

    /// Routing policy.
    #[arg(long, value_enum, default_value = "cache_aware")]
    pub policy: PolicyKind,

    /// Prefix match rate (0..1) above which cache_aware sends a request to the
    /// worker holding the longest match.
    #[arg(long, default_value_t = 0.3)]
    pub cache_threshold: f32,

    /// Loads are imbalanced when max - min exceeds this (and the relative test holds).
    #[arg(long, default_value_t = 64)]
    pub balance_abs_threshold: usize,

    /// Loads are imbalanced when max > min * this (and the absolute test holds).
    #[arg(long, default_value_t = 1.5)]
    pub balance_rel_threshold: f32,

    /// Seconds between LRU evictions of the approximate trees.
    #[arg(long, default_value_t = 60)]
    pub eviction_interval_secs: u64,

    /// Largest approximate tree per worker, in bytes of text.
    #[arg(long, default_value_t = 67_108_864)]
    pub max_tree_size: usize,

    /// Seconds between health checks of each worker.
    #[arg(long, default_value_t = 60)]
    pub health_check_interval_secs: u64,

    /// Timeout of one health check.
    #[arg(long, default_value_t = 5)]
    pub health_check_timeout_secs: u64,

    /// Consecutive failed checks that mark a worker unhealthy.
    #[arg(long, default_value_t = 3)]
    pub health_failure_threshold: u32,

    /// Consecutive good checks that mark an unhealthy worker healthy again.
    #[arg(long, default_value_t = 2)]
    pub health_success_threshold: u32,

    /// Path of the workers' health endpoint.
    #[arg(long, default_value = "/health")]
    pub health_check_endpoint: String,

    /// Other workers offered to Envoy after the chosen one; Envoy retries on
    /// them, in order, when a connection to the chosen worker fails.
    #[arg(long, default_value_t = 2)]
    pub max_fallback_workers: usize,

    /// A request whose end was never reported stops counting as load after this.
    #[arg(long, default_value_t = 1800)]
    pub request_timeout_secs: u64,

    /// Address the admin API and the gRPC service listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,

    /// Port of the admin HTTP API (add/remove workers, loads, metrics).
    #[arg(long, default_value_t = 30010)]
    pub admin_port: u16,

    /// Port of the gRPC service the Envoy filter and EDS use.
    #[arg(long, default_value_t = 30011)]
    pub grpc_port: u16,

    /// Log level: trace, debug, info, warn, error.
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

impl Args {
    /// Rejects values no policy can work with.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.cache_threshold) {
            return Err(format!(
                "--cache-threshold must be within 0..1, got {}",
                self.cache_threshold
            ));
        }
        if self.balance_rel_threshold < 1.0 {
            return Err("--balance-rel-threshold must be at least 1.0".into());
        }
        if self.health_check_interval_secs == 0 || self.eviction_interval_secs == 0 {
            return Err("intervals must be at least one second".into());
        }
        if self.health_failure_threshold == 0 || self.health_success_threshold == 0 {
            return Err("health thresholds must be at least 1".into());
        }
        if !self.health_check_endpoint.starts_with('/') {
            return Err("--health-check-endpoint must start with /".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_sglang_router() {
        let a = Args::parse_from(["cp"]);
        assert_eq!(a.policy, PolicyKind::CacheAware);
        assert_eq!(a.cache_threshold, 0.3);
        assert_eq!(a.balance_abs_threshold, 64);
        assert_eq!(a.balance_rel_threshold, 1.5);
        assert_eq!(a.eviction_interval_secs, 60);
        assert_eq!(a.max_tree_size, 67_108_864);
        assert_eq!(a.health_check_interval_secs, 60);
        assert_eq!(a.health_failure_threshold, 3);
        assert!(a.validate().is_ok());
    }

    #[test]
    fn worker_urls_take_several_values() {
        let a = Args::parse_from([
            "cp",
            "--worker-urls",
            "http://a:1",
            "http://b:2",
            "--policy",
            "round_robin",
        ]);
        assert_eq!(a.worker_urls, ["http://a:1", "http://b:2"]);
        assert_eq!(a.policy, PolicyKind::RoundRobin);
    }

    #[test]
    fn bad_threshold_is_rejected() {
        let a = Args::parse_from(["cp", "--cache-threshold", "1.5"]);
        assert!(a.validate().is_err());
    }
}
