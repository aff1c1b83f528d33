//! `sglang-sim-worker`: runs a simulated SGLang worker.

use anyhow::Context;
use clap::Parser;
use sglang_sim_worker::{
    bind_bootstrap, serve_tls_with_bootstrap, server_config, DisaggregationMode, InfoRoutes,
    KvConfigError, KvEventsConfig, SimConfig, TlsFiles, WireProfile, DEFAULT_PAGE_SIZE,
};
use tracing_subscriber::EnvFilter;

/// A simulated SGLang server (GPU inference worker) for tests, benchmarks
/// and demos.
#[derive(Debug, Parser)]
#[command(name = "sglang-sim-worker", version)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 30001)]
    port: u16,
    /// Model path; also the served model id.
    #[arg(long, default_value = "sim-model")]
    model_path: String,
    /// Number of data-parallel ranks, each with its own cache and queue.
    #[arg(long, default_value_t = 1)]
    dp_size: usize,
    /// Simulated prefill time per uncached prompt token, in microseconds.
    #[arg(long, default_value_t = 10)]
    prefill_us_per_token: u64,
    /// Simulated time per generated token, in microseconds.
    #[arg(long, default_value_t = 200)]
    decode_us_per_token: u64,
    /// Prefills that may run at once per DP rank; others queue.
    #[arg(long, default_value_t = 1)]
    max_running_prefills: usize,
    /// Prefix-cache capacity in tokens per DP rank (LRU eviction).
    #[arg(long, default_value_t = 1_000_000)]
    cache_tokens: usize,
    /// Tokens generated when a request does not say.
    #[arg(long, default_value_t = 16)]
    default_max_tokens: usize,
    /// The model's context length: a request asking to generate more
    /// tokens is refused with a 400, as SGLang refuses it.
    #[arg(long, default_value_t = sglang_sim_worker::DEFAULT_CONTEXT_LENGTH)]
    context_length: usize,
    /// PD disaggregation role: `null` (prefill and decode here), `prefill`
    /// (also serves a bootstrap server, answers after a decode worker fetched
    /// the KV) or `decode` (fetches the KV from the request's
    /// `bootstrap_host:bootstrap_port`).
    #[arg(long, default_value = "null")]
    disaggregation_mode: DisaggregationMode,
    /// Prefill: port of the bootstrap server (0 picks a free one). Decode:
    /// the port used when a request's `bootstrap_port` is null.
    #[arg(long, default_value_t = 8998)]
    disaggregation_bootstrap_port: u16,
    /// How long a prefill waits for a decode to fetch its KV, and a decode
    /// for the KV to be published, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    disaggregation_timeout_ms: u64,
    /// Which SGLang's DP-rank fields it reads: `upstream` (SGLang 0.5.10
    /// and later: `routed_dp_rank`, `disagg_prefill_dp_rank`) or `legacy`
    /// (`data_parallel_rank`, `data_parallel_rank_decode`).
    #[arg(long, default_value = "upstream")]
    wire_profile: WireProfile,
    /// The version the info routes report (default: 0.5.23+sim for
    /// upstream, 0.5.9+sim for legacy).
    #[arg(long)]
    sglang_version: Option<String>,
    /// Which info routes exist: `both` (`/server_info`, `/model_info` and
    /// their deprecated `get_` aliases: SGLang 0.5.6 to 0.5.23), `legacy`
    /// (the `get_` ones only: 0.5.4 and older) or `current` (no `get_`).
    #[arg(long, default_value = "both")]
    info_routes: InfoRoutes,
    /// Report prefix-cache hits in the OpenAI usage
    /// (`prompt_tokens_details.cached_tokens`), as SGLang's flag does.
    #[arg(long)]
    enable_cache_report: bool,
    /// How long a `/health` takes, in milliseconds (SGLang's generates one
    /// token and looks for it after a second).
    #[arg(long, default_value_t = 1000)]
    health_delay_ms: u64,
    /// How long a `/health` of a stalled worker waits before answering 503.
    #[arg(long, default_value_t = 20_000)]
    health_timeout_ms: u64,
    /// For how long after the start `/health` answers 503 (SGLang's server
    /// is starting: loading weights, warming up).
    #[arg(long, default_value_t = 0)]
    startup_ms: u64,
    /// Serve HTTPS with this certificate chain (PEM), like an SGLang server
    /// behind TLS; needs --tls-key. The bootstrap server stays plain HTTP.
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Require client certificates signed by this CA (PEM): mTLS.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    tls_client_ca: Option<std::path::PathBuf>,
    /// Require `Authorization: Bearer <key>` as SGLang's `--api-key` does
    /// (401 `{"error":"Unauthorized"}`; `/health*` and `/metrics` stay open).
    #[arg(long)]
    api_key: Option<String>,
    /// Publish KV cache events as SGLang does, e.g.
    /// `{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}`
    /// (SGLang's JSON: `publisher`, `endpoint`, `bind`, `replay_endpoint`,
    /// `buffer_steps`, `topic`, `format`); DP rank r uses the ports plus r.
    /// The prefix cache then works in pages of --page-size tokens.
    #[arg(long, value_name = "JSON", value_parser = parse_kv_events)]
    kv_events_config: Option<KvEventsFlag>,
    /// Tokens per cached page (the events' block_size); only used with
    /// --kv-events-config.
    #[arg(long, default_value_t = DEFAULT_PAGE_SIZE as u64, value_parser = clap::value_parser!(u64).range(1..))]
    page_size: u64,
    /// Tokenize prompts with this model's files (a directory with
    /// `tokenizer.json` and a chat template) as SGLang does, instead of the
    /// toy tokenizer (about 4 characters a token).
    #[arg(long, value_name = "DIR")]
    tokenizer_path: Option<std::path::PathBuf>,
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `debug`.
    #[arg(long, default_value = "info")]
    log_level: String,
}

/// A parsed `--kv-events-config`; None for `"publisher": "null"`. (A
/// newtype: clap reads `Option<Option<_>>` as a flag with an optional value.)
#[derive(Debug, Clone)]
struct KvEventsFlag(Option<KvEventsConfig>);

fn parse_kv_events(json: &str) -> Result<KvEventsFlag, KvConfigError> {
    KvEventsConfig::parse(json).map(KvEventsFlag)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = EnvFilter::try_new(&cli.log_level)
        .with_context(|| format!("bad --log-level {:?}", cli.log_level))?;
    // Colours only on a terminal: log files get plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();

    let listener = tokio::net::TcpListener::bind((cli.host.as_str(), cli.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", cli.host, cli.port))?;
    let port = listener.local_addr()?.port();
    let tls = match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => Some(server_config(&TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: cli.tls_client_ca.clone(),
        })?),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!(
        "sglang-sim-worker listening on {scheme}://{}:{port}",
        cli.host
    );

    let mut config = SimConfig {
        host: cli.host,
        port,
        model_path: cli.model_path,
        dp_size: cli.dp_size,
        prefill_us_per_token: cli.prefill_us_per_token,
        decode_us_per_token: cli.decode_us_per_token,
        max_running_prefills: cli.max_running_prefills,
        cache_tokens: cli.cache_tokens,
        default_max_tokens: cli.default_max_tokens,
        context_length: cli.context_length,
        disaggregation_mode: cli.disaggregation_mode,
        disaggregation_bootstrap_port: cli.disaggregation_bootstrap_port,
        disaggregation_timeout_ms: cli.disaggregation_timeout_ms,
        wire_profile: cli.wire_profile,
        version: cli.sglang_version,
        info_routes: cli.info_routes,
        enable_cache_report: cli.enable_cache_report,
        health_delay_ms: cli.health_delay_ms,
        health_timeout_ms: cli.health_timeout_ms,
        startup_ms: cli.startup_ms,
        api_key: cli.api_key,
        kv_events_config: cli.kv_events_config.and_then(|f| f.0),
        page_size: usize::try_from(cli.page_size).context("--page-size is too large")?,
        tokenizer_path: cli.tokenizer_path,
    };
    let bootstrap = bind_bootstrap(&config).await.with_context(|| {
        format!(
            "cannot listen on {}:{} (bootstrap)",
            config.host, config.disaggregation_bootstrap_port
        )
    })?;
    if let Some(b) = &bootstrap {
        config.disaggregation_bootstrap_port = b.local_addr()?.port();
        println!(
            "sglang-sim-worker bootstrap listening on http://{}:{}",
            config.host, config.disaggregation_bootstrap_port
        );
    }
    // SIGTERM ends it, as it ends an SGLang server: as a container's PID 1
    // it would otherwise be ignored (`docker compose down` waits, then kills).
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        served = serve_tls_with_bootstrap(config, listener, bootstrap, tls) => {
            served.context("server failed")
        }
        _ = terminate.recv() => Ok(()),
    }
}
