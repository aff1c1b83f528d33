//! `bench-instant-worker`: the worker of scenario 1, which answers at once.
//!
//! The simulated SGLang worker (`tests/sim-worker`) tokenizes every prompt
//! and keeps a prefix cache, which costs it about a millisecond of CPU for a
//! 16 KB body; on a 2-core machine that work competes with the routers being
//! measured. This worker only reads the body and answers a fixed OpenAI
//! chat completion, so what is left is the routers' own cost. It serves what
//! the routers ask of a worker: `/health`, `/v1/models`, server and model
//! info, and the generation routes.

use anyhow::Context;
use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use serde_json::json;

/// A worker that answers every generation request at once.
#[derive(Debug, Parser)]
struct Cli {
    /// Port to listen on (on 127.0.0.1).
    #[arg(long)]
    port: u16,
}

const ANSWER: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":" tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":8,"total_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}}"#;

async fn generate(body: Bytes) -> impl IntoResponse {
    // The body is read in full (as a worker must) and otherwise ignored.
    drop(body);
    ([(header::CONTENT_TYPE, "application/json")], ANSWER)
}

async fn models() -> impl IntoResponse {
    Json(
        json!({"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "bench"}]}),
    )
}

async fn info() -> impl IntoResponse {
    Json(json!({"model_path": "bench", "is_generation": true, "dp_size": 1}))
}

async fn loads() -> impl IntoResponse {
    Json(json!([{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
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
    axum::serve(listener, app).await.context("server failed")
}
