//! The admin HTTP API: sglang-router's `/add_worker`, `/remove_worker`,
//! `/list_workers`, `/get_loads`, `/health`, `/metrics`, and the JSON
//! `/workers` API. Served on `--admin-port` and, through Envoy, on the
//! client port.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sglang_envoy_body::openai_error_json;
use tracing::info;

use crate::engine::{Engine, WorkerChangeError};
use crate::workers::{HealthChecker, RegistryError, Worker};

/// What the admin handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// The decision engine (registry, policy, metrics).
    pub engine: Arc<Engine>,
    /// Checks workers as they are added.
    pub health: Arc<HealthChecker>,
}

/// The admin API's routes.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/add_worker", post(add_worker_query))
        .route("/remove_worker", post(remove_worker_query))
        .route("/list_workers", get(list_workers))
        .route("/get_loads", get(get_loads))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/workers", get(workers_json).post(add_worker_json))
        .route("/workers/{*url}", delete(remove_worker_path))
        .fallback(not_found)
        .with_state(state)
}

/// An OpenAI-shaped JSON error response.
fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        openai_error_json(status.as_u16(), kind, message),
    )
        .into_response()
}

impl IntoResponse for WorkerChangeError {
    fn into_response(self) -> Response {
        let status = match self {
            WorkerChangeError::Registry(RegistryError::NotFound(_)) => StatusCode::NOT_FOUND,
            WorkerChangeError::Registry(RegistryError::Duplicate(_)) => StatusCode::BAD_REQUEST,
            WorkerChangeError::Address(_) => StatusCode::BAD_REQUEST,
        };
        error(status, "invalid_request_error", &self.to_string())
    }
}

#[derive(Deserialize)]
struct UrlParam {
    url: Option<String>,
}

#[derive(Serialize)]
struct WorkerView {
    url: String,
    host: String,
    endpoint: String,
    worker_type: &'static str,
    healthy: bool,
    load: usize,
    processed: usize,
}

impl From<&Arc<Worker>> for WorkerView {
    fn from(w: &Arc<Worker>) -> Self {
        WorkerView {
            url: w.url.clone(),
            host: w.host.clone(),
            endpoint: w.endpoint_text.clone(),
            worker_type: "regular",
            healthy: w.is_healthy(),
            load: w.load(),
            processed: w.processed(),
        }
    }
}

async fn add(state: &AdminState, url: &str) -> Result<Arc<Worker>, WorkerChangeError> {
    let worker = state.engine.add_worker(url).await?;
    let healthy = state.health.admit(&worker).await;
    info!(worker = %worker.url, healthy, "worker added");
    Ok(worker)
}

fn remove(state: &AdminState, url: &str) -> Result<Arc<Worker>, WorkerChangeError> {
    let worker = state.engine.remove_worker(url)?;
    info!(worker = %worker.url, "worker removed");
    Ok(worker)
}

fn missing_url() -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "the `url` query parameter is required",
    )
}

async fn add_worker_query(State(s): State<AdminState>, Query(q): Query<UrlParam>) -> Response {
    let Some(url) = q.url else {
        return missing_url();
    };
    match add(&s, &url).await {
        Ok(w) => (
            StatusCode::OK,
            format!("Successfully added worker: {}", w.url),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn remove_worker_query(State(s): State<AdminState>, Query(q): Query<UrlParam>) -> Response {
    let Some(url) = q.url else {
        return missing_url();
    };
    match remove(&s, &url) {
        Ok(w) => (
            StatusCode::OK,
            format!("Successfully removed worker: {}", w.url),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn list_workers(State(s): State<AdminState>) -> Response {
    let urls: Vec<String> = s
        .engine
        .registry()
        .all()
        .iter()
        .map(|w| w.url.clone())
        .collect();
    Json(json!({ "urls": urls })).into_response()
}

async fn get_loads(State(s): State<AdminState>) -> Response {
    let workers: Vec<_> = s
        .engine
        .registry()
        .all()
        .iter()
        .map(|w| json!({ "worker": w.url, "load": w.load() }))
        .collect();
    Json(json!({ "workers": workers })).into_response()
}

async fn health(State(s): State<AdminState>) -> Response {
    let all = s.engine.registry().all();
    let healthy = all.iter().filter(|w| w.is_healthy()).count();
    Json(json!({
        "status": "ok",
        "workers": all.len(),
        "healthy_workers": healthy,
        "policy": s.engine.policy().name(),
    }))
    .into_response()
}

async fn metrics(State(s): State<AdminState>) -> Response {
    let body = s.engine.metrics().render(&s.engine.registry().all());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn workers_json(State(s): State<AdminState>) -> Response {
    let all = s.engine.registry().all();
    let workers: Vec<WorkerView> = all.iter().map(WorkerView::from).collect();
    Json(json!({
        "workers": workers,
        "total": workers.len(),
        "healthy": workers.iter().filter(|w| w.healthy).count(),
        "in_flight": s.engine.in_flight(),
    }))
    .into_response()
}

#[derive(Deserialize)]
struct AddWorkerBody {
    url: String,
    #[serde(default)]
    worker_type: Option<String>,
}

async fn add_worker_json(State(s): State<AdminState>, body: Bytes) -> Response {
    let req: AddWorkerBody = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("expected {{\"url\": \"http://host:port\"}}: {e}"),
            )
        }
    };
    if let Some(t) = req.worker_type.as_deref().filter(|t| *t != "regular") {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &format!("worker_type `{t}` needs --pd-disaggregation, which this router does not run"),
        );
    }
    match add(&s, &req.url).await {
        Ok(w) => (StatusCode::OK, Json(WorkerView::from(&w))).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn remove_worker_path(State(s): State<AdminState>, Path(url): Path<String>) -> Response {
    match remove(&s, &url) {
        Ok(w) => Json(json!({ "status": "removed", "url": w.url })).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint")
}
