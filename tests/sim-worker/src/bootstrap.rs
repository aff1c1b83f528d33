//! The bootstrap server of a prefill worker and its client on a decode
//! worker: the simulated KV-cache transfer of PD disaggregation.
//!
//! A prefill worker publishes the [`Kv`] of each prefilled sequence under its
//! `bootstrap_room` and the DP rank that ran it in its [`Rooms`] and waits
//! for a decode worker to take it. The bootstrap server (its own port,
//! `--disaggregation-bootstrap-port`) serves one long-poll route:
//!
//! `GET /kv/{room}?rank=R&timeout_ms=N` answers the [`Kv`] of the room on
//! prefill rank `R` as JSON as soon as it is published (taking it: a room is
//! fetched once), or a 404 error after `N` milliseconds (default: the
//! worker's `--disaggregation-timeout-ms`). Without `rank`, the rank is
//! `room % dp_size` of the prefill worker, what SGLang's decode computes
//! from the prefill's registration when the request does not name one. As
//! on GPUs, a decode asking the wrong rank waits for KV that never comes
//! there (and the prefill for a decode that never comes): both fail after
//! the timeout.
//!
//! Nothing outlives its request: a published room is withdrawn when its
//! prefill request ends unfetched (timeout or client gone), and a waiting
//! fetch is withdrawn when its long-poll ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::error::{self, ApiError};
use crate::state::AppState;

/// Longest long-poll the bootstrap server accepts.
const MAX_WAIT: Duration = Duration::from_secs(600);

/// The "KV cache" of one prefilled sequence: enough for a decode worker to
/// check it is the KV of its own prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kv {
    /// The `bootstrap_room` it was published under.
    pub bootstrap_room: u64,
    /// The prefill request's id.
    pub rid: String,
    /// [`crate::disagg::prompt_hash`] of the prompt tokens.
    pub prompt_hash: u64,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// The prefill worker's DP rank that ran it.
    pub dp_rank: usize,
}

/// One room in the table.
#[derive(Debug)]
enum Slot {
    /// Published by prefill request `id`, not fetched yet.
    Ready {
        id: u64,
        kv: Kv,
        fetched: oneshot::Sender<()>,
    },
    /// Fetches waiting for the room to be published, oldest first.
    Wanted {
        waiters: Vec<(u64, oneshot::Sender<Kv>)>,
    },
}

/// Why a room could not be published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("bootstrap_room {0} is already published and not fetched yet")]
pub struct RoomBusy(pub u64);

/// A room on one prefill DP rank: `(bootstrap_room, rank)`.
pub type RoomKey = (u64, usize);

/// The rooms of a prefill worker's bootstrap server.
#[derive(Debug, Default)]
pub struct Rooms {
    slots: Mutex<HashMap<RoomKey, Slot>>,
    next_id: AtomicU64,
}

impl Rooms {
    /// Rooms published or waited for right now.
    pub fn open(&self) -> usize {
        self.slots.lock().len()
    }

    /// Publishes `kv`, handing it at once to a waiting fetch if there is one.
    /// The room stays published while the returned value lives.
    pub fn publish(&self, kv: Kv) -> Result<Published<'_>, RoomBusy> {
        let room = (kv.bootstrap_room, kv.dp_rank);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut slots = self.slots.lock();
        let mut waiters = match slots.remove(&room) {
            Some(ready @ Slot::Ready { .. }) => {
                slots.insert(room, ready);
                return Err(RoomBusy(room.0));
            }
            Some(Slot::Wanted { waiters }) => waiters,
            None => Vec::new(),
        };
        let mut delivered = false;
        while !waiters.is_empty() {
            let (_, waiter) = waiters.remove(0);
            // A waiter whose fetch has gone away refuses it; try the next.
            if waiter.send(kv.clone()).is_ok() {
                delivered = true;
                break;
            }
        }
        if delivered {
            let _ = tx.send(());
            if !waiters.is_empty() {
                slots.insert(room, Slot::Wanted { waiters });
            }
        } else {
            slots.insert(
                room,
                Slot::Ready {
                    id,
                    kv,
                    fetched: tx,
                },
            );
        }
        Ok(Published {
            rooms: self,
            room,
            id,
            fetched: rx,
        })
    }

    /// Takes the KV of `room` (on its rank), waiting up to `wait` for it to
    /// be published.
    pub async fn fetch(&self, room: RoomKey, wait: Duration) -> Option<Kv> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut rx = {
            let mut slots = self.slots.lock();
            if matches!(slots.get(&room), Some(Slot::Ready { .. })) {
                if let Some(Slot::Ready { kv, fetched, .. }) = slots.remove(&room) {
                    let _ = fetched.send(());
                    return Some(kv);
                }
            }
            let (tx, rx) = oneshot::channel();
            match slots.entry(room).or_insert_with(|| Slot::Wanted {
                waiters: Vec::new(),
            }) {
                Slot::Wanted { waiters } => waiters.push((id, tx)),
                Slot::Ready { .. } => {}
            }
            rx
        };
        let waiting = Waiting {
            rooms: self,
            room,
            id,
        };
        if let Ok(Ok(kv)) = tokio::time::timeout(wait, &mut rx).await {
            return Some(kv);
        }
        // Withdraw first, then look once more: a publish may have handed
        // the KV over just as the wait ended.
        drop(waiting);
        rx.try_recv().ok()
    }

    fn withdraw_waiter(&self, room: RoomKey, id: u64) {
        let mut slots = self.slots.lock();
        if let Some(Slot::Wanted { waiters }) = slots.get_mut(&room) {
            waiters.retain(|(w, _)| *w != id);
            if waiters.is_empty() {
                slots.remove(&room);
            }
        }
    }

    fn withdraw_published(&self, room: RoomKey, id: u64) {
        let mut slots = self.slots.lock();
        if matches!(slots.get(&room), Some(Slot::Ready { id: mine, .. }) if *mine == id) {
            slots.remove(&room);
        }
    }
}

/// A published room; withdrawn when dropped unless fetched.
#[derive(Debug)]
pub struct Published<'a> {
    rooms: &'a Rooms,
    room: RoomKey,
    id: u64,
    fetched: oneshot::Receiver<()>,
}

impl Published<'_> {
    /// Waits up to `wait` for a decode worker to fetch the room; true if it
    /// did. The room is withdrawn either way.
    pub async fn fetched(mut self, wait: Duration) -> bool {
        if let Ok(Ok(())) = tokio::time::timeout(wait, &mut self.fetched).await {
            return true;
        }
        self.rooms.withdraw_published(self.room, self.id);
        // Fetched just as the wait ended?
        self.fetched.try_recv().is_ok()
    }
}

impl Drop for Published<'_> {
    fn drop(&mut self) {
        self.rooms.withdraw_published(self.room, self.id);
    }
}

/// A waiting fetch; withdrawn when dropped.
struct Waiting<'a> {
    rooms: &'a Rooms,
    room: RoomKey,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.rooms.withdraw_waiter(self.room, self.id);
    }
}

/// Query of `GET /kv/{room}`.
#[derive(Debug, Deserialize)]
pub struct FetchQuery {
    /// How long to wait for the room, in milliseconds.
    timeout_ms: Option<u64>,
    /// The prefill DP rank to take it from; `room % dp_size` when absent.
    rank: Option<usize>,
}

/// The bootstrap server's routes over the worker's `state`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/kv/{room}", get(fetch_route))
        .route("/health", get(|| async { StatusCode::OK }))
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .with_state(state)
}

/// `GET /kv/{room}?timeout_ms=N`: the room's KV once published.
async fn fetch_route(
    State(state): State<AppState>,
    Path(room): Path<String>,
    Query(query): Query<FetchQuery>,
) -> Result<Json<Kv>, ApiError> {
    let room: u64 = room
        .parse()
        .map_err(|_| ApiError::bad(format!("room must be a non-negative integer, got {room:?}")))?;
    let wait = query
        .timeout_ms
        .map_or(state.timeout(), Duration::from_millis)
        .min(MAX_WAIT);
    let dp_size = state.config.dp_size.max(1);
    let rank = query.rank.unwrap_or((room % dp_size as u64) as usize);
    match state.rooms.fetch((room, rank), wait).await {
        Some(kv) => {
            tracing::debug!(room, rank, rid = kv.rid, "KV fetched by a decode worker");
            Ok(Json(kv))
        }
        None => Err(ApiError::NotFound(format!(
            "bootstrap_room {room} was not published on prefill DP rank {rank} (of {dp_size}) within {} ms",
            wait.as_millis()
        ))),
    }
}

/// Where a decode worker takes a room's KV from.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The request's `bootstrap_host`.
    pub host: &'a str,
    /// Its `bootstrap_port` (or the decode's default).
    pub port: u16,
    /// Its `bootstrap_room`.
    pub room: u64,
    /// The prefill DP rank holding it, when the request says; else the
    /// bootstrap server's `room % dp_size`.
    pub prefill_rank: Option<i64>,
}

/// Fetches the KV of a room from the bootstrap server at `at`, waiting up
/// to `wait`.
pub async fn fetch_remote(
    client: &reqwest::Client,
    at: &Source<'_>,
    wait: Duration,
) -> Result<Kv, String> {
    let (port, room) = (at.port, at.room);
    let host = if at.host.contains(':') && !at.host.starts_with('[') {
        format!("[{}]", at.host)
    } else {
        at.host.to_string()
    };
    let rank = match at.prefill_rank {
        Some(r) if r < 0 => return Err(format!("prefill DP rank {r} does not exist")),
        Some(r) => format!("&rank={r}"),
        None => String::new(),
    };
    let url = format!(
        "http://{host}:{port}/kv/{room}?timeout_ms={}{rank}",
        wait.as_millis()
    );
    let answer = client
        .get(&url)
        .timeout(wait + Duration::from_secs(1))
        .send()
        .await
        .map_err(|e| format!("bootstrap server {host}:{port} unreachable: {e}"))?;
    let status = answer.status();
    if !status.is_success() {
        let body = answer.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| {
                v.get("message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
            })
            .unwrap_or(body);
        return Err(format!(
            "bootstrap server {host}:{port} answered {status}: {message}"
        ));
    }
    answer
        .json::<Kv>()
        .await
        .map_err(|e| format!("bootstrap server {host}:{port} sent a bad KV record: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(room: u64) -> Kv {
        Kv {
            bootstrap_room: room,
            rid: format!("r{room}"),
            prompt_hash: 42,
            prompt_tokens: 3,
            dp_rank: 0,
        }
    }

    #[tokio::test]
    async fn publish_then_fetch() {
        let rooms = Rooms::default();
        let p = rooms.publish(kv(1)).unwrap();
        assert_eq!(rooms.publish(kv(1)).err(), Some(RoomBusy(1)));
        assert_eq!(rooms.open(), 1);
        // Another rank's room is another room.
        assert_eq!(rooms.fetch((1, 1), Duration::from_millis(5)).await, None);
        assert_eq!(rooms.fetch((1, 0), Duration::ZERO).await, Some(kv(1)));
        assert!(p.fetched(Duration::ZERO).await);
        assert_eq!(rooms.open(), 0);
        // Fetched once only.
        assert_eq!(rooms.fetch((1, 0), Duration::from_millis(5)).await, None);
        assert_eq!(rooms.open(), 0);
    }

    #[tokio::test]
    async fn fetch_waits_for_publish() {
        let rooms = std::sync::Arc::new(Rooms::default());
        let r = std::sync::Arc::clone(&rooms);
        let fetch = tokio::spawn(async move { r.fetch((2, 0), Duration::from_secs(5)).await });
        while rooms.open() == 0 {
            tokio::task::yield_now().await;
        }
        let p = rooms.publish(kv(2)).unwrap();
        assert!(p.fetched(Duration::ZERO).await);
        assert_eq!(fetch.await.ok().flatten(), Some(kv(2)));
        assert_eq!(rooms.open(), 0);
    }

    #[tokio::test]
    async fn unfetched_rooms_expire() {
        let rooms = Rooms::default();
        let p = rooms.publish(kv(3)).unwrap();
        assert!(!p.fetched(Duration::from_millis(5)).await);
        assert_eq!(rooms.open(), 0);
        // Dropped without waiting: withdrawn too.
        drop(rooms.publish(kv(3)).unwrap());
        assert_eq!(rooms.open(), 0);
        assert_eq!(rooms.fetch((3, 0), Duration::from_millis(5)).await, None);
        assert_eq!(rooms.open(), 0);
    }
}
