//! The test switches under `/_sim/`: failure injection, stalls, health, and
//! timing, changeable while the worker runs; plus the request log and stats,
//! and the KV-event hooks (withhold batches, restart the sequence).

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

/// `GET /_sim/kv_events`: whether KV events are on, the page size, and each
/// rank publisher's counters (ports, next seq, replay buffer, withheld).
pub async fn kv_events_status(State(state): State<AppState>) -> Json<Value> {
    Json(match &state.kv {
        None => serde_json::json!({"enabled": false}),
        Some(kv) => serde_json::json!({
            "enabled": true,
            "page_size": kv.page_size(),
            "ranks": kv.status(),
        }),
    })
}

/// `POST /_sim/kv_events`: test hooks for subscribers.
///
/// * `{"drop_next": N}` withholds the next N batches of every rank (or of
///   `"dp_rank": r`) from the PUB socket; they keep their seq and stay in the
///   replay buffer, so a subscriber sees a gap it can replay.
/// * `{"restart": true}` acts as a worker restart: caches emptied, every
///   publisher back at seq 0 with an empty replay buffer, no event sent.
///
/// Answers the `GET` document.
pub async fn kv_events_hooks(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let Some(kv) = &state.kv else {
        return Err(ApiError::bad(
            "KV events are off: start the worker with --kv-events-config",
        ));
    };
    let changes = parse_object(&body)?;
    let mut drop_next = None;
    let mut rank = None;
    let mut restart = false;
    for (key, value) in &changes {
        match key.as_str() {
            "drop_next" => drop_next = Some(as_u64(key, value)?),
            "dp_rank" => {
                let r = as_u64(key, value)?;
                rank = Some(usize::try_from(r).map_err(|_| ApiError::bad("no such dp_rank"))?);
            }
            "restart" => restart = as_bool(key, value)?,
            other => {
                return Err(ApiError::bad(format!(
                    "unknown /_sim/kv_events field {other:?}"
                )))
            }
        }
    }
    if rank.is_some() && drop_next.is_none() {
        return Err(ApiError::bad("dp_rank only goes with drop_next"));
    }
    if restart {
        state.engine.restart_kv();
        tracing::info!("KV-event publishers restarted at seq 0, caches emptied");
    }
    if let Some(n) = drop_next {
        if !kv.drop_next(rank, n) {
            return Err(ApiError::bad(format!("no dp_rank {rank:?}")));
        }
        tracing::info!(n, ?rank, "withholding the next KV-event batches");
    }
    Ok(kv_events_status(State(state.clone())).await)
}
