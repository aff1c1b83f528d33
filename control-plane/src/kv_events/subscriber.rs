//! One (worker, DP rank) subscription: a reader task that keeps a SUB
//! socket connected and hands messages over through a bounded queue, and
//! an applier that decodes them, fills sequence gaps from the replay
//! endpoint and applies batches to the shared index.
//!
//! Memory stays bounded whatever the publisher does: the SUB socket is read
//! only as fast as the queue drains (the zeromq transport reads from TCP on
//! demand), and a full queue drops the message, which marks the rank
//! untrusted at once (the dropped batch may have removed blocks) and skips
//! the replay for the gap it leaves: an applier that cannot keep up should
//! not also be asked to catch up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use sglang_envoy_kv_events::frame::parse_pub_message;
use sglang_envoy_kv_events::{decode_batch, KvEvent, KvIndex};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use zeromq::{Socket, SocketOptions, SocketRecv, SubSocket};

use super::replay;
use super::status::RankStatus;
use super::Backoff;

/// How a subscription behaves (from [`super::KvEventsOptions`]).
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Messages the reader may queue ahead of the applier.
    pub queue: usize,
    /// Longest a replay may take.
    pub replay_timeout: Duration,
    /// Gaps longer than this are not replayed (SGLang buffers 10 000
    /// batches by default; a longer gap cannot be filled anyway).
    pub max_replay: u64,
    /// First and longest wait between connection attempts.
    pub backoff: (Duration, Duration),
}

/// What one rank's tasks share with the rest of the subscriber.
#[derive(Clone)]
pub struct Rank {
    /// The worker's index key (its base URL).
    pub worker: String,
    /// The DP rank.
    pub rank: u32,
    /// PUB endpoint to dial.
    pub endpoint: String,
    /// Replay endpoint, when the publisher has one.
    pub replay: Option<String>,
    /// SUB filter.
    pub topic: String,
    /// The fleet's block index.
    pub index: Arc<RwLock<KvIndex<String>>>,
    /// False once the worker left the registry: nothing is applied after.
    pub alive: Arc<AtomicBool>,
    /// This rank's counters.
    pub status: Arc<RankStatus>,
    /// Set by the reader on a drop, taken by the applier at the next gap.
    pub dropped: Arc<AtomicBool>,
}

impl Rank {
    /// Run the edits of `f` on the index, unless the worker is gone. The
    /// check sits under the write lock so that a removal, which clears the
    /// flag before taking the lock to drop the worker's blocks, is never
    /// followed by an edit that brings them back.
    fn edit(&self, f: impl FnOnce(&mut KvIndex<String>)) -> bool {
        let mut index = self.index.write();
        if !self.alive.load(Ordering::Acquire) {
            return false;
        }
        f(&mut index);
        true
    }

    /// Mark the rank untrusted without touching its sequence tracking: the
    /// index treats an event it does not know as possible drift, which is
    /// what a dropped batch is.
    fn distrust(&self) {
        let marker = [KvEvent::Unknown {
            tag: "router: batch dropped".into(),
        }];
        self.edit(|i| i.apply_events(&self.worker, self.rank, &marker));
    }
}

/// Subscribe until the task is aborted.
pub async fn run(rank: Rank, tuning: Tuning) {
    let (tx, rx) = mpsc::channel(tuning.queue.max(1));
    let reader = tokio::spawn(read(rank.clone(), tuning.clone(), tx));
    // Aborting this task drops the guard, which stops the reader (and so
    // closes its socket) too.
    let _reader = AbortOnDrop(reader);
    apply(rank, tuning, rx).await;
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keep a SUB socket connected and queue what it reads.
async fn read(rank: Rank, tuning: Tuning, tx: mpsc::Sender<Vec<Vec<u8>>>) {
    let mut backoff = Backoff::new(tuning.backoff.0, tuning.backoff.1);
    loop {
        let mut options = SocketOptions::default();
        // The transport's own connect loop would otherwise wait 30 s per
        // attempt; the backoff here spaces the attempts instead.
        options.connect_timeout(tuning.backoff.1.max(Duration::from_secs(1)));
        let mut socket = SubSocket::with_options(options);
        let connected = async {
            socket.connect(&rank.endpoint).await?;
            socket.subscribe(&rank.topic).await
        }
        .await;
        if let Err(e) = connected {
            debug!(worker = %rank.worker, rank = rank.rank, endpoint = %rank.endpoint, error = %e, "KV events: cannot subscribe yet");
            tokio::time::sleep(backoff.next_wait()).await;
            continue;
        }
        info!(worker = %rank.worker, rank = rank.rank, endpoint = %rank.endpoint, "KV events: subscribed");
        rank.status.subscribed.store(true, Ordering::Relaxed);
        // Known from now on: a worker with an empty cache publishes
        // nothing, and holds nothing.
        rank.edit(|i| i.open_rank(&rank.worker, rank.rank));
        backoff.reset();
        // The socket reconnects by itself when the publisher restarts; an
        // error here means the socket itself gave up, so build a new one.
        loop {
            match socket.recv().await {
                Ok(message) => {
                    RankStatus::bump(&rank.status.received);
                    let frames: Vec<Vec<u8>> =
                        message.into_vec().into_iter().map(|b| b.to_vec()).collect();
                    match tx.try_send(frames) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            RankStatus::bump(&rank.status.dropped);
                            if !rank.dropped.swap(true, Ordering::AcqRel) {
                                warn!(worker = %rank.worker, rank = rank.rank, "KV events: applier behind, dropping batches; the rank is untrusted until a restart or cache flush");
                            }
                            rank.distrust();
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => return,
                    }
                }
                Err(e) => {
                    warn!(worker = %rank.worker, rank = rank.rank, error = %e, "KV events: SUB socket failed; reconnecting");
                    break;
                }
            }
        }
        rank.status.subscribed.store(false, Ordering::Relaxed);
        tokio::time::sleep(backoff.next_wait()).await;
    }
}

/// Decode, check the sequence, replay gaps, apply.
async fn apply(rank: Rank, tuning: Tuning, mut rx: mpsc::Receiver<Vec<Vec<u8>>>) {
    let mut last: Option<i64> = None;
    while let Some(frames) = rx.recv().await {
        let (seq, batch) = match parse_pub_message(&frames)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                decode_batch(m.payload)
                    .map(|b| (m.seq, b))
                    .map_err(|e| e.to_string())
            }) {
            Ok(ok) => ok,
            Err(why) => {
                // Skipped without advancing the sequence: if it was a real
                // batch, the next one shows the gap.
                RankStatus::bump(&rank.status.malformed);
                debug!(worker = %rank.worker, rank = rank.rank, %why, "KV events: malformed message ignored");
                continue;
            }
        };
        if let Some(prev) = last {
            if seq > prev.saturating_add(1) {
                fill_gap(&rank, &tuning, prev, seq).await;
            } else if seq <= prev {
                // A restart (the same seq again is one too: PUB/SUB never
                // repeats a message) empties the rank; drops before it no
                // longer matter. The new process counts from 0: a first
                // batch above 0 means its first ones were missed, which its
                // replay buffer may still hold.
                rank.dropped.store(false, Ordering::Release);
                if seq > 0 {
                    fill_gap(&rank, &tuning, -1, seq).await;
                }
            }
        }
        if !rank.edit(|i| {
            i.apply(&rank.worker, rank.rank, seq, &batch);
        }) {
            return;
        }
        last = Some(seq);
        rank.status.last_seq.store(seq, Ordering::Relaxed);
    }
}

/// Batches `prev+1..seq` were missed (`prev` is -1 when a restarted
/// publisher's first batches were): replay them into the index when the
/// publisher still has them. Otherwise the live batch's gap marks the rank
/// untrusted when it is applied.
async fn fill_gap(rank: &Rank, tuning: &Tuning, prev: i64, seq: i64) {
    RankStatus::bump(&rank.status.gaps);
    let missed = u64::try_from(seq - prev - 1).unwrap_or(u64::MAX);
    if rank.dropped.swap(false, Ordering::AcqRel) {
        debug!(worker = %rank.worker, rank = rank.rank, missed, "KV events: gap from dropped batches; not replayed");
        return;
    }
    let Some(endpoint) = rank.replay.as_deref() else {
        info!(worker = %rank.worker, rank = rank.rank, missed, "KV events: sequence gap and no replay endpoint; rank untrusted until a restart or cache flush");
        return;
    };
    if missed > tuning.max_replay {
        info!(worker = %rank.worker, rank = rank.rank, missed, "KV events: gap too long to replay; rank untrusted until a restart or cache flush");
        return;
    }
    match replay::fetch(endpoint, prev + 1, seq, tuning.replay_timeout).await {
        Ok(batches) => {
            // One short lock hold per batch, not one for the whole replay.
            let applied = batches.iter().all(|(s, b)| {
                rank.edit(|i| {
                    i.apply(&rank.worker, rank.rank, *s, b);
                })
            });
            if applied {
                RankStatus::bump(&rank.status.replayed);
                debug!(worker = %rank.worker, rank = rank.rank, missed, "KV events: gap replayed");
            }
        }
        Err(e) => {
            info!(worker = %rank.worker, rank = rank.rank, missed, error = %e, "KV events: replay failed; rank untrusted until a restart or cache flush");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sglang_envoy_kv_events::{EventBatch, IndexLimits, Untrusted};

    fn rank() -> Rank {
        Rank {
            worker: "http://w:1".into(),
            rank: 0,
            endpoint: "tcp://w:5557".into(),
            replay: None,
            topic: String::new(),
            index: Arc::new(RwLock::new(KvIndex::new(IndexLimits::default()))),
            alive: Arc::new(AtomicBool::new(true)),
            status: Arc::new(RankStatus::new(0)),
            dropped: Arc::new(AtomicBool::new(false)),
        }
    }

    fn empty() -> EventBatch {
        EventBatch {
            ts: 0.0,
            events: vec![],
            attn_dp_rank: None,
        }
    }

    #[test]
    fn a_drop_distrusts_the_rank_without_moving_its_sequence() {
        let r = rank();
        r.edit(|i| {
            i.apply(&r.worker, 0, 3, &empty());
        });
        r.distrust();
        assert_eq!(
            r.index.read().untrusted(r.worker.as_str(), 0),
            Some(Untrusted::UnknownEvent)
        );
        // The next seq is in order (not a gap or restart), and does not
        // trust the rank again...
        let out = r.index.write().apply(&r.worker, 0, 4, &empty());
        assert_eq!(out.seq, sglang_envoy_kv_events::SeqStatus::InOrder);
        assert!(out.untrusted.is_some());
        // ...a cache flush does.
        r.edit(|i| i.apply_events(&r.worker, 0, &[KvEvent::AllBlocksCleared]));
        assert_eq!(r.index.read().untrusted(r.worker.as_str(), 0), None);
    }

    #[test]
    fn nothing_is_applied_for_a_removed_worker() {
        let r = rank();
        r.alive.store(false, Ordering::Release);
        assert!(!r.edit(|i| {
            i.apply(&r.worker, 0, 0, &empty());
        }));
        assert!(r.index.read().match_all(&[]).is_empty());
    }
}
