//! The approximate radix trees shared by several control planes through the
//! fleet store (`--fleet-store-url`, unless `--disable-shared-tree`).
//!
//! Each replica routes a share of the traffic, and its tree records only
//! the prompts it sent itself: without sharing, a prompt family whose
//! earlier requests went through another replica looks new here, and may
//! be sent to a cold worker. So every decision a tree-keeping policy makes
//! is also written to a Redis stream `{prefix}:tree` (the unit's URL and
//! the routing text), and every replica inserts the others' entries into
//! its own tree, as if it had made those choices.
//!
//! Bounded everywhere, and out of the decisions' way:
//! - the request path hands a decision to a queue of [`QUEUE`] entries and
//!   never waits; when the queue is full the insert is dropped (counted);
//! - a text is cut to [`MAX_TEXT`] bytes (a prefix still matches its
//!   prompt family; only matches past that length are lost);
//! - the stream keeps about [`STREAM_LEN`] entries (`XADD MAXLEN ~`), so
//!   Redis holds at most about `STREAM_LEN × MAX_TEXT` bytes of it;
//! - each replica reads at most [`READ_COUNT`] entries a round, and reads
//!   the next only once those are applied;
//! - the others' inserts are applied on the runtime that decides (the
//!   gRPC port's thread), [`APPLY_CHUNK`] at a time between questions.
//!   Applied from another thread, they made every decision 20-30% slower:
//!   the nodes' locks and last-use times of the hot prefixes moved between
//!   cores (docs/benchmarks.md, `decision_shared_tree`).
//!
//! A replica started (or restarted) reads the stream from its start: the
//! recent choices of the others warm its trees. While the store is down,
//! inserts are dropped and each tree learns only its own replica's
//! choices, as with a single control plane; nothing waits for the store.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::store_link::StoreError;
use crate::store_stream::StoreStream;

/// Decisions waiting to be written; more are dropped.
pub const QUEUE: usize = 1024;
/// Longest routing text shared, in bytes.
pub const MAX_TEXT: usize = 32 * 1024;
/// Entries the stream keeps (approximately: Redis trims whole nodes).
pub const STREAM_LEN: usize = 1024;
/// Most entries read in one round.
pub const READ_COUNT: usize = 1024;
/// How often a replica writes its decisions and reads the others'.
const ROUND: Duration = Duration::from_millis(50);
/// The others' inserts applied in one go on the deciding thread. An insert
/// takes 1.5 us at 4 KB and 3.6 us at 32 KB (docs/benchmarks.md,
/// `tree/insert`): a question that arrives meanwhile waits at most about
/// 60 us.
pub const APPLY_CHUNK: usize = 16;

/// What the others' inserts are taught to: the engine's trees
/// ([`crate::engine::Engine`] implements it).
pub trait Learner: Send + Sync {
    /// Another control plane sent `text` to the unit named `unit`; `false`
    /// when no such unit is registered here.
    fn learn_shared(&self, unit: &str, text: &[u8]) -> bool;
    /// Where the shared inserts are counted.
    fn metrics(&self) -> &Metrics;
}

/// One decision to tell the other replicas.
#[derive(Debug)]
struct Insert {
    unit: String,
    text: Vec<u8>,
}

/// The request path's side: hands decisions to [`TreeSync`] without
/// waiting.
pub struct TreeOutbox {
    tx: mpsc::Sender<Insert>,
}

impl TreeOutbox {
    /// Queues "`text` was sent to `unit`" for the other replicas (cut to
    /// [`MAX_TEXT`]); `false` when the queue is full and it was dropped.
    pub fn record(&self, unit: &str, mut text: Vec<u8>) -> bool {
        text.truncate(MAX_TEXT);
        self.tx
            .try_send(Insert {
                unit: unit.to_string(),
                text,
            })
            .is_ok()
    }
}

/// The task that writes this replica's decisions to the stream and reads
/// the others'.
pub struct TreeSync {
    /// `{prefix}:tree`, this process's entries marked with its replica id
    /// ([`crate::store_link::draw_replica_id`]).
    stream: StoreStream,
    rx: mpsc::Receiver<Insert>,
}

/// Both sides of the shared tree on the store at `url`, keys under
/// `prefix` (the fleet store's), this process's entries marked `replica`.
pub fn shared_tree(
    url: &str,
    prefix: &str,
    replica: &str,
) -> Result<(TreeOutbox, TreeSync), redis::RedisError> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let sync = TreeSync {
        stream: StoreStream::new(url, format!("{prefix}:tree"), replica)?,
        rx,
    };
    Ok((TreeOutbox { tx }, sync))
}

impl TreeSync {
    /// Takes the queued inserts without writing them anywhere; how many.
    /// For a bench of the request path alone, which must keep the queue
    /// from filling (a full queue drops inserts, which costs less).
    pub fn discard_queued(&mut self) -> usize {
        let mut n = 0;
        while self.rx.try_recv().is_ok() {
            n += 1;
        }
        n
    }

    /// Teaches `learner` the queued inserts, as if another replica had
    /// made them, without the store; how many. For a bench of what
    /// applying the others' inserts does to the request path.
    pub fn apply_queued(&mut self, learner: &dyn Learner) -> usize {
        let mut n = 0;
        while let Ok(insert) = self.rx.try_recv() {
            n += usize::from(learner.learn_shared(&insert.unit, &insert.text));
        }
        n
    }

    /// Shares `engine`'s tree inserts for as long as the process runs,
    /// applying the others' on `apply_on` (the runtime that decides).
    pub async fn run(mut self, engine: Arc<dyn Learner>, apply_on: Handle) {
        let mut batch = Vec::with_capacity(QUEUE);
        loop {
            tokio::time::sleep(ROUND).await;
            while let Ok(insert) = self.rx.try_recv() {
                batch.push(insert);
            }
            let result = self.round(&mut batch, &engine, &apply_on).await;
            // What a failed round did not write is not kept: while the
            // store is down the queue would only fill with stale ones.
            engine.metrics().shared_tree("dropped", batch.len() as u64);
            batch.clear();
            self.stream.link.report(
                &result,
                "the approximate trees are shared",
                "each tree learns only this replica's choices",
            );
        }
    }

    /// One exchange: write `batch` (emptied once written), then read what
    /// the others wrote since the last round and apply it on `apply_on`.
    /// The next round waits for that: at most one round's reading
    /// ([`READ_COUNT`] entries) is held at a time.
    async fn round(
        &mut self,
        batch: &mut Vec<Insert>,
        engine: &Arc<dyn Learner>,
        apply_on: &Handle,
    ) -> Result<(), StoreError> {
        let mut conn = self.stream.conn().await?;
        let metrics = engine.metrics();
        if !batch.is_empty() {
            let entries = batch
                .iter()
                .map(|insert| vec![("w", insert.unit.as_bytes()), ("t", insert.text.as_slice())]);
            self.stream.append(&mut conn, entries, STREAM_LEN).await?;
            metrics.shared_tree("sent", batch.len() as u64);
            batch.clear();
        }
        let mut theirs = Vec::new();
        for entry in self.stream.read_others(&mut conn, READ_COUNT).await? {
            let (Some(unit), Some(mut text)) =
                (entry.get::<String>("w"), entry.get::<Vec<u8>>("t"))
            else {
                continue;
            };
            text.truncate(MAX_TEXT);
            theirs.push(Insert { unit, text });
        }
        if !theirs.is_empty() {
            let learned = apply_on
                .spawn(apply(engine.clone(), theirs))
                .await
                .unwrap_or(0);
            metrics.shared_tree("received", learned);
        }
        Ok(())
    }
}

/// Teaches `learner` the others' `inserts` on the thread this runs on,
/// [`APPLY_CHUNK`] at a time, letting that thread's other tasks (the
/// questions waiting) run between chunks; how many it learned.
async fn apply(learner: Arc<dyn Learner>, inserts: Vec<Insert>) -> u64 {
    let mut learned = 0;
    for chunk in inserts.chunks(APPLY_CHUNK) {
        for insert in chunk {
            learned += u64::from(learner.learn_shared(&insert.unit, &insert.text));
        }
        tokio::task::yield_now().await;
    }
    learned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outbox_cuts_long_texts_and_drops_when_full() {
        let (outbox, mut sync) = shared_tree("redis://127.0.0.1:1/0", "t", "r").unwrap();
        assert!(outbox.record("http://w:1", vec![b'a'; MAX_TEXT * 2]));
        let first = sync.rx.try_recv().unwrap();
        assert_eq!(
            (first.unit.as_str(), first.text.len()),
            ("http://w:1", MAX_TEXT)
        );
        for _ in 0..QUEUE {
            assert!(outbox.record("http://w:1", b"x".to_vec()));
        }
        assert!(
            !outbox.record("http://w:1", b"x".to_vec()),
            "the queue is bounded"
        );
    }
}
