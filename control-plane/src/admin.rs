//! The admin HTTP API: sglang-router's `/add_worker`, `/remove_worker`,
//! `/list_workers`, `/get_loads`, `/health`, `/liveness`, `/readiness`,
//! `/metrics`, and the JSON `/workers` API (`workers.rs`). Served on
//! `--admin-port` and, through Envoy, on the client port.

mod workers;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use sglang_envoy_body::openai_error_json;
use sglang_envoy_lifecycle::Mode;
use tracing::info;

use crate::auth::{AdminAuth, Denial, Outcome};
use crate::config::parse_bootstrap_port;
use crate::engine::{Engine, WorkerChangeError};
use crate::enrollment::Enrollment;
use crate::fleet_store::FleetStore;
use crate::kv_events::KvEvents;
use crate::sessions::{Sessions, SETTLE_WAIT};
use crate::workers::persist::StoredWorker;
use crate::workers::{
    HealthChecker, RegistryError, Role, Worker, WorkerAddress, WorkerId, WorkerSpec,
};

/// The header Envoy adds (overwriting any a client sent) to requests that
/// reach the admin API through its client port, as `envoy/envoy.yaml`'s
/// admin routes do. Requests carrying it come from clients, not operators.
pub const CLIENT_PORT_HEADER: &str = "x-sglang-envoy-client-port";

/// What the admin handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// The decision engine (registry, policy, metrics).
    pub engine: Arc<Engine>,
    /// Checks workers as they are added.
    pub health: Arc<HealthChecker>,
    /// Registers workers (now, or in the background until they answer).
    pub enrollment: Arc<Enrollment>,
    /// Who may change the worker set (`--admin-token`, API keys, JWTs).
    pub auth: Arc<AdminAuth>,
    /// The KV-event subscriber, unless `--disable-kv-events`.
    pub kv_events: Option<Arc<KvEvents>>,
    /// The worker list shared with other control planes
    /// (`--fleet-store-url`).
    pub fleet_store: Option<Arc<FleetStore>>,
    /// The filter sessions, settled before loads are shown.
    pub sessions: Arc<Sessions>,
}

impl AdminState {
    /// Tells the other control planes that `url` was added here as `id`.
    fn share_added(&self, url: String, spec: WorkerSpec, id: WorkerId) {
        if let Some(store) = &self.fleet_store {
            store.added(StoredWorker::new(url, spec, Some(id)));
        }
    }
}

/// The admin API's routes.
pub fn router(state: AdminState) -> Router {
    // Changes to the fleet (and so which URLs the control plane will call)
    // need the token; reading does not.
    let mutating = Router::new()
        .route("/add_worker", post(add_worker_query))
        .route("/remove_worker", post(remove_worker_query))
        .route("/workers", post(workers::add))
        .route("/workers/{*target}", delete(workers::remove))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/list_workers", get(list_workers))
        .route("/get_loads", get(get_loads))
        .route("/health", get(health))
        .route("/liveness", get(health))
        .route("/readiness", get(readiness))
        .route("/metrics", get(metrics))
        .route("/workers", get(workers::list))
        .route("/workers/{*target}", get(workers::get))
        .merge(mutating)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// Where a request to the admin API came from, as far as it matters when no
/// credential is configured.
enum Origin {
    /// Through Envoy's client port (its routes mark the request).
    ClientPort,
    /// Straight to the admin port from a loopback address.
    ThisHost,
    /// Straight to the admin port from elsewhere, or from an unknown peer.
    AnotherHost,
}

fn origin(headers: &HeaderMap, request: &Request) -> Origin {
    if headers.contains_key(CLIENT_PORT_HEADER) {
        return Origin::ClientPort;
    }
    // The peer, when the server recorded it (main.rs serves with connect
    // info); unknown counts as another host.
    let local = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|ConnectInfo(peer)| peer.ip().to_canonical().is_loopback());
    if local {
        Origin::ThisHost
    } else {
        Origin::AnotherHost
    }
}

/// Changes need an admin's credentials (`auth/`): 401 without a bearer
/// token or with a JWT that does not validate, 403 with a token that is no
/// credential or whose holder is not an admin. With no credential
/// configured, changes are served only to this host (a loopback peer) on
/// the admin port itself: through Envoy's client port, or from any host
/// that reaches an admin port opened with `--host 0.0.0.0`, anyone could
/// otherwise redirect all traffic.
async fn require_token(
    State(s): State<AdminState>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    let audit = s.auth.audit();
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    if !s.auth.is_configured() {
        let refusal = match origin(&headers, &request) {
            Origin::ClientPort => Some((
                "(client port)",
                "changing the workers through the router's client port needs an admin \
                 token (--admin-token); without one, use the control plane's admin port",
            )),
            Origin::AnotherHost => Some((
                "(another host)",
                "changing the workers from another host needs an admin credential \
                 (--admin-token, --control-plane-api-keys or --jwt-issuer); without one, \
                 the admin port takes changes from its own host only",
            )),
            Origin::ThisHost => None,
        };
        let reason = "no admin credential is configured";
        if let Some((who, message)) = refusal {
            audit.record(Outcome::Denied, who, &method, &path, reason);
            return error(StatusCode::FORBIDDEN, "permission_error", message);
        }
        audit.record(
            Outcome::Allowed,
            "(admin port, this host)",
            &method,
            &path,
            reason,
        );
        return next.run(request).await;
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let denial = match s.auth.authenticate(given).await {
        Ok(who) => {
            audit.record(Outcome::Allowed, &who.id, &method, &path, who.method);
            return next.run(request).await;
        }
        Err(d) => d,
    };
    let (status, kind, message) = match &denial {
        Denial::Missing => (
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "this admin endpoint needs `Authorization: Bearer <admin token, API key or JWT>`"
                .to_string(),
        ),
        Denial::BadJwt(why) => (
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            format!("the JWT is not valid: {why}"),
        ),
        Denial::Unknown => (
            StatusCode::FORBIDDEN,
            "permission_error",
            "the admin token is not valid".to_string(),
        ),
        Denial::NotAdmin(who) => (
            StatusCode::FORBIDDEN,
            "permission_error",
            format!(
                "{} has the user role; changing the workers needs admin",
                who.method
            ),
        ),
    };
    let who = match &denial {
        Denial::NotAdmin(p) => p.id.as_str(),
        _ => "(unauthenticated)",
    };
    audit.record(Outcome::Denied, who, &method, &path, &message);
    let mut r = error(status, kind, &message);
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    r
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
            WorkerChangeError::Registry(RegistryError::Duplicate(_))
            | WorkerChangeError::Registry(RegistryError::SameServer(..))
            | WorkerChangeError::Registry(RegistryError::DuplicateId(_)) => StatusCode::BAD_REQUEST,
            WorkerChangeError::Address(_) => StatusCode::BAD_REQUEST,
            WorkerChangeError::WrongMode(_) => StatusCode::BAD_REQUEST,
            WorkerChangeError::DpSize(..) => StatusCode::SERVICE_UNAVAILABLE,
        };
        error(status, "invalid_request_error", &self.to_string())
    }
}

/// `?url=...[&worker_type=prefill|decode|regular][&bootstrap_port=N|none]`,
/// as sglang-router's `/add_worker` takes them.
#[derive(Deserialize)]
struct UrlParam {
    url: Option<String>,
    worker_type: Option<String>,
    bootstrap_port: Option<String>,
}

/// The spec an admin request asks for. Without `worker_type`, a PD router
/// cannot guess; a regular one takes a regular worker.
fn spec_of(
    state: &AdminState,
    worker_type: Option<&str>,
    bootstrap_port: Option<Option<u16>>,
) -> Result<WorkerSpec, String> {
    let role = match worker_type {
        None if state.engine.options().mode == Mode::Pd => {
            return Err("this router runs PD mode: say worker_type prefill or decode".into())
        }
        None => Role::Regular,
        Some(name) => Role::parse(name).ok_or_else(|| {
            format!("unknown worker_type `{name}`: use regular, prefill or decode")
        })?,
    };
    if role != Role::Prefill && bootstrap_port.flatten().is_some() {
        return Err("bootstrap_port is for prefill workers".into());
    }
    Ok(WorkerSpec::of(role, bootstrap_port.flatten()))
}

async fn add(
    state: &AdminState,
    url: &str,
    spec: WorkerSpec,
) -> Result<Vec<Arc<Worker>>, WorkerChangeError> {
    let units = state
        .engine
        .add_worker(url, spec, WorkerId::random())
        .await?;
    if let Some(first) = units.first() {
        state.share_added(first.base_url.clone(), spec, first.id);
        let healthy = state.health.admit(first).await;
        info!(worker = %first.base_url, role = spec.role().as_str(), units = units.len(), healthy, "worker added");
    }
    Ok(units)
}

/// Unregisters the server at `url`, or stops its background registration
/// (then no unit is returned).
fn remove(state: &AdminState, url: &str) -> Result<Vec<Arc<Worker>>, WorkerChangeError> {
    let units = state.enrollment.withdraw(url)?;
    if let Some(store) = &state.fleet_store {
        let normalised = units
            .first()
            .map(|w| w.base_url.clone())
            .or_else(|| WorkerAddress::normalise(url).ok().map(|n| n.0));
        if let Some(url) = normalised {
            store.removed(&url);
        }
    }
    Ok(units)
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
    let port = match q.bootstrap_port.as_deref().map(parse_bootstrap_port) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", &e),
    };
    let spec = match spec_of(&s, q.worker_type.as_deref(), port) {
        Ok(spec) => spec,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", &e),
    };
    match add(&s, &url, spec).await {
        Ok(units) => (
            StatusCode::OK,
            format!(
                "Successfully added worker: {}",
                units.first().map_or(url.as_str(), |w| w.base_url.as_str())
            ),
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
        Ok(units) => (
            StatusCode::OK,
            format!(
                "Successfully removed worker: {}",
                units.first().map_or(url.as_str(), |w| w.base_url.as_str())
            ),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn list_workers(State(s): State<AdminState>) -> Response {
    let all = s.engine.registry().all();
    let urls_of = |role: Role| -> Vec<String> {
        all.iter()
            .filter(|w| w.role() == role)
            .map(|w| w.url.clone())
            .collect()
    };
    if s.engine.options().mode == Mode::Pd {
        Json(json!({
            "prefill": urls_of(Role::Prefill),
            "decode": urls_of(Role::Decode),
        }))
        .into_response()
    } else {
        Json(json!({ "urls": urls_of(Role::Regular) })).into_response()
    }
}

async fn get_loads(State(s): State<AdminState>) -> Response {
    // The ends the filters sent before this request are counted first.
    s.sessions.settle(SETTLE_WAIT).await;
    let workers: Vec<_> = s
        .engine
        .registry()
        .all()
        .iter()
        // `load` is this router's own count (it returns to zero when every
        // request it sent has ended); `engine_load` the worker's last
        // report (null without one); `routing_load` what policies compare;
        // `queued_prefill_bytes` the prompt bytes of requests in flight not
        // yet prefilled there, as `cost_aware` estimates them;
        // `prefill_bytes_per_s` the pace the worker's prefill reports
        // showed (null before the first).
        .map(|w| {
            json!({
                "worker": w.url,
                "load": w.load(),
                "engine_load": w.engine.reported(),
                "routing_load": w.routing_load(),
                "queued_prefill_bytes": w.pending_work(),
                "prefill_bytes_per_s": w.prefill_pace().map(f64::round),
            })
        })
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
        "mode": s.engine.options().mode.as_str(),
        "dp_aware": s.engine.options().dp_aware,
        "policy": s.engine.policies().regular.name(),
        "prefill_policy": s.engine.policies().prefill.name(),
        "decode_policy": s.engine.policies().decode.name(),
    }))
    .into_response()
}

/// Ready when some worker can serve a request (in PD mode: a prefill and a
/// decode worker).
async fn readiness(State(s): State<AdminState>) -> Response {
    let registry = s.engine.registry();
    let roles = Role::taken_by(s.engine.options().mode);
    if let Some(missing) = roles.iter().find(|r| registry.available(**r).is_empty()) {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            &format!("not ready: no healthy {} worker", missing.as_str()),
        );
    }
    let healthy = registry.all().iter().filter(|w| w.is_healthy()).count();
    Json(json!({ "status": "ready", "healthy_workers": healthy })).into_response()
}

/// `/metrics` alone, for `--prometheus-port`.
pub fn metrics_router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

async fn metrics(State(s): State<AdminState>) -> Response {
    if let Some(kv) = &s.kv_events {
        s.engine.metrics().record_kv_events(&kv.views());
    }
    let body = s
        .engine
        .metrics()
        .render(&s.engine.registry().all(), s.engine.admission_counts());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint")
}

async fn method_not_allowed() -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "this admin endpoint does not take that method",
    )
}
