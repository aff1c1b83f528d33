//! Errors in the shapes SGLang's server answers with (read in 0.5.4 and
//! 0.5.23 `python/sglang/srt/entrypoints/http_server.py`):
//!
//! * a request that fails validation: 400
//!   `{"object":"error","message":..,"type":"Bad Request","param":null,"code":400}`
//!   (SGLang turns FastAPI's 422 into this);
//! * an unknown path or a wrong method: FastAPI's own 404
//!   `{"detail":"Not Found"}` and 405 `{"detail":"Method Not Allowed"}`
//!   (SGLang's handler is registered for FastAPI's `HTTPException`, which
//!   Starlette's routing errors are not);
//! * other failures: `{"object":"error","message":..,"type":..,"param":null,"code":..}`.

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// An error answered to the client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed (bad JSON, missing or mistyped field).
    #[error("{0}")]
    BadRequest(String),
    /// Something asked for does not exist (the bootstrap server's answer
    /// for a room never published).
    #[error("{0}")]
    NotFound(String),
    /// No such route: FastAPI's `{"detail":"Not Found"}`.
    #[error("Not Found")]
    NoRoute,
    /// The route exists but not for this method: FastAPI's
    /// `{"detail":"Method Not Allowed"}`.
    #[error("Method Not Allowed")]
    MethodNotAllowed,
    /// A failure injected through `/_sim/config` `fail_status`.
    #[error("simulated failure: the worker is configured to answer {0}")]
    Injected(StatusCode),
    /// The KV cache of a disaggregated request could not be handed over
    /// (SGLang aborts such requests with a 500).
    #[error("KV transfer failed: {0}")]
    KvTransfer(String),
}

impl ApiError {
    /// A [`ApiError::BadRequest`] with `message`.
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError::BadRequest(message.into())
    }

    /// The HTTP status answered.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) | ApiError::NoRoute => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Injected(status) => *status,
            ApiError::KvTransfer(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON error body (see the module's documentation).
    pub fn body(&self) -> Value {
        let status = self.status();
        if matches!(self, ApiError::NoRoute | ApiError::MethodNotAllowed) {
            return json!({ "detail": self.to_string() });
        }
        json!({
            "object": "error",
            "message": self.to_string(),
            "type": error_type(self, status),
            "param": null,
            "code": status.as_u16(),
        })
    }
}

/// The `type` of an error object.
fn error_type(error: &ApiError, status: StatusCode) -> &'static str {
    if matches!(error, ApiError::BadRequest(_)) {
        // SGLang's validation handler: the HTTP reason phrase.
        return "Bad Request";
    }
    match status.as_u16() {
        400 => "BadRequestError",
        401 => "AuthenticationError",
        403 => "PermissionDeniedError",
        404 => "NotFoundError",
        405 => "MethodNotAllowedError",
        409 => "ConflictError",
        422 => "UnprocessableEntityError",
        429 => "RateLimitError",
        503 => "ServiceUnavailableError",
        _ if status.is_server_error() => "InternalServerError",
        _ => "APIError",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status(), Json(self.body())).into_response()
    }
}

/// Fallback for unknown paths.
pub async fn not_found(uri: Uri) -> ApiError {
    tracing::debug!(path = uri.path(), "no such route");
    ApiError::NoRoute
}

/// Fallback for known paths asked with the wrong method.
pub async fn method_not_allowed(uri: Uri) -> ApiError {
    tracing::debug!(path = uri.path(), "method not allowed");
    ApiError::MethodNotAllowed
}

/// SGLang's `--api-key` check (`add_api_key_middleware`): `OPTIONS`,
/// `/health*` and `/metrics` pass (and the simulator's `/_sim/` switches);
/// anything else without `Authorization: Bearer <key>` exactly is a 401
/// `{"error":"Unauthorized"}`.
pub async fn api_key(
    State(state): State<crate::AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = state.config.api_key.as_deref() else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    let open = request.method() == Method::OPTIONS
        || ["/health", "/metrics", "/_sim/"]
            .iter()
            .any(|p| path.starts_with(p));
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if open || given == Some(format!("Bearer {key}").as_str()) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": "Unauthorized"})),
    )
        .into_response()
}
