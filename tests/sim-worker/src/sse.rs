//! Server-sent events as SGLang writes them: `data: {json}\n\n` per chunk and
//! a final `data: [DONE]\n\n`.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures::future::ready;
use futures::stream::{Stream, StreamExt};
use serde_json::{json, Value};

use crate::error::ApiError;

/// One `data:` event carrying `chunk`.
pub fn event(chunk: &Value) -> Bytes {
    Bytes::from(format!("data: {chunk}\n\n"))
}

/// The terminating `data: [DONE]` event.
pub fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// SGLang's in-stream error: `data: {"error": {..}}` (the error object of
/// [`ApiError::body`]) followed by `data: [DONE]`.
pub fn error(e: &ApiError) -> Bytes {
    let mut out = format!("data: {}\n\n", json!({ "error": e.body() })).into_bytes();
    out.extend_from_slice(&done());
    Bytes::from(out)
}

/// `events` up to the first error, which is sent as [`error`] and ends the
/// stream (as an exception ends SGLang's stream generator).
pub fn until_error<S>(events: S) -> impl Stream<Item = Bytes> + Send + 'static
where
    S: Stream<Item = Result<Bytes, ApiError>> + Send + 'static,
{
    events.scan(false, |failed, item| {
        ready(match item {
            _ if *failed => None,
            Ok(bytes) => Some(bytes),
            Err(e) => {
                tracing::debug!(error = %e, "stream failed");
                *failed = true;
                Some(error(&e))
            }
        })
    })
}

/// A `text/event-stream` response sending `events`. `keep` (e.g. the
/// request's in-flight guard) lives exactly as long as the stream, so it is
/// released when the stream ends or the client hangs up.
pub fn response<S, K>(events: S, keep: K) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
    K: Send + Sync + 'static,
{
    let body = events.map(move |bytes| {
        let _alive = &keep;
        Ok::<_, Infallible>(bytes)
    });
    (
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}
