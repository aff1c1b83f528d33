//! What the subscriber knows about each worker and rank, for `/workers` and
//! the metrics: counters the tasks bump without locks, and the views built
//! from them and the block index when asked.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use sglang_envoy_kv_events::{KvIndex, Untrusted};

use super::discovery::Endpoints;

/// Counters of one (worker, DP rank) subscription.
#[derive(Debug, Default)]
pub struct RankStatus {
    /// The DP rank.
    pub rank: u32,
    /// The SUB socket is connected and subscribed (the transport reconnects
    /// by itself after that, so this stays true through a worker restart).
    pub subscribed: AtomicBool,
    /// Messages read off the SUB socket, well-formed or not.
    pub received: AtomicU64,
    /// Sequence gaps seen (replayed or not).
    pub gaps: AtomicU64,
    /// Gaps a replay filled completely.
    pub replayed: AtomicU64,
    /// Messages dropped because the applier fell behind.
    pub dropped: AtomicU64,
    /// Messages that were not a KV-event frame set or batch.
    pub malformed: AtomicU64,
    /// Last sequence number applied, -1 before the first.
    pub last_seq: AtomicI64,
}

impl RankStatus {
    /// The counters of a rank that has seen nothing.
    pub fn new(rank: u32) -> Self {
        RankStatus {
            rank,
            last_seq: AtomicI64::new(-1),
            ..RankStatus::default()
        }
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// How far discovery got for one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    /// `/server_info` not answered yet (the worker may still be starting).
    Pending,
    /// The worker answered and advertises no KV-event publisher, and no
    /// flag names one: nothing is subscribed.
    NotAdvertised,
    /// Subscribed at these endpoints.
    Subscribed(Endpoints),
}

/// One worker's subscription state.
#[derive(Debug)]
pub struct WorkerStatus {
    /// The worker's base URL (the index key).
    pub base_url: String,
    /// Where discovery stands.
    pub discovery: Mutex<Discovery>,
    /// One entry per subscribed rank.
    pub ranks: Mutex<Vec<Arc<RankStatus>>>,
}

impl WorkerStatus {
    /// A worker whose discovery has not run yet.
    pub fn new(base_url: String) -> Self {
        WorkerStatus {
            base_url,
            discovery: Mutex::new(Discovery::Pending),
            ranks: Mutex::new(Vec::new()),
        }
    }
}

/// One rank as `/workers` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankView {
    /// The DP rank.
    pub rank: u32,
    /// `live` (subscribed and trusted: routed on, as holding nothing
    /// until its first store), `untrusted` (events missed: not used until
    /// a restart or a cache flush) or `none` (not subscribed yet).
    pub state: &'static str,
    /// Why the rank is untrusted: `gap`, `overflow` or `unknown_event`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untrusted_reason: Option<&'static str>,
    /// Last sequence number applied.
    pub last_seq: Option<i64>,
    /// Blocks the index holds for this rank.
    pub blocks: usize,
    /// Whether the SUB socket is set up.
    pub subscribed: bool,
    /// Messages received.
    pub received: u64,
    /// Sequence gaps seen.
    pub gaps: u64,
    /// Gaps filled by a replay.
    pub replayed: u64,
    /// Messages dropped because the applier fell behind.
    pub dropped: u64,
    /// Messages that did not parse.
    pub malformed: u64,
}

/// One worker as `/workers` shows it (its `kv_events` object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerKvView {
    /// The worker's base URL.
    pub worker: String,
    /// `pending`, `not_advertised` or `subscribed`.
    pub discovery: &'static str,
    /// Rank 0's PUB endpoint (rank r adds r to the port).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Rank 0's replay endpoint, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_endpoint: Option<String>,
    /// Every subscribed rank is live.
    pub live: bool,
    /// What the policies route this worker on: `events` (live, with a
    /// tokenizer, and its self-check agreeing) or `tree`.
    pub routing: &'static str,
    /// Self-check: answers whose reported cached tokens were compared with
    /// the prediction, and how many agreed.
    pub checked: u64,
    /// See `checked`.
    pub agreed: u64,
    /// Blocks held over all ranks.
    pub blocks: usize,
    /// Per rank.
    pub ranks: Vec<RankView>,
}

impl WorkerKvView {
    /// Received messages over all ranks.
    pub fn received(&self) -> u64 {
        self.ranks.iter().map(|r| r.received).sum()
    }

    /// Gaps over all ranks.
    pub fn gaps(&self) -> u64 {
        self.ranks.iter().map(|r| r.gaps).sum()
    }
}

fn reason(u: Untrusted) -> &'static str {
    match u {
        Untrusted::Gap => "gap",
        Untrusted::Overflow => "overflow",
        Untrusted::UnknownEvent => "unknown_event",
    }
}

/// The view of one worker, reading the index under its read lock once.
pub fn view(status: &WorkerStatus, index: &RwLock<KvIndex<String>>) -> WorkerKvView {
    let discovery = status.discovery.lock().clone();
    let ranks: Vec<Arc<RankStatus>> = status.ranks.lock().clone();
    let (name, endpoint, replay_endpoint) = match &discovery {
        Discovery::Pending => ("pending", None, None),
        Discovery::NotAdvertised => ("not_advertised", None, None),
        Discovery::Subscribed(e) => ("subscribed", e.pub_endpoint(0), e.replay_endpoint(0)),
    };
    let idx = index.read();
    let ranks: Vec<RankView> = ranks
        .iter()
        .map(|r| {
            let last = r.last_seq.load(Ordering::Relaxed);
            let untrusted = idx.untrusted(status.base_url.as_str(), r.rank);
            // Known once subscribed (or a batch applied): routed on from
            // then on, as holding nothing until its first store.
            let known = last >= 0 || idx.ranks(status.base_url.as_str()).contains(&r.rank);
            let state = match (known, untrusted) {
                (false, _) => "none",
                (_, Some(_)) => "untrusted",
                (true, None) => "live",
            };
            RankView {
                rank: r.rank,
                state,
                untrusted_reason: untrusted.map(reason),
                last_seq: (last >= 0).then_some(last),
                blocks: idx.blocks(status.base_url.as_str(), r.rank),
                subscribed: r.subscribed.load(Ordering::Relaxed),
                received: r.received.load(Ordering::Relaxed),
                gaps: r.gaps.load(Ordering::Relaxed),
                replayed: r.replayed.load(Ordering::Relaxed),
                dropped: r.dropped.load(Ordering::Relaxed),
                malformed: r.malformed.load(Ordering::Relaxed),
            }
        })
        .collect();
    drop(idx);
    WorkerKvView {
        worker: status.base_url.clone(),
        discovery: name,
        endpoint,
        replay_endpoint,
        live: !ranks.is_empty() && ranks.iter().all(|r| r.state == "live"),
        // Set by the caller that knows the engine (see `admin::workers`).
        routing: "tree",
        checked: 0,
        agreed: 0,
        blocks: ranks.iter().map(|r| r.blocks).sum(),
        ranks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sglang_envoy_kv_events::{EventBatch, IndexLimits, KvEvent};

    #[test]
    fn states_follow_the_index_and_the_counters() {
        let index = RwLock::new(KvIndex::new(IndexLimits::default()));
        let status = WorkerStatus::new("http://w:1".into());
        let r0 = Arc::new(RankStatus::new(0));
        let r1 = Arc::new(RankStatus::new(1));
        status.ranks.lock().extend([r0.clone(), r1.clone()]);
        let v = view(&status, &index);
        assert_eq!(v.discovery, "pending");
        assert!(!v.live);
        assert!(v.ranks.iter().all(|r| r.state == "none"));

        let batch = EventBatch {
            ts: 0.0,
            events: vec![],
            attn_dp_rank: None,
        };
        let key = "http://w:1".to_string();
        index.write().apply(&key, 0, 0, &batch);
        r0.last_seq.store(0, Ordering::Relaxed);
        index.write().apply(&key, 1, 0, &batch);
        index.write().apply(&key, 1, 5, &batch);
        r1.last_seq.store(5, Ordering::Relaxed);
        let v = view(&status, &index);
        assert_eq!(v.ranks[0].state, "live");
        assert_eq!(v.ranks[1].state, "untrusted");
        assert_eq!(v.ranks[1].untrusted_reason, Some("gap"));
        assert!(!v.live);
        index
            .write()
            .apply_events(&key, 1, &[KvEvent::AllBlocksCleared]);
        assert!(view(&status, &index).live);
    }
}
