//! The request log behind `/_sim/requests`: what the router actually sent
//! (method, path, headers, raw body), plus where the simulator ran it.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde::Serialize;

use crate::error::ApiError;
use crate::state::AppState;

/// How many requests are kept; older ones are dropped.
pub const CAPACITY: usize = 2000;

/// One received request.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// Path without the query string.
    pub path: String,
    /// Headers by lowercased name; repeated headers are joined with `", "`.
    pub headers: BTreeMap<String, String>,
    /// The raw body, lossily decoded as UTF-8.
    pub body: String,
    /// DP rank the request ran on (the first sequence's, for batches).
    pub dp_rank: Option<usize>,
    /// Prompt tokens over all sequences of the request.
    pub prompt_tokens: u64,
    /// Prefix-cache hits over all sequences of the request.
    pub cached_tokens: u64,
    /// Arrival, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// Handle of a record, put in the request's extensions so handlers can add
/// what they learn while serving it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordId(u64);

/// Ring buffer of the last [`CAPACITY`] requests.
#[derive(Debug, Default)]
pub struct Recorder {
    inner: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    next: u64,
    items: VecDeque<(u64, RequestRecord)>,
}

impl Recorder {
    /// Stores `record`, dropping the oldest past capacity.
    pub fn push(&self, record: RequestRecord) -> RecordId {
        let mut ring = self.inner.lock();
        let id = ring.next;
        ring.next += 1;
        ring.items.push_back((id, record));
        while ring.items.len() > CAPACITY {
            ring.items.pop_front();
        }
        RecordId(id)
    }

    /// Adds one prefilled sequence to record `id` (if still kept).
    pub fn note_prefill(&self, id: RecordId, rank: usize, prompt_tokens: usize, cached: usize) {
        let mut ring = self.inner.lock();
        // Ids only grow, so the ring is sorted by id.
        if let Ok(i) = ring.items.binary_search_by_key(&id.0, |(k, _)| *k) {
            if let Some((_, r)) = ring.items.get_mut(i) {
                r.dp_rank.get_or_insert(rank);
                r.prompt_tokens += prompt_tokens as u64;
                r.cached_tokens += cached as u64;
            }
        }
    }

    /// All kept records, oldest first.
    pub fn all(&self) -> Vec<RequestRecord> {
        self.inner
            .lock()
            .items
            .iter()
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Forgets all records; returns how many there were.
    pub fn clear(&self) -> usize {
        let mut ring = self.inner.lock();
        let n = ring.items.len();
        ring.items.clear();
        n
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Middleware recording every request except the `/_sim` ones (reading the
/// log should not change it).
pub async fn record(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.uri().path().starts_with("/_sim/") {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    let bytes = match to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            return ApiError::bad(format!("could not read the request body: {e}")).into_response()
        }
    };
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in &parts.headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match headers.entry(name.as_str().to_string()) {
            Entry::Occupied(mut e) => {
                let v = e.get_mut();
                v.push_str(", ");
                v.push_str(&value);
            }
            Entry::Vacant(e) => {
                e.insert(value);
            }
        }
    }
    let id = state.recorder.push(RequestRecord {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        dp_rank: None,
        prompt_tokens: 0,
        cached_tokens: 0,
        at_ms: now_ms(),
    });
    parts.extensions.insert(id);
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
