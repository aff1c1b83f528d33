//! Errors in the shape SGLang's OpenAI-compatible server uses:
//! `{"object":"error","message":..,"type":..,"param":null,"code":..}`.

use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// An error answered to the client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed (bad JSON, missing or mistyped field).
    #[error("{0}")]
    BadRequest(String),
    /// No such route.
    #[error("{0}")]
    NotFound(String),
    /// The route exists but not for this method.
    #[error("{0}")]
    MethodNotAllowed(String),
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
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Injected(status) => *status,
            ApiError::KvTransfer(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON error object: `{"object":"error","message":..,"type":..,
    /// "param":null,"code":..}`.
    pub fn body(&self) -> Value {
        let status = self.status();
        json!({
            "object": "error",
            "message": self.to_string(),
            "type": error_type(status),
            "param": null,
            "code": status.as_u16(),
        })
    }
}

/// The `type` field OpenAI clients expect for a status.
fn error_type(status: StatusCode) -> &'static str {
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
    ApiError::NotFound(format!("no route for {}", uri.path()))
}

/// Fallback for known paths asked with the wrong method.
pub async fn method_not_allowed(uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("method not allowed for {}", uri.path()))
}
