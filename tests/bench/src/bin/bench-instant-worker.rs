//! `bench-instant-worker`: the worker of scenario 1, which answers at once.
//!
//! The simulated SGLang worker (`tests/sim-worker`) tokenizes every prompt
//! and keeps a prefix cache, which costs it about a millisecond of CPU for a
//! 16 KB body; on a 2-core machine that work competes with the routers being
//! measured. This worker only reads the body and answers a fixed OpenAI
//! chat completion, so what is left is the routers' own cost. It serves what
//! the routers ask of a worker: `/health`, `/v1/models`, server and model
//! info, and the generation routes.
//!
//! A request whose body has `"stream": true` gets an SSE answer instead:
//! `--sse-chunks` chat-completion chunk events then `data: [DONE]`
//! (scenario 1's streaming case), built once at start. Each event is written
//! on its own, as fast as the connection takes them: the stream yields to
//! the runtime between events, so the HTTP server flushes each one instead
//! of gathering them into one write (a real worker writes a token at a
//! time, and the routers in between see one event per read when they keep
//! up).

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use clap::Parser;
use futures::StreamExt;
use serde_json::json;
use sglang_envoy_bench::params::MODEL;
use sglang_envoy_bench::sse;

/// A worker that answers every generation request at once.
#[derive(Debug, Parser)]
struct Cli {
    /// Port to listen on (on 127.0.0.1).
    #[arg(long)]
    port: u16,
    /// Chunk events of the SSE answer to a `"stream": true` request.
    #[arg(long, default_value_t = 1000)]
    sse_chunks: usize,
}

/// The SSE answer's events, built once.
static EVENTS: OnceLock<Arc<[Bytes]>> = OnceLock::new();

const ANSWER: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"sim-model","choices":[{"index":0,"message":{"role":"assistant","content":" tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":8,"total_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}}"#;

async fn generate(body: Bytes) -> Response {
    // The body is read in full (as a worker must); only its stream flag
    // matters.
    if !sse::wants_stream(&body) {
        return ([(header::CONTENT_TYPE, "application/json")], ANSWER).into_response();
    }
    let events = Arc::clone(EVENTS.get().expect("events are built at start"));
    let stream = futures::stream::iter(0..events.len()).then(move |i| {
        let event = events[i].clone();
        async move {
            // Pending once: the server flushes what it holds, one event
            // per write.
            tokio::task::yield_now().await;
            Ok::<_, Infallible>(event)
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

async fn models() -> impl IntoResponse {
    Json(json!({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}))
}

async fn info() -> impl IntoResponse {
    Json(json!({"model_path": MODEL, "is_generation": true, "dp_size": 1}))
}

async fn loads() -> impl IntoResponse {
    Json(json!([{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let events: Vec<Bytes> = sse::chat_events(cli.sse_chunks)
        .into_iter()
        .map(Bytes::from)
        .collect();
    let _ = EVENTS.set(events.into());
    let app = Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/health_generate", get(|| async { StatusCode::OK }))
        .route("/v1/models", get(models))
        .route("/get_model_info", get(info))
        .route("/get_server_info", get(info))
        .route("/server_info", get(info))
        .route("/get_load", get(loads))
        .route("/v1/chat/completions", post(generate))
        .route("/v1/completions", post(generate))
        .route("/generate", post(generate))
        .layer(axum::extract::DefaultBodyLimit::disable());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", cli.port))
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{}", cli.port))?;
    // Each write leaves at once, as an SGLang server's do: with Nagle's
    // algorithm on, an event after the head waited for the router's
    // delayed ACK (40 ms).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            eprintln!("cannot set TCP_NODELAY: {e}");
        }
    });
    axum::serve(listener, app).await.context("server failed")
}
