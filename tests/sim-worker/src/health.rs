//! `/health` and `/health_generate` as SGLang answers them (0.5.x
//! `python/sglang/srt/entrypoints/http_server.py` `health_generate`): 503
//! while the server starts; otherwise a one-token generate whose output is
//! looked for after a one-second sleep, so a check takes about a second;
//! 503 when nothing came within `SGLANG_HEALTH_CHECK_TIMEOUT` (20 s), as
//! when the scheduler is stuck. Empty bodies throughout.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;

use crate::state::AppState;

/// `GET /health` and `GET /health_generate`.
///
/// * `--startup-ms` after the start: 503 at once.
/// * The `healthy` switch off: 503 at once (a server shutting down, or one
///   whose last check failed and that a test wants refused quickly).
/// * Otherwise 200 after `--health-delay-ms`; while the `stall` switch is
///   on (inference hangs), the check hangs too, until the stall ends or
///   `--health-timeout-ms` passes (then 503). A `fail_status` switch does
///   not touch it: SGLang's health generate is not an HTTP request that can
///   fail like an inference answer, so a worker failing its requests still
///   looks healthy.
pub async fn health(State(state): State<AppState>) -> StatusCode {
    let config = &state.config;
    if state.started.elapsed() < Duration::from_millis(config.startup_ms) {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    if !state.control.get().healthy {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let delay = Duration::from_millis(config.health_delay_ms);
    let timeout = Duration::from_millis(config.health_timeout_ms);
    let answered = tokio::time::timeout(timeout.max(delay), async {
        tokio::time::sleep(delay).await;
        state.control.wait_unstalled().await;
    })
    .await;
    match answered {
        Ok(()) => StatusCode::OK,
        Err(_) => {
            tracing::warn!(
                timeout_ms = config.health_timeout_ms,
                "health check failed: no output from the (stalled) scheduler"
            );
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}
