//! Command-line flags. Names and defaults follow sglang-router 0.3.2 where a
//! flag means the same thing, so an operator's launch line carries over.

use std::net::IpAddr;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, ValueEnum};

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
    /// This router's own: the worker where the request is expected to
    /// start soonest, weighing the prefill its cache saves against the
    /// prefill work queued on it (see docs/cost-aware-policy.md).
    CostAware,
    /// sglang-router's sticky sessions: requests with the same
    /// `X-SMG-Routing-Key` header go to the same worker (another one only
    /// while it is unhealthy); requests without it as `--assignment-mode`.
    Manual,
}

/// How the `manual` policy picks a worker for a routing key it has not
/// seen (or whose workers are all unhealthy), and for requests without a
/// key (sglang-router 0.3.2's `--assignment-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum AssignmentMode {
    /// Uniformly random healthy worker.
    Random,
    /// The healthy worker with the fewest requests in flight (ties at random).
    MinLoad,
    /// The healthy worker with the fewest distinct routing keys among its
    /// requests in flight (ties at random).
    MinGroup,
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

    /// Routing policy (in PD mode, the default for prefill and decode).
    #[arg(long, value_enum, default_value = "cache_aware")]
    pub policy: PolicyKind,

    /// Prefill/decode disaggregation: every request goes to a prefill and a
    /// decode worker at once, joined by bootstrap fields.
    #[arg(long)]
    pub pd_disaggregation: bool,

    /// A prefill worker: `URL [BOOTSTRAP_PORT|none]` (repeat the flag for more).
    #[arg(long, num_args = 1..=2, action = ArgAction::Append, value_names = ["URL", "BOOTSTRAP_PORT"])]
    pub prefill: Vec<String>,

    /// `--prefill` grouped by occurrence (filled by [`Args::parse_args`]).
    #[arg(skip)]
    pub prefill_groups: Vec<Vec<String>>,

    /// A decode worker URL (repeat the flag for more).
    #[arg(long, action = ArgAction::Append, value_name = "URL")]
    pub decode: Vec<String>,

    /// Policy for choosing the prefill worker (default: --policy).
    #[arg(long, value_enum)]
    pub prefill_policy: Option<PolicyKind>,

    /// Policy for choosing the decode worker (default: --policy).
    #[arg(long, value_enum)]
    pub decode_policy: Option<PolicyKind>,

    /// Route to each data-parallel rank of a worker as its own unit (own load,
    /// own cache tree) and tell the worker the rank; the ranks are read from
    /// the worker's `/get_server_info` (`dp_size`).
    #[arg(long)]
    pub dp_aware: bool,

    /// How long a worker that cannot be registered yet (its host name does
    /// not resolve; with --dp-aware, it does not tell its dp_size) keeps
    /// being tried, and how long a worker that is not healthy is probed on
    /// the fast schedule (every 1-3 s) before backing off to the interval.
    #[arg(long, default_value_t = 1800)]
    pub worker_startup_timeout_secs: u64,

    /// Accepted for sglang-router launch lines. In sglang-router 0.3.2 it is
    /// the period of power_of_two's `GET /get_load` poll; this router's
    /// power_of_two compares its own live in-flight counts, so there is
    /// nothing to poll.
    #[arg(long, default_value_t = 30)]
    pub worker_startup_check_interval: u64,

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

    /// cost_aware: what one request in flight costs beyond its prefill, in
    /// prompt bytes.
    #[arg(long, default_value_t = 32)]
    pub cost_per_request: u64,

    /// cost_aware: weight of the prefill work queued on a worker against the
    /// prefill a request would do there (0..=1 favours cache hits).
    #[arg(long, default_value_t = 0.5)]
    pub cost_queue_weight: f64,

    /// manual: a routing key not seen for this long is forgotten (checked
    /// every --eviction-interval-secs; 0 keeps keys forever).
    #[arg(long, default_value_t = 14400)]
    pub max_idle_secs: u64,

    /// manual: how a new routing key, or a request without one, gets its worker.
    #[arg(long, value_enum, default_value = "random")]
    pub assignment_mode: AssignmentMode,

    /// Seconds between LRU evictions of the approximate trees (and of the
    /// manual policy's idle routing keys).
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

    /// Bearer token required by the admin API's mutating endpoints (add and
    /// remove workers). Without it anyone who reaches the admin port (or
    /// Envoy's client port, which routes the admin paths) can change the
    /// fleet; set it in production.
    #[arg(long, env = "SGLANG_ENVOY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Largest request body, in bytes: the `max_body_bytes` the Envoy config
    /// gives the filter (`MAX_BODY_BYTES`). Sizes the gRPC messages the
    /// control plane accepts, which carry whole bodies in PD mode and
    /// through the ext_proc front door.
    #[arg(long, default_value_t = 33_554_432)]
    pub max_payload_size: usize,

    /// ext_proc front door: most bytes of request bodies Envoy may hold for
    /// routed requests at once (from a body's arrival until its worker
    /// answers); past it, requests get a JSON 503. The wasm filter has the
    /// same budget per Envoy thread (`max_buffered_bytes`).
    #[arg(long, default_value_t = 268_435_456)]
    pub ext_proc_max_buffered_bytes: usize,

    /// Accept workers at link-local addresses (169.254.0.0/16, fe80::/10),
    /// where cloud metadata services live; refused by default.
    #[arg(long)]
    pub allow_link_local_workers: bool,

    /// Keep the worker registry (workers added at run time too) in this JSON
    /// file and restore it at startup.
    #[arg(long)]
    pub state_file: Option<std::path::PathBuf>,

    /// Log level: trace, debug, info, warn, error.
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

impl Args {
    /// Parses the command line (exits with usage on errors, like clap).
    pub fn parse_args() -> Args {
        Self::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Parses `argv`, keeping each `--prefill URL [PORT]` as one group.
    pub fn try_parse_args<I, T>(argv: I) -> Result<Args, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = Args::command().try_get_matches_from(argv)?;
        let mut args = Args::from_arg_matches(&matches)?;
        args.prefill_groups = matches
            .get_occurrences::<String>("prefill")
            .map(|groups| groups.map(|g| g.cloned().collect()).collect())
            .unwrap_or_default();
        Ok(args)
    }

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
        if self.health_check_interval_secs == 0
            || self.eviction_interval_secs == 0
            || self.worker_startup_check_interval == 0
        {
            return Err("intervals must be at least one second".into());
        }
        if self.health_failure_threshold == 0 || self.health_success_threshold == 0 {
            return Err("health thresholds must be at least 1".into());
        }
        if !self.health_check_endpoint.starts_with('/') {
            return Err("--health-check-endpoint must start with /".into());
        }
        if self
            .admin_token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err("--admin-token must not be empty".into());
        }
        if self.pd_disaggregation {
            if !self.worker_urls.is_empty() {
                return Err(
                    "--worker-urls is for regular mode; with --pd-disaggregation use --prefill and --decode"
                        .into(),
                );
            }
            self.prefill_workers()?;
        } else if !self.prefill.is_empty() || !self.decode.is_empty() {
            return Err("--prefill and --decode need --pd-disaggregation".into());
        }
        Ok(())
    }

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

    /// The largest gRPC message the control plane accepts: a question
    /// carrying a whole body, its routing text (at most twice the body's
    /// size) and headers, with room to spare.
    pub fn grpc_message_limit(&self) -> usize {
        self.max_payload_size
            .saturating_mul(3)
            .saturating_add(1 << 20)
            .max(4 << 20)
    }

    /// The prefill policy (`--prefill-policy`, else `--policy`).
    pub fn prefill_policy(&self) -> PolicyKind {
        self.prefill_policy.unwrap_or(self.policy)
    }

    /// The decode policy (`--decode-policy`, else `--policy`).
    pub fn decode_policy(&self) -> PolicyKind {
        self.decode_policy.unwrap_or(self.policy)
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
        assert_eq!(a.max_idle_secs, 14400);
        assert_eq!(a.worker_startup_timeout_secs, 1800);
        assert_eq!(a.worker_startup_check_interval, 30);
        assert_eq!(a.assignment_mode, AssignmentMode::Random);
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
    fn pd_flags_as_sglang_router_takes_them() {
        let a = Args::try_parse_args([
            "cp",
            "--pd-disaggregation",
            "--prefill",
            "http://p1:30001",
            "9001",
            "--prefill",
            "http://p2:30001",
            "none",
            "--prefill",
            "http://p3:30001",
            "--decode",
            "http://d1:30002",
            "--decode",
            "http://d2:30002",
            "--policy",
            "random",
            "--decode-policy",
            "round_robin",
        ])
        .unwrap();
        assert!(a.validate().is_ok(), "{:?}", a.validate());
        assert_eq!(
            a.prefill_workers().unwrap(),
            [
                ("http://p1:30001".to_string(), Some(9001)),
                ("http://p2:30001".to_string(), None),
                ("http://p3:30001".to_string(), None),
            ]
        );
        assert_eq!(a.decode, ["http://d1:30002", "http://d2:30002"]);
        assert_eq!(a.prefill_policy(), PolicyKind::Random);
        assert_eq!(a.decode_policy(), PolicyKind::RoundRobin);
        let bad = Args::try_parse_args([
            "cp",
            "--pd-disaggregation",
            "--prefill",
            "http://p1:1",
            "port",
        ])
        .unwrap();
        assert!(bad.validate().is_err());
        let no_pd = Args::parse_from(["cp", "--decode", "http://d:1"]);
        assert!(no_pd.validate().is_err());
    }

    #[test]
    fn manual_policy_flags_as_sglang_router_takes_them() {
        let a = Args::parse_from([
            "cp",
            "--policy",
            "manual",
            "--assignment-mode",
            "min_group",
            "--max-idle-secs",
            "60",
        ]);
        assert_eq!(a.policy, PolicyKind::Manual);
        assert_eq!(a.assignment_mode, AssignmentMode::MinGroup);
        assert_eq!(a.max_idle_secs, 60);
        let pd = Args::parse_from([
            "cp",
            "--prefill-policy",
            "manual",
            "--decode-policy",
            "manual",
        ]);
        assert_eq!(pd.prefill_policy, Some(PolicyKind::Manual));
        assert!(Args::try_parse_args(["cp", "--assignment-mode", "bucket"]).is_err());
    }

    #[test]
    fn bad_threshold_is_rejected() {
        let a = Args::parse_from(["cp", "--cache-threshold", "1.5"]);
        assert!(a.validate().is_err());
    }
}
