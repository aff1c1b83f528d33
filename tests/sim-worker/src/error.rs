//! Errors in the shape SGLang's OpenAI-compatible server uses:
//! `{"object":"error","message":..,"type":..,"param":null,"code":..}`.

use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

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
        }
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
        let status = self.status();
        let body = json!({
            "object": "error",
            "message": self.to_string(),
            "type": error_type(status),
            "param": null,
            "code": status.as_u16(),
        });
        (status, Json(body)).into_response()
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
