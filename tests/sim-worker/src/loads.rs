//! The two load routes of an SGLang server, per DP rank: `/v1/loads`
//! (SGLang 0.5.8 and later, `python/sglang/srt/entrypoints/v1_loads.py`,
//! PR #16976) and the older `/get_load`, which newer versions keep as a
//! deprecated shim. Both count every sequence the engine holds, whoever
//! sent it: a router reading them sees traffic that did not pass through it.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::RankLoad;
use crate::error::ApiError;
use crate::state::AppState;

/// `GET /get_load`: one entry per DP rank, in the old shape.
pub async fn get_load(State(state): State<AppState>) -> Json<Vec<RankLoad>> {
    Json(state.engine.loads())
}

/// The query of `/v1/loads`.
#[derive(Debug, Deserialize)]
pub struct LoadsQuery {
    /// Only this rank.
    dp_rank: Option<usize>,
    /// Sections, comma-separated: `core`, `memory`, `spec`, `lora`,
    /// `disagg`, `queues`, `all` (the default).
    include: Option<String>,
}

/// The sections SGLang accepts in `include`.
const SECTIONS: [&str; 7] = ["core", "memory", "spec", "lora", "disagg", "queues", "all"];

/// `GET /v1/loads`: `{timestamp, version, accelerator, num_accelerators,
/// loads: [...]}` with one entry per rank (the core fields always, the
/// `queues` section when asked for); an unknown section is a 400, as
/// SGLang answers it.
pub async fn v1_loads(State(state): State<AppState>, Query(q): Query<LoadsQuery>) -> Response {
    let include: Vec<&str> = q
        .include
        .as_deref()
        .map(|s| s.split(',').map(str::trim).collect())
        .unwrap_or_else(|| vec!["all"]);
    if let Some(bad) = include.iter().find(|s| !SECTIONS.contains(s)) {
        return ApiError::bad(format!(
            "Invalid include sections: {{'{bad}'}}. Valid options: {SECTIONS:?}"
        ))
        .into_response();
    }
    let queues = include.iter().any(|s| *s == "queues" || *s == "all");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let capacity = state.config.cache_tokens as u64;
    let loads: Vec<Value> = state
        .engine
        .loads()
        .into_iter()
        .filter(|l| q.dp_rank.is_none_or(|r| r == l.dp_rank))
        .map(|l| {
            let running = l.num_reqs - l.num_waiting_reqs;
            let usage = if capacity == 0 {
                0.0
            } else {
                l.num_tokens as f64 / capacity as f64
            };
            let mut v = json!({
                "dp_rank": l.dp_rank,
                "timestamp": now,
                "num_running_reqs": running,
                "num_waiting_reqs": l.num_waiting_reqs,
                "num_used_tokens": l.num_tokens,
                "num_total_tokens": l.num_tokens,
                "max_total_num_tokens": capacity,
                "token_usage": usage,
                "gen_throughput": 0.0,
                "cache_hit_rate": 0.0,
                "utilization": usage,
                "max_running_requests": state.config.max_running_prefills,
            });
            if queues {
                v["queues"] = json!({
                    "waiting": l.num_waiting_reqs,
                    "grammar": 0,
                    "paused": 0,
                    "retracted": 0,
                });
            }
            v
        })
        .collect();
    let timestamp = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    Json(json!({
        "timestamp": timestamp,
        "version": state.config.reported_version(),
        "accelerator": null,
        "num_accelerators": 1,
        "loads": loads,
    }))
    .into_response()
}
