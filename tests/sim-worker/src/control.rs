//! The test switches under `/_sim/`: failure injection, stalls, health, and
//! timing, changeable while the worker runs; plus the request log and stats.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::request::parse_object;
use crate::state::AppState;

/// The switches' current values (the `/_sim/config` document).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Switches {
    /// When set, inference endpoints answer this status with an error body.
    pub fail_status: Option<u16>,
    /// When true, inference requests hang until it is turned off.
    pub stall: bool,
    /// Health endpoints answer 200 when true, 503 when false.
    pub healthy: bool,
    /// Simulated prefill time per uncached prompt token.
    pub prefill_us_per_token: u64,
    /// Simulated time per generated token.
    pub decode_us_per_token: u64,
}

/// Holder of the [`Switches`]; a watch channel so stalled requests wake up
/// as soon as the stall is lifted.
#[derive(Debug)]
pub struct Control {
    switches: watch::Sender<Switches>,
}

impl Control {
    /// Switches with no failure, no stall, healthy, and the given timing.
    pub fn new(prefill_us_per_token: u64, decode_us_per_token: u64) -> Control {
        let (switches, _) = watch::channel(Switches {
            fail_status: None,
            stall: false,
            healthy: true,
            prefill_us_per_token,
            decode_us_per_token,
        });
        Control { switches }
    }

    /// A copy of the current switches.
    pub fn get(&self) -> Switches {
        self.switches.borrow().clone()
    }

    /// Waits while requests are stalled. Returns at once when not stalled.
    pub async fn wait_unstalled(&self) {
        let mut rx = self.switches.subscribe();
        // The sender lives as long as `self`, so this cannot fail while we
        // are borrowed; on error just stop waiting.
        let _ = rx.wait_for(|s| !s.stall).await;
    }

    /// Applies the fields present in `changes`, all or none.
    pub fn apply(&self, changes: &Map<String, Value>) -> Result<Switches, ApiError> {
        let mut next = self.get();
        for (key, value) in changes {
            match key.as_str() {
                "fail_status" => {
                    next.fail_status =
                        match value {
                            Value::Null => None,
                            v => match v.as_u64() {
                                Some(code @ 400..=599) => Some(code as u16),
                                _ => return Err(ApiError::bad(
                                    "fail_status must be null or an HTTP error status (400-599)",
                                )),
                            },
                        }
                }
                "stall" => next.stall = as_bool(key, value)?,
                "healthy" => next.healthy = as_bool(key, value)?,
                "prefill_us_per_token" => next.prefill_us_per_token = as_u64(key, value)?,
                "decode_us_per_token" => next.decode_us_per_token = as_u64(key, value)?,
                other => {
                    // Refused rather than ignored: a typo would otherwise make
                    // a test silently exercise nothing.
                    return Err(ApiError::bad(format!(
                        "unknown /_sim/config field {other:?}"
                    )));
                }
            }
        }
        self.switches.send_replace(next.clone());
        Ok(next)
    }
}

fn as_bool(key: &str, value: &Value) -> Result<bool, ApiError> {
    value
        .as_bool()
        .ok_or_else(|| ApiError::bad(format!("{key} must be a boolean")))
}

fn as_u64(key: &str, value: &Value) -> Result<u64, ApiError> {
    value
        .as_u64()
        .ok_or_else(|| ApiError::bad(format!("{key} must be a non-negative integer")))
}

/// `GET /_sim/config`
pub async fn get_config(State(state): State<AppState>) -> Json<Switches> {
    Json(state.control.get())
}

/// `POST /_sim/config`: changes the fields given; answers the full config.
pub async fn set_config(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<Switches>, ApiError> {
    let changes = parse_object(&body)?;
    let now = state.control.apply(&changes)?;
    tracing::info!(config = ?now, "simulator switches changed");
    Ok(Json(now))
}

/// `GET /_sim/requests`
pub async fn requests(State(state): State<AppState>) -> impl IntoResponse {
    Json(state.recorder.all())
}

/// `DELETE /_sim/requests`
pub async fn clear_requests(State(state): State<AppState>) -> Json<Value> {
    let cleared = state.recorder.clear();
    Json(serde_json::json!({ "cleared": cleared }))
}

/// `GET /_sim/stats`
pub async fn stats(State(state): State<AppState>) -> Json<Value> {
    Json(state.stats.to_json(state.rooms.open()))
}
