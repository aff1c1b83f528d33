//! Server-sent events as SGLang writes them: `data: {json}\n\n` per chunk and
//! a final `data: [DONE]\n\n`.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures::stream::{Stream, StreamExt};
use serde_json::Value;

/// One `data:` event carrying `chunk`.
pub fn event(chunk: &Value) -> Bytes {
    Bytes::from(format!("data: {chunk}\n\n"))
}

/// The terminating `data: [DONE]` event.
pub fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
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
