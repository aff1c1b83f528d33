//! Counters behind `/_sim/stats`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{json, Value};

/// Counts of inference requests (not health checks or `/_sim` calls).
#[derive(Debug)]
pub struct Stats {
    requests_total: AtomicU64,
    in_flight: AtomicU64,
    by_path: Mutex<BTreeMap<String, u64>>,
    prompt_tokens_total: AtomicU64,
    cached_tokens_total: AtomicU64,
    by_rank: Vec<AtomicU64>,
    kv_published: AtomicU64,
    kv_fetched: AtomicU64,
    kv_failed: AtomicU64,
    kv_fetched_by_rank: Vec<AtomicU64>,
    /// Requests that named their rank with the deprecated
    /// `data_parallel_rank` (upstream profile; SGLang warns on each).
    deprecated_dp_rank: AtomicU64,
    /// Completed TLS handshakes by the SNI the client sent (`""`: none).
    tls_handshakes: Mutex<BTreeMap<String, u64>>,
    tls_handshake_failures: AtomicU64,
}

/// What happened to one KV handoff of a disaggregated sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEvent {
    /// A prefill worker published a room.
    Published,
    /// A handoff completed on `rank`: a decode worker took a room this
    /// prefill worker published, or this decode worker got a matching KV.
    Fetched {
        /// The DP rank of this worker that ran the sequence.
        rank: usize,
    },
    /// A handoff failed: a published room expired unfetched, or a decode
    /// worker's fetch failed (unreachable, timeout, mismatched prompt).
    Failed,
}

impl Stats {
    /// Zeroed counters for `dp_size` ranks.
    pub fn new(dp_size: usize) -> Stats {
        Stats {
            requests_total: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            by_path: Mutex::new(BTreeMap::new()),
            prompt_tokens_total: AtomicU64::new(0),
            cached_tokens_total: AtomicU64::new(0),
            by_rank: (0..dp_size).map(|_| AtomicU64::new(0)).collect(),
            kv_published: AtomicU64::new(0),
            kv_fetched: AtomicU64::new(0),
            kv_failed: AtomicU64::new(0),
            kv_fetched_by_rank: (0..dp_size).map(|_| AtomicU64::new(0)).collect(),
            deprecated_dp_rank: AtomicU64::new(0),
            tls_handshakes: Mutex::new(BTreeMap::new()),
            tls_handshake_failures: AtomicU64::new(0),
        }
    }

    /// Counts a completed TLS handshake whose client sent `sni`.
    pub fn tls_handshake(&self, sni: Option<&str>) {
        *self
            .tls_handshakes
            .lock()
            .entry(sni.unwrap_or_default().to_string())
            .or_default() += 1;
    }

    /// Counts a failed TLS handshake (e.g. no client certificate where one
    /// is required, or a client that does not trust the worker).
    pub fn tls_handshake_failed(&self) {
        self.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request naming its rank with the deprecated field.
    pub fn deprecated_dp_rank(&self) {
        self.deprecated_dp_rank.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a KV handoff event.
    pub fn kv(&self, event: KvEvent) {
        let counter = match event {
            KvEvent::Published => &self.kv_published,
            KvEvent::Fetched { rank } => {
                if let Some(n) = self.kv_fetched_by_rank.get(rank) {
                    n.fetch_add(1, Ordering::Relaxed);
                }
                &self.kv_fetched
            }
            KvEvent::Failed => &self.kv_failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an inference request to `path`; it is in flight until the
    /// returned guard is dropped (answer sent, stream ended, or client gone).
    pub fn begin(self: &Arc<Self>, path: &str) -> InFlight {
        self.requests_total.fetch_add(1, Ordering::Relaxed);
        *self.by_path.lock().entry(path.to_string()).or_default() += 1;
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }

    /// Counts one sequence run on `rank`: prefilled here, or (on a decode
    /// worker) started with a transferred KV and no cache hits.
    pub fn prefilled(&self, rank: usize, prompt_tokens: usize, cached_tokens: usize) {
        self.prompt_tokens_total
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.cached_tokens_total
            .fetch_add(cached_tokens as u64, Ordering::Relaxed);
        if let Some(n) = self.by_rank.get(rank) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The `/_sim/stats` document; `kv_rooms_open` is the number of rooms
    /// currently published or waited for on this worker's bootstrap server.
    pub fn to_json(&self, kv_rooms_open: usize) -> Value {
        let by_path = self.by_path.lock().clone();
        let load = |counters: &[AtomicU64]| -> Vec<u64> {
            counters.iter().map(|n| n.load(Ordering::Relaxed)).collect()
        };
        json!({
            "requests_total": self.requests_total.load(Ordering::Relaxed),
            "in_flight": self.in_flight.load(Ordering::Relaxed),
            "by_path": by_path,
            "prompt_tokens_total": self.prompt_tokens_total.load(Ordering::Relaxed),
            "cached_tokens_total": self.cached_tokens_total.load(Ordering::Relaxed),
            "by_rank": load(&self.by_rank),
            "kv_published": self.kv_published.load(Ordering::Relaxed),
            "kv_fetched": self.kv_fetched.load(Ordering::Relaxed),
            "kv_failed": self.kv_failed.load(Ordering::Relaxed),
            "kv_fetched_by_rank": load(&self.kv_fetched_by_rank),
            "kv_rooms_open": kv_rooms_open,
            "deprecated_dp_rank": self.deprecated_dp_rank.load(Ordering::Relaxed),
            "tls_handshakes": self.tls_handshakes.lock().clone(),
            "tls_handshake_failures": self.tls_handshake_failures.load(Ordering::Relaxed),
        })
    }
}

/// Keeps one request counted in `in_flight` while alive.
#[derive(Debug)]
pub struct InFlight(Arc<Stats>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
