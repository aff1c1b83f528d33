//! Command-line flags. Names and defaults follow sglang-router 0.3.2 where a
//! flag means the same thing, so an operator's launch line carries over.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};

use sglang_envoy_core::policy;
pub use sglang_envoy_core::policy::{AssignmentMode, PolicyKind};

pub use auth_flags::AuthFlags;
pub use flag_values::{DestinationFlag, WireProfileFlag};
pub use fleet_store_flags::FleetStoreFlags;
pub use kv_events_flags::KvEventsFlags;
pub use options::parse_bootstrap_port;
pub use smg_policy_flags::SmgPolicyFlags;
pub use tenant_flags::TenantFlags;

/// The control plane's flags.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "sglang-envoy-control-plane",
    version,
    about = "Routes SGLang requests for Envoy: worker registry, health checks, loads, cache-aware policies, EDS and admin API"
)]
pub struct Args {
    /// Worker URLs to route to (http://host:port or https://host:port).
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

    /// The spelling of the DP and PD fields written into request bodies:
    /// `auto` (each worker's, from its SGLang version), `legacy` or
    /// `upstream` (see docs/routing.md, "Wire profiles").
    #[arg(long, value_enum, default_value = "auto")]
    pub wire_profile: WireProfileFlag,

    /// How long a worker that cannot be registered yet (its host name does
    /// not resolve; with --dp-aware, it does not tell its dp_size) keeps
    /// being tried, and how long a worker that is not healthy is probed on
    /// the fast schedule (every 1-3 s) before backing off to the interval.
    #[arg(long, default_value_t = 1800)]
    pub worker_startup_timeout_secs: u64,

    /// Seconds between re-resolutions of workers' DNS names (a pod that moves
    /// keeps its name, not its IP; Envoy is given IPs). 0: resolve once.
    #[arg(long, default_value_t = 10)]
    pub dns_refresh_secs: u64,

    /// Accepted for sglang-router launch lines. In sglang-router 0.3.2 it is
    /// the period of power_of_two's `GET /get_load` poll; here
    /// `--load-monitor-interval` sets how often every worker's load report
    /// is read.
    #[arg(long, default_value_t = 30)]
    pub worker_startup_check_interval: u64,
    /// Seconds between two reads of each worker's own load report
    /// (`/v1/loads`, else `/get_load`, per DP rank), which every policy adds
    /// to what this router sent since (smg's flag; smg polls every 10 s, and
    /// only for load-aware policies: here every policy, sub-second, so that
    /// traffic from elsewhere is seen within a second).
    #[arg(long, default_value_t = 0.5)]
    pub load_monitor_interval: f64,
    /// Never read the workers' load reports: route on this router's own
    /// counts only (smg's flag).
    #[arg(long)]
    pub disable_load_monitoring: bool,

    /// The KV-event subscriber's flags.
    #[command(flatten)]
    pub kv_events: KvEventsFlags,

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
    #[arg(long, default_value_t = policy::PER_REQUEST_COST)]
    pub cost_per_request: u64,

    /// cost_aware: weight of the prefill work queued on a worker against the
    /// prefill a request would do there (0..=1 favours cache hits).
    #[arg(long, default_value_t = policy::QUEUE_WEIGHT)]
    pub cost_queue_weight: f64,

    /// cost_aware: pass over a worker far above the fleet's mean of requests
    /// in flight, however cheap its cache makes it (true or false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub cost_spill_gate: bool,

    /// cost_aware: count the prefill under way on a worker only for what is
    /// left of it, by the pace the worker's prefill reports showed (true or
    /// false; false counts it in full until its report).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub cost_prefill_progress: bool,

    /// smg's prefix_hash and least_load tuning.
    #[command(flatten)]
    pub smg_policies: SmgPolicyFlags,

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
    #[arg(long, default_value_t = policy::MAX_TREE_SIZE)]
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

    /// Distinct other workers Envoy may retry a failed attempt on (then
    /// the same ones again, up to `--retry-max-retries` attempts).
    #[arg(long, default_value_t = 2)]
    pub max_fallback_workers: usize,

    /// Attempts per request, the first included (sglang-router's meaning):
    /// a refused or reset connection, a 408, 429 or 5xx answer, or a stream
    /// that does not start, is retried on another worker before any byte
    /// reaches the client.
    #[arg(long, default_value_t = 5)]
    pub retry_max_retries: u32,

    /// Backoff before the first retry. Envoy does the retrying, with the
    /// route's `retry_back_off` (envoy/envoy.yaml: 50 ms, up to 30 s, doubling
    /// with full jitter); accepted for sglang-router launch lines.
    #[arg(long, default_value_t = 50)]
    pub retry_initial_backoff_ms: u64,

    /// Longest backoff (see `--retry-initial-backoff-ms`).
    #[arg(long, default_value_t = 30_000)]
    pub retry_max_backoff_ms: u64,

    /// Backoff growth per retry (see `--retry-initial-backoff-ms`; Envoy
    /// doubles).
    #[arg(long, default_value_t = 1.5)]
    pub retry_backoff_multiplier: f32,

    /// Backoff jitter (see `--retry-initial-backoff-ms`; Envoy's is full).
    #[arg(long, default_value_t = 0.2)]
    pub retry_jitter_factor: f32,

    /// One attempt per request: no retries at all.
    #[arg(long)]
    pub disable_retries: bool,

    /// A streamed answer that has not started after this many seconds counts
    /// as a failed attempt (SGLang starts a stream at once; a worker that
    /// does not is stalled) and is retried; 0: no bound.
    #[arg(long, default_value_t = 10)]
    pub stream_start_timeout_secs: u64,

    /// Consecutive failed requests that open a worker's circuit: it gets
    /// no new requests until `--cb-timeout-duration-secs` pass.
    #[arg(long, default_value_t = 10)]
    pub cb_failure_threshold: u32,

    /// Consecutive successes that close a half-open circuit.
    #[arg(long, default_value_t = 3)]
    pub cb_success_threshold: u32,

    /// How long an open circuit keeps its worker out of rotation.
    #[arg(long, default_value_t = 60)]
    pub cb_timeout_duration_secs: u64,

    /// Failures further apart than this do not add up to a streak.
    #[arg(long, default_value_t = 120)]
    pub cb_window_duration_secs: u64,

    /// Circuits never open.
    #[arg(long)]
    pub disable_circuit_breaker: bool,

    /// Inference requests in flight at most (through every Envoy and front
    /// door of this control plane); the next ones wait in a queue. 0 or
    /// less: no limit.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub max_concurrent_requests: i64,

    /// Requests that may wait for a slot; past it, 429. 0: no queue.
    #[arg(long, default_value_t = 100)]
    pub queue_size: usize,

    /// Longest wait for a slot; past it, 408.
    #[arg(long, default_value_t = 60)]
    pub queue_timeout_secs: u64,

    /// Tenants and priority classes (smg's flags).
    #[command(flatten)]
    pub tenants: TenantFlags,

    /// A request whose end was never reported stops counting as load after this.
    #[arg(long, default_value_t = 1800)]
    pub request_timeout_secs: u64,

    /// On SIGTERM, the longest the control plane waits for what it still
    /// runs (streams, calls, PD prefill halves) before it exits
    /// (`shutdown.rs`); sglang-router's flag and default.
    #[arg(long, default_value_t = 180)]
    pub shutdown_grace_period_secs: u64,

    /// Address the admin API and the gRPC service listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,

    /// Port of the admin HTTP API (add/remove workers, loads, metrics).
    #[arg(long, default_value_t = 30010)]
    pub admin_port: u16,

    /// Port of the gRPC service the Envoy filter and EDS use.
    #[arg(long, default_value_t = 30011)]
    pub grpc_port: u16,

    /// Serve the gRPC port over TLS, as InferencePool gateways expect of an
    /// endpoint picker: with the certificate in --cert-path, or without it
    /// a self-signed one made at start. `--secure-serving=false` is taken
    /// too (the endpoint picker's spelling).
    #[arg(
        long,
        num_args = 0..=1,
        default_missing_value = "true",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub secure_serving: bool,

    /// Directory holding `tls.crt` and `tls.key` (a Kubernetes TLS secret
    /// mounted) for --secure-serving.
    #[arg(long)]
    pub cert_path: Option<PathBuf>,

    /// Also answer gRPC health checks, in plaintext, on this port (an
    /// endpoint picker's 9003: kubelet gRPC probes cannot speak TLS).
    #[arg(long)]
    pub grpc_health_port: Option<u16>,

    /// Bearer token required by the admin API's mutating endpoints (add and
    /// remove workers). Without it the admin port takes changes from its
    /// own host only (Envoy's client port and other hosts get 403); set it
    /// to manage the fleet from elsewhere.
    #[arg(long, env = "SGLANG_ENVOY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// `--prefill-policy bucket`: how often the prompt-length ranges of the
    /// prefill workers are fitted to the last interval's requests.
    #[arg(long, default_value_t = 5)]
    pub bucket_adjust_interval_secs: u64,

    /// sglang-router's `--api-key`: inference requests must carry
    /// `Authorization: Bearer <key>` (401 otherwise), and the control
    /// plane's own calls to workers carry it.
    #[arg(long, env = "SGLANG_ENVOY_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// Send each routing decision as an OpenTelemetry span to
    /// `--otlp-traces-endpoint`, joined to the client's trace (W3C
    /// `traceparent`); Envoy's own tracing comes from the same flags
    /// (`OTLP_TRACES_ENDPOINT` of envoy/render.sh).
    #[arg(long)]
    pub enable_trace: bool,

    /// Also measure each decision's CPU time (two system calls a decision)
    /// into `sgl_router_decision_cpu_seconds`: the decision's own work,
    /// apart from the time its thread waited for a core (benchmarks).
    #[arg(long)]
    pub decision_cpu_metric: bool,

    /// The OTLP/gRPC collector, `host:port` (or a URL), for `--enable-trace`.
    #[arg(long, default_value = "localhost:4317")]
    pub otlp_traces_endpoint: String,

    /// sglang-router's control-plane authentication: API keys, JWTs, audit.
    #[command(flatten)]
    pub auth: AuthFlags,

    /// The worker list shared by several control planes.
    #[command(flatten)]
    pub fleet_store: FleetStoreFlags,

    /// Largest request body, in bytes: the `max_body_bytes` the Envoy config
    /// gives the filter (`MAX_BODY_BYTES`). Sizes the gRPC messages the
    /// control plane accepts, which carry whole bodies in PD mode and
    /// through the ext_proc front door.
    #[arg(long, default_value_t = sglang_envoy_lifecycle::names::DEFAULT_MAX_BODY_BYTES)]
    pub max_payload_size: usize,

    /// ext_proc front door: most bytes of request bodies Envoy may hold for
    /// routed requests at once (from a body's arrival until its worker
    /// answers); past it, requests get a JSON 503. The wasm filter has the
    /// same budget per Envoy thread (`max_buffered_bytes`).
    #[arg(long, default_value_t = 268_435_456)]
    pub ext_proc_max_buffered_bytes: usize,

    /// Threads that serve the gRPC port (filter sessions, ext_proc, EDS)
    /// apart from the rest of the control plane; 0 serves it on the main
    /// runtime. Default: 1, or 0 when decisions tokenize prompts (exact
    /// cache matching), which one thread would serialise.
    #[arg(long)]
    pub grpc_threads: Option<usize>,

    /// ext_proc front door (and endpoint picker): the destination it writes
    /// is the chosen endpoint alone (`one`, which every gateway takes), or
    /// that endpoint then distinct fallbacks (`list`, only where the
    /// gateway's cluster reads it with `override_host`: Envoy retries down
    /// the list). An Envoy config may say `list` for its own streams
    /// (gRPC initial metadata `x-sglang-destination-endpoints`), as
    /// envoy/envoy-ext-proc.yaml does. The wasm filter always writes a list.
    #[arg(long, value_enum, default_value_t = DestinationFlag::One)]
    pub destination_endpoints: DestinationFlag,

    /// Accept workers at link-local addresses (169.254.0.0/16, fe80::/10),
    /// where cloud metadata services live; refused by default.
    #[arg(long)]
    pub allow_link_local_workers: bool,

    /// Client certificate (PEM) presented to `https://` workers that require
    /// one (mTLS); needs --client-key-path. Envoy presents the same one
    /// (`WORKER_CLIENT_CERT` of envoy/render.sh).
    #[arg(long, value_name = "PATH")]
    pub client_cert_path: Option<PathBuf>,

    /// Private key (PEM) of --client-cert-path.
    #[arg(long, value_name = "PATH")]
    pub client_key_path: Option<PathBuf>,

    /// CA certificates (PEM) that `https://` workers' certificates are
    /// verified with, on top of the system's roots; several allowed. Envoy
    /// trusts the same ones (`WORKER_CA_CERTS` of envoy/render.sh).
    #[arg(long, value_name = "PATH", num_args = 1.., action = ArgAction::Append)]
    pub ca_cert_paths: Vec<PathBuf>,

    /// Keep the worker registry (workers added at run time too) in this JSON
    /// file and restore it at startup.
    #[arg(long)]
    pub state_file: Option<PathBuf>,

    /// Log level: trace, debug, info, warn, error.
    #[arg(long, default_value = "info")]
    pub log_level: String,

    /// No health checks: every worker is healthy from its registration on
    /// (sglang-router's `--disable-health-check`); circuit breakers still
    /// take a failing worker out.
    #[arg(long)]
    pub disable_health_check: bool,

    /// Also serve `/metrics` on this port (as sglang-router does, where it
    /// is the only place); they are always on `--admin-port` too.
    #[arg(long)]
    pub prometheus_port: Option<u16>,

    /// Listen address of `--prometheus-port` (default: `--host`).
    #[arg(long)]
    pub prometheus_host: Option<IpAddr>,

    /// Upper bounds, in seconds and ascending, of the request duration
    /// histogram `sgl_router_request_duration_seconds` (default: 1 ms
    /// doubling twenty times).
    #[arg(long, num_args = 1.., value_name = "SECONDS")]
    pub prometheus_duration_buckets: Vec<f64>,

    /// Find workers among Kubernetes pods (sglang-router's service
    /// discovery): running, ready pods whose labels match `--selector` (PD:
    /// `--prefill-selector` / `--decode-selector`) at
    /// `http://pod-ip:--service-discovery-port`.
    #[arg(long)]
    pub service_discovery: bool,

    /// `key=value` labels a worker pod has (all of them).
    #[arg(long, num_args = 1..)]
    pub selector: Vec<String>,

    /// PD mode: `key=value` labels a prefill pod has.
    #[arg(long, num_args = 1..)]
    pub prefill_selector: Vec<String>,

    /// PD mode: `key=value` labels a decode pod has.
    #[arg(long, num_args = 1..)]
    pub decode_selector: Vec<String>,

    /// The port discovered pods serve on.
    #[arg(long, default_value_t = 80)]
    pub service_discovery_port: u16,

    /// The namespace whose pods are watched (all when not given).
    #[arg(long)]
    pub service_discovery_namespace: Option<String>,

    /// Serve the InferencePool of this name (an endpoint picker's flag):
    /// its selector's running, ready pods are the workers, one per pod and
    /// target port.
    #[arg(long)]
    pub pool_name: Option<String>,

    /// The InferencePool's namespace.
    #[arg(long, default_value = "default")]
    pub pool_namespace: String,

    /// The InferencePool's API group (`inference.networking.x-k8s.io` for
    /// v1alpha2 pools).
    #[arg(long, default_value = crate::k8s::pool::POOL_GROUP)]
    pub pool_group: String,

    /// What became of sglang-router flags accepted in another form
    /// (filled by [`Args::try_parse_args`], see `launch_screen.rs`).
    #[arg(skip)]
    pub peer_notes: Vec<String>,
}

impl Args {
    /// Parses the command line (exits with usage on errors, like clap).
    pub fn parse_args() -> Args {
        Self::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Parses `argv`, keeping each `--prefill URL [PORT]` as one group.
    /// sglang-router's flags that this router does not take are screened
    /// first (`launch_screen.rs`, against `peer_flags.rs` and
    /// `smg_flags.rs`): accepted with a note, or refused by name.
    pub fn try_parse_args<I, T>(argv: I) -> Result<Args, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let argv = argv.into_iter().map(Into::into).collect();
        let (argv, notes) = launch_screen::screen(argv)
            .map_err(|e| Args::command().error(clap::error::ErrorKind::UnknownArgument, e))?;
        let matches = Args::command().try_get_matches_from(argv)?;
        let mut args = Args::from_arg_matches(&matches)?;
        // An empty SGLANG_ENVOY_ADMIN_TOKEN is no token (docker compose
        // passes the variable through whether .env sets it or not); an
        // empty `--admin-token` on the command line stays an error.
        if matches.value_source("admin_token") == Some(clap::parser::ValueSource::EnvVariable)
            && args
                .admin_token
                .as_deref()
                .is_some_and(|t| t.trim().is_empty())
        {
            args.admin_token = None;
        }
        args.peer_notes = notes;
        let given = |flag: &str| {
            let id = flag.trim_start_matches("--").replace('-', "_");
            matches.value_source(&id) == Some(clap::parser::ValueSource::CommandLine)
        };
        for (flag, how) in peer_flags::OWN_BUT_DIFFERENT {
            if given(flag) {
                args.peer_notes.push(format!("{flag}: {how}"));
            }
        }
        for flag in LEAST_LOAD_ENGINE_FLAGS {
            if given(flag) {
                args.peer_notes
                    .push(format!("{flag} (smg's): {LEAST_LOAD_ENGINE_NOTE}"));
            }
        }
        args.prefill_groups = matches
            .get_occurrences::<String>("prefill")
            .map(|groups| groups.map(|g| g.cloned().collect()).collect())
            .unwrap_or_default();
        Ok(args)
    }
}

/// smg's `least_load` flags that weigh engine-reported loads: parsed and
/// checked as smg does, so launch lines carry over, and noted at start.
pub const LEAST_LOAD_ENGINE_FLAGS: [&str; 4] = [
    "--least-load-kv-pressure-weight",
    "--least-load-default-throughput",
    "--least-load-mean-prefill-tokens",
    "--least-load-max-waiting-requests",
];

/// The note for [`LEAST_LOAD_ENGINE_FLAGS`].
pub const LEAST_LOAD_ENGINE_NOTE: &str = "accepted and changes nothing: it weighs the engines' token and KV reports; least_load here picks the worker with the fewest requests running and waiting (the engine's report plus the requests sent since)";

mod auth_flags;
mod flag_values;
mod fleet_store_flags;
mod kv_events_flags;
mod options;
mod smg_policy_flags;
mod tenant_files;
mod tenant_flags;
mod validate;

pub mod flag_answer;
pub mod launch_screen;
pub mod peer_flags;
#[cfg(test)]
mod peer_flags_tests;
pub mod smg_flags;
#[cfg(test)]
mod smg_flags_tests;
#[cfg(test)]
mod tests;
