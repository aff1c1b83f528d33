//! Ends that reached the wrong replica, passed on to the others through the
//! fleet store (`--fleet-store-url`, unless `--disable-shared-loads`).
//!
//! A request's load is counted by the replica that answered its question,
//! and released when its end is reported. A filter sends both on its
//! session stream, to one replica, but a question or an end that goes as a
//! gRPC call (a VM's first requests, before its session is up; a session
//! backing off; questions over the filter's `session_question_max_bytes`)
//! reaches whichever replica Envoy picks. An end that reaches another
//! replica than its question did finds no ticket there, and the load stayed
//! counted on the first until `--request-timeout-secs` reaped it (30
//! minutes by default), pushing the load-aware policies off that worker.
//!
//! So an end for a ticket a replica does not know is written to a Redis
//! stream `{prefix}:ends`, and every replica takes the others' entries as
//! ends of its own (once each: an end unknown there too goes no further).
//! Unknown ends are few (a ticket's end normally follows its question on
//! one stream), and bounded everywhere: a queue of [`QUEUE`] on the request
//! path that never waits, a stream of about [`STREAM_LEN`] entries, and at
//! most [`READ_COUNT`] read a round. While the store is down they are
//! dropped, as before this existed: the reaper releases them.

use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use sglang_envoy_proto::Completion;
use tokio::sync::mpsc;
use tracing::debug;

use crate::store_link::StoreError;
use crate::store_stream::StoreStream;

/// Ends waiting to be written; more are dropped.
pub const QUEUE: usize = 1024;
/// Entries the stream keeps (approximately: Redis trims whole nodes).
pub const STREAM_LEN: usize = 4096;
/// Most entries read in one round.
pub const READ_COUNT: usize = 1024;
/// How often a replica writes the ends it did not know and reads the others'.
const ROUND: Duration = Duration::from_millis(50);

/// What the others' ends are handed to: the engine
/// ([`crate::engine::Engine`] implements it).
pub trait EndTaker: Send + Sync {
    /// Another replica was told of this end and did not know its ticket.
    fn take_forwarded(&self, end: &Completion);
}

/// The request path's side: hands unknown ends to [`EndsSync`] without
/// waiting.
pub struct EndsOutbox {
    tx: mpsc::Sender<Completion>,
}

impl EndsOutbox {
    /// Queues `end` for the other replicas; `false` when the queue is full
    /// and it was dropped.
    pub fn forward(&self, end: &Completion) -> bool {
        self.tx.try_send(end.clone()).is_ok()
    }
}

/// The task that writes this replica's unknown ends to the stream and
/// takes the others'.
pub struct EndsSync {
    /// `{prefix}:ends`, read from its start: a replica that starts holds
    /// no tickets, so old entries change nothing there.
    stream: StoreStream,
    rx: mpsc::Receiver<Completion>,
}

/// Both sides of the shared ends on the store at `url`, keys under
/// `prefix`, this process's entries marked `replica`.
pub fn shared_ends(
    url: &str,
    prefix: &str,
    replica: &str,
) -> Result<(EndsOutbox, EndsSync), redis::RedisError> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let sync = EndsSync {
        stream: StoreStream::new(url, format!("{prefix}:ends"), replica)?,
        rx,
    };
    Ok((EndsOutbox { tx }, sync))
}

impl EndsSync {
    /// Passes ends on for as long as the process runs.
    pub async fn run(mut self, taker: Arc<dyn EndTaker>) {
        let mut batch = Vec::with_capacity(QUEUE);
        loop {
            tokio::time::sleep(ROUND).await;
            while let Ok(end) = self.rx.try_recv() {
                batch.push(end);
            }
            let result = self.round(&batch, taker.as_ref()).await;
            // A failed round's ends are not kept: the reaper has them.
            batch.clear();
            self.stream.link.report(
                &result,
                "ends this replica does not know reach the others",
                "such ends are released by the reaper",
            );
        }
    }

    /// One exchange: write `batch`, then read what the others wrote since
    /// the last round and hand it to `taker`.
    async fn round(
        &mut self,
        batch: &[Completion],
        taker: &dyn EndTaker,
    ) -> Result<(), StoreError> {
        let mut conn = self.stream.conn().await?;
        if !batch.is_empty() {
            let encoded: Vec<Vec<u8>> = batch.iter().map(|end| end.encode_to_vec()).collect();
            let entries = encoded.iter().map(|e| vec![("e", e.as_slice())]);
            self.stream.append(&mut conn, entries, STREAM_LEN).await?;
            debug!(
                ends = batch.len(),
                "passed on ends of tickets not known here"
            );
        }
        for entry in self.stream.read_others(&mut conn, READ_COUNT).await? {
            let Some(bytes) = entry.get::<Vec<u8>>("e") else {
                continue;
            };
            if let Ok(end) = Completion::decode(bytes.as_slice()) {
                taker.take_forwarded(&end);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outbox_drops_when_full() {
        let (outbox, mut sync) = shared_ends("redis://127.0.0.1:1/0", "t", "r").unwrap();
        let end = Completion {
            ticket: 7,
            ..Default::default()
        };
        for _ in 0..QUEUE {
            assert!(outbox.forward(&end));
        }
        assert!(!outbox.forward(&end), "the queue is bounded");
        assert_eq!(sync.rx.try_recv().map(|e| e.ticket).ok(), Some(7));
    }
}
