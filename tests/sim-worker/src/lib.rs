//! A simulated SGLang worker: the HTTP surface of an SGLang server as a
//! router sees it (native and OpenAI-compatible endpoints, streaming, load
//! and info), backed by a toy tokenizer, a per-DP-rank prefix cache and a
//! timing model of prefill queues and decode, plus `/_sim/` switches for
//! tests. Used as the worker of the end-to-end tests, the benchmarks and the
//! quick-start demo.

mod bootstrap;
mod cache;
mod control;
mod disagg;
mod engine;
mod error;
mod health;
mod kv_config;
mod kv_events;
mod loads;
mod native;
mod openai;
mod publisher;
mod record;
mod request;
mod sse;
mod state;
mod stats;
mod tls;
mod tokens;
mod wire;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router;
use std::future::IntoFuture;

use tokio::net::TcpListener;

pub use disagg::{DisaggregationMode, UnknownMode};
pub use kv_config::{KvConfigError, KvEventsConfig, TcpEndpoint};
pub use kv_events::text_token_ids;
pub use state::{AppState, SimConfig, DEFAULT_CONTEXT_LENGTH, DEFAULT_PAGE_SIZE};
pub use tls::{server_config, TlsError, TlsFiles, TlsListener};
pub use wire::{InfoRoutes, UnknownValue, WireProfile};

/// The worker's routes over `state`.
pub fn router(state: AppState) -> Router {
    let info = state.config.info_routes;
    let mut routes = Router::new();
    if info.legacy() {
        routes = routes
            .route("/get_server_info", get(native::server_info))
            .route("/get_model_info", get(native::model_info));
    }
    if info.current() {
        routes = routes
            .route("/v1/loads", get(loads::v1_loads))
            .route("/server_info", get(native::server_info))
            .route("/model_info", get(native::model_info));
    }
    routes
        .route("/health", get(health::health))
        .route("/health_generate", get(health::health))
        .route("/get_load", get(loads::get_load))
        .route("/generate", post(native::generate))
        .route("/v1/rerank", post(native::rerank))
        .route("/v1/models", get(openai::models))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/embeddings", post(openai::embeddings))
        .route(
            "/_sim/requests",
            get(control::requests).delete(control::clear_requests),
        )
        .route("/_sim/stats", get(control::stats))
        .route(
            "/_sim/kv_events",
            get(control::kv_events_status).post(control::kv_events_hooks),
        )
        .route(
            "/flush_cache",
            get(native::flush_cache).post(native::flush_cache),
        )
        .route(
            "/_sim/config",
            get(control::get_config).post(control::set_config),
        )
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            record::record,
        ))
        // Outside the recorder: refused requests are not recorded, as
        // they never reach SGLang's handlers.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            error::api_key,
        ))
        // Routers may forward big prompts; the recorder reads bodies whole.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// Binds the bootstrap server's listener of a prefill worker: on
/// `config.host`, port `config.disaggregation_bootstrap_port` (0 picks a free
/// one). `None` for other modes, which have no bootstrap server.
pub async fn bind_bootstrap(config: &SimConfig) -> std::io::Result<Option<TcpListener>> {
    if config.disaggregation_mode != DisaggregationMode::Prefill {
        return Ok(None);
    }
    let addr = (config.host.as_str(), config.disaggregation_bootstrap_port);
    TcpListener::bind(addr).await.map(Some)
}

/// Serves a worker configured by `config` on `listener` until the process
/// ends; a prefill worker also binds its bootstrap server (see
/// [`bind_bootstrap`]). The reported ports are the real ones (so port 0
/// works): tests learn the bootstrap port from `/get_server_info`'s
/// `disaggregation_bootstrap_port`.
pub async fn serve(config: SimConfig, listener: TcpListener) -> std::io::Result<()> {
    let bootstrap = bind_bootstrap(&config).await?;
    serve_with_bootstrap(config, listener, bootstrap).await
}

/// [`serve`] with the bootstrap listener already bound (by
/// [`bind_bootstrap`]).
pub async fn serve_with_bootstrap(
    config: SimConfig,
    listener: TcpListener,
    bootstrap: Option<TcpListener>,
) -> std::io::Result<()> {
    serve_tls_with_bootstrap(config, listener, bootstrap, None).await
}

/// [`serve_with_bootstrap`], speaking HTTPS on `listener` when `tls` is
/// given (see [`server_config`]); the bootstrap server stays plain HTTP.
pub async fn serve_tls_with_bootstrap(
    mut config: SimConfig,
    listener: TcpListener,
    bootstrap: Option<TcpListener>,
    tls: Option<std::sync::Arc<tokio_rustls::rustls::ServerConfig>>,
) -> std::io::Result<()> {
    config.port = listener.local_addr()?.port();
    if let Some(b) = &bootstrap {
        config.disaggregation_bootstrap_port = b.local_addr()?.port();
    }
    tracing::info!(
        ?config,
        tls = tls.is_some(),
        "simulated SGLang worker starting"
    );
    let kv = match &config.kv_events_config {
        None => None,
        Some(kv_config) => Some(std::sync::Arc::new(
            kv_events::KvEvents::start(kv_config, config.page_size, config.dp_size)
                .await
                .map_err(std::io::Error::other)?,
        )),
    };
    let tokenizer = match &config.tokenizer_path {
        None => None,
        Some(dir) => Some(std::sync::Arc::new(
            sglang_envoy_prompt::PromptTokenizer::from_dir(dir).map_err(std::io::Error::other)?,
        )),
    };
    let state = AppState::with_parts(config, kv, tokenizer);
    match tls {
        None => run(listener.tap_io(no_delay), state, bootstrap).await,
        Some(tls) => {
            let listener = TlsListener::new(listener, tls, state.stats.clone())?;
            run(listener, state, bootstrap).await
        }
    }
}

/// Sends each write at once, as SGLang's server does (Python's asyncio sets
/// `TCP_NODELAY` on every TCP connection). Without it the chunk written
/// after a stream's head waited for the receiver's ACK of the head: 40 ms
/// where the receiver delays its ACKs (tests/sockets.rs).
pub(crate) fn no_delay(stream: &mut tokio::net::TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(error = %e, "cannot set TCP_NODELAY");
    }
}

/// Serves the worker's routes on `listener` and, for a prefill worker, the
/// bootstrap server on `bootstrap`, until either fails.
async fn run<L>(listener: L, state: AppState, bootstrap: Option<TcpListener>) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let main = axum::serve(listener, router(state.clone()));
    match bootstrap {
        None => main.await,
        Some(b) => {
            let bootstrap = axum::serve(b.tap_io(no_delay), bootstrap::router(state));
            // Either server failing ends the worker.
            tokio::select! {
                r = main.into_future() => r,
                r = bootstrap.into_future() => r,
            }
        }
    }
}
