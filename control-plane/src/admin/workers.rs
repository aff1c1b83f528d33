//! The JSON `/workers` API in sglang-router 0.3.2's shapes, with this
//! router's own fields added:
//!
//! - `POST /workers {"url", "worker_type"?, "bootstrap_port"?}` → 202 with
//!   `Location: /workers/{id}` and `{"status":"accepted","worker_id","url",
//!   "location","message"}`; the same URL again answers the same id.
//! - `GET /workers` → every routing unit, `total`, `stats`;
//!   `GET /workers/{id}` → one server (`is_healthy`, `load`...), or its
//!   background registration with `job_status`.
//! - `DELETE /workers/{id}` → 202. `DELETE /workers/{url}` (this router's
//!   older form) → 200.
//!
//! Unknown ids answer 404, malformed ones 400, both as OpenAI JSON errors.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::info;

use super::{error, remove as remove_by_url, spec_of, AdminState};
use crate::enrollment::{Enrolled, Job};
use crate::kv_events::WorkerKvView;
use crate::sessions::SETTLE_WAIT;
use crate::workers::{CircuitState, Role, Worker, WorkerAddress, WorkerId};

/// sglang-router's placeholder for what it has not discovered (a model
/// the worker did not tell).
const UNKNOWN: &str = "unknown";
/// sglang-router's default priority and cost; this router treats all
/// workers alike.
const PRIORITY: u32 = 50;
const COST: f32 = 1.0;

/// One worker as the API shows it: sglang-router's `WorkerInfo` fields
/// first, then this router's.
#[derive(Serialize)]
struct WorkerInfo {
    id: WorkerId,
    /// The unit's URL (`@rank` for a DP rank), or the server's.
    url: String,
    /// The model the server serves (`served_model_name`), or `unknown`.
    model_id: String,
    priority: u32,
    cost: f32,
    worker_type: &'static str,
    is_healthy: bool,
    /// Circuit breaker: `closed`, `open` or `half_open`.
    circuit: &'static str,
    /// Consecutive failures counted towards opening the circuit.
    consecutive_failures: u32,
    load: usize,
    connection_mode: &'static str,
    /// Prefill workers: their bootstrap port, `null` for `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    bootstrap_port: Option<Option<u16>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<&'static str, String>,
    disable_health_check: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_status: Option<JobStatus>,
    base_url: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    host: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    endpoint: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    dp_rank: Option<u32>,
    /// Same as `is_healthy` (this router's older name).
    healthy: bool,
    processed: usize,
    /// Distinct routing keys among the requests in flight.
    routing_keys: usize,
    /// A DP-aware server's ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    units: Option<Vec<WorkerInfo>>,
    /// The server's KV-event subscription (per DP rank: state, last seq,
    /// blocks held); absent with `--disable-kv-events`.
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_events: Option<WorkerKvView>,
}

/// sglang-router's `job_status` of a registration still running or failed.
#[derive(Serialize)]
struct JobStatus {
    job_type: &'static str,
    worker_url: String,
    status: &'static str,
    message: Option<String>,
    /// Seconds since the Unix epoch of the job's last change.
    timestamp: u64,
}

impl WorkerInfo {
    /// One routing unit.
    fn unit(w: &Worker) -> WorkerInfo {
        let healthy = w.is_healthy();
        let mut metadata = BTreeMap::new();
        if let Some(rank) = w.dp_rank {
            metadata.insert("dp_rank", rank.to_string());
        }
        WorkerInfo {
            id: w.id,
            url: w.url.clone(),
            model_id: w.model().unwrap_or(UNKNOWN).to_string(),
            priority: PRIORITY,
            cost: COST,
            worker_type: w.role().as_str(),
            is_healthy: healthy,
            circuit: w.circuit().state().as_str(),
            consecutive_failures: w.circuit().failures(),
            load: w.load(),
            connection_mode: "HTTP",
            bootstrap_port: (w.role() == Role::Prefill).then_some(w.spec.bootstrap_port()),
            metadata,
            disable_health_check: false,
            job_status: None,
            base_url: w.base_url.clone(),
            host: w.host.clone(),
            endpoint: w.endpoint_text.clone(),
            dp_rank: w.dp_rank,
            healthy,
            processed: w.processed(),
            routing_keys: w.routing_keys(),
            units: None,
            kv_events: None,
        }
    }

    /// A server: its one unit, or its DP ranks summed up, each listed.
    fn server(units: &[Arc<Worker>]) -> Option<WorkerInfo> {
        let first = units.first()?;
        if units.len() == 1 && first.dp_rank.is_none() {
            return Some(WorkerInfo::unit(first));
        }
        let mut info = WorkerInfo::unit(first);
        info.url = first.base_url.clone();
        info.dp_rank = None;
        info.metadata.clear();
        info.metadata.insert("dp_size", units.len().to_string());
        info.load = units.iter().map(|w| w.load()).sum();
        info.processed = units.iter().map(|w| w.processed()).sum();
        info.routing_keys = units.iter().map(|w| w.routing_keys()).sum();
        info.units = Some(units.iter().map(|w| WorkerInfo::unit(w)).collect());
        Some(info)
    }

    /// A server still being registered in the background.
    fn pending(job: &Job) -> WorkerInfo {
        WorkerInfo {
            id: job.id,
            url: job.url.clone(),
            model_id: UNKNOWN.to_string(),
            priority: 0,
            cost: COST,
            worker_type: job.spec.role().as_str(),
            is_healthy: false,
            circuit: CircuitState::Closed.as_str(),
            consecutive_failures: 0,
            load: 0,
            connection_mode: UNKNOWN,
            bootstrap_port: (job.spec.role() == Role::Prefill).then_some(job.spec.bootstrap_port()),
            metadata: BTreeMap::new(),
            disable_health_check: false,
            job_status: Some(JobStatus {
                job_type: "AddWorker",
                worker_url: job.url.clone(),
                status: job.state.as_str(),
                message: job.message.clone(),
                timestamp: job
                    .since
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            }),
            base_url: job.url.clone(),
            host: String::new(),
            endpoint: String::new(),
            dp_rank: None,
            healthy: false,
            processed: 0,
            routing_keys: 0,
            units: None,
            kv_events: None,
        }
    }
}

/// What `/workers/{target}` names: a worker id, or (this router's older
/// form) a worker URL.
enum Target {
    Id(WorkerId),
    Url(String),
}

/// What `raw` names; `None` when it is neither an id nor a worker URL.
fn target(raw: &str) -> Option<Target> {
    if let Ok(id) = raw.parse::<WorkerId>() {
        return Some(Target::Id(id));
    }
    if raw.contains("://") && WorkerAddress::normalise(raw).is_ok() {
        return Some(Target::Url(raw.to_string()));
    }
    None
}

fn bad_id(raw: &str) -> Response {
    let shown: String = raw.chars().take(64).filter(|c| !c.is_control()).collect();
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        &format!("invalid worker id `{shown}`: expected a UUID (or a worker URL)"),
    )
}

fn unknown(what: &str) -> Response {
    let shown: String = what.chars().take(64).filter(|c| !c.is_control()).collect();
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        &format!("worker {shown} not found"),
    )
}

/// The KV-event view of the server at `base_url`, when subscribing is on,
/// with what the policies route it on and its self-check.
fn kv_view(s: &AdminState, base_url: &str) -> Option<WorkerKvView> {
    let mut view = s.kv_events.as_ref().and_then(|kv| kv.view(base_url))?;
    if let Some(check) = s.engine.exact_check(base_url) {
        view.checked = check.checked;
        view.agreed = check.agreed;
        if view.live && check.trusted {
            view.routing = "events";
        }
    }
    Some(view)
}

/// `GET /workers`
pub(super) async fn list(State(s): State<AdminState>) -> Response {
    // Loads as `/get_loads` shows them: the filters' ends sent before now in.
    s.sessions.settle(SETTLE_WAIT).await;
    let all = s.engine.registry().all();
    let workers: Vec<WorkerInfo> = all
        .iter()
        .map(|w| {
            let mut info = WorkerInfo::unit(w);
            info.kv_events = kv_view(&s, &w.base_url);
            info
        })
        .collect();
    let count = |role: Role| all.iter().filter(|w| w.role() == role).count();
    let pending: Vec<WorkerInfo> = s
        .enrollment
        .jobs()
        .iter()
        .map(WorkerInfo::pending)
        .collect();
    Json(json!({
        "total": workers.len(),
        "stats": {
            "prefill_count": count(Role::Prefill),
            "decode_count": count(Role::Decode),
            "regular_count": count(Role::Regular),
        },
        "healthy": workers.iter().filter(|w| w.is_healthy).count(),
        "in_flight": s.engine.in_flight(),
        "workers": workers,
        "pending": pending,
    }))
    .into_response()
}

/// `GET /workers/{id}` (or `/workers/{url}`)
pub(super) async fn get(State(s): State<AdminState>, Path(raw): Path<String>) -> Response {
    s.sessions.settle(SETTLE_WAIT).await;
    let registry = s.engine.registry();
    let (units, job) = match target(&raw) {
        None => return bad_id(&raw),
        Some(Target::Id(id)) => (registry.by_id(id), s.enrollment.job(id)),
        Some(Target::Url(url)) => {
            let normalised = WorkerAddress::normalise(&url).map_or(url, |n| n.0);
            (
                registry.by_base_url(&normalised),
                s.enrollment.job_by_url(&normalised),
            )
        }
    };
    if let Some(mut info) = WorkerInfo::server(&units) {
        info.kv_events = kv_view(&s, &info.base_url);
        return Json(info).into_response();
    }
    match job {
        Some(job) => Json(WorkerInfo::pending(&job)).into_response(),
        None => unknown(&raw),
    }
}

#[derive(Deserialize)]
struct AddWorkerBody {
    url: String,
    #[serde(default)]
    worker_type: Option<String>,
    /// A port, or null / absent for `none`.
    #[serde(default)]
    bootstrap_port: Option<u16>,
}

/// `POST /workers`
pub(super) async fn add(State(s): State<AdminState>, body: Bytes) -> Response {
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
    let spec = match spec_of(&s, req.worker_type.as_deref(), Some(req.bootstrap_port)) {
        Ok(spec) => spec,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", &e),
    };
    let enrolled = match s.enrollment.enroll(&req.url, spec, None).await {
        Ok(e) => e,
        Err(e) => return e.into_response(),
    };
    let id = enrolled.id();
    let (message, units) = match &enrolled {
        Enrolled::Registered(_, units) => {
            info!(worker = %req.url, %id, "worker added through the /workers API");
            (
                "Worker registered; it gets requests once its health check passes",
                units.clone(),
            )
        }
        Enrolled::Existing(_) => ("Worker already registered", s.engine.registry().by_id(id)),
        Enrolled::Pending(_) => (
            "Worker not reachable yet: registration continues in the background",
            Vec::new(),
        ),
    };
    let normalised = units
        .first()
        .map(|w| w.base_url.clone())
        .or_else(|| s.enrollment.job(id).map(|j| j.url));
    if let Some(url) = normalised
        .as_ref()
        .filter(|_| !matches!(enrolled, Enrolled::Existing(_)))
    {
        s.share_added(url.clone(), spec, id);
    }
    let url = normalised.unwrap_or(req.url);
    let location = format!("/workers/{id}");
    let mut response = (
        StatusCode::ACCEPTED,
        Json(json!({
            "status": "accepted",
            "worker_id": id,
            "url": url,
            "location": location,
            "message": message,
            "worker_type": spec.role().as_str(),
            "units": units.iter().map(|w| WorkerInfo::unit(w)).collect::<Vec<_>>(),
        })),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// `DELETE /workers/{id}` → 202; `DELETE /workers/{url}` → 200 as before.
pub(super) async fn remove(State(s): State<AdminState>, Path(raw): Path<String>) -> Response {
    let id = match target(&raw) {
        None => return bad_id(&raw),
        Some(Target::Url(url)) => {
            return match remove_by_url(&s, &url) {
                Ok(units) => Json(json!({
                    "status": "removed",
                    "url": units.first().map_or(url.as_str(), |w| w.base_url.as_str()),
                    "units": units.len(),
                }))
                .into_response(),
                Err(e) => e.into_response(),
            };
        }
        Some(Target::Id(id)) => id,
    };
    let url = match s.engine.registry().by_id(id).first() {
        Some(w) => w.base_url.clone(),
        None => match s.enrollment.job(id) {
            Some(job) => job.url,
            None => return unknown(&id.to_string()),
        },
    };
    match remove_by_url(&s, &url) {
        Ok(units) => (
            StatusCode::ACCEPTED,
            Json(json!({
                "status": "accepted",
                "worker_id": id,
                "url": url,
                "units": units.len(),
                "message": if units.is_empty() {
                    "Worker registration cancelled"
                } else {
                    "Worker removed"
                },
            })),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}
