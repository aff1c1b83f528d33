//! One DP rank's KV-event publisher: a ZMQ PUB socket sending
//! `[topic, seq, batch]`, and a replay ROUTER answering a start seq with
//! the buffered batches, as SGLang's `ZmqEventPublisher` does (0.5.23
//! `srt/disaggregation/kv_events.py`; frame layouts in the kv-events
//! crate's `frame` module).
//!
//! Sequence numbers are assigned, and batches buffered for replay, under
//! one lock at the moment of publishing, so they follow the order in which
//! the cache changed; the sockets' I/O runs in background tasks, off the
//! request path.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use sglang_envoy_kv_events::frame::{
    parse_replay_request, replay_reply_frames, seq_bytes, ReplayLayout, ReplayReply,
};
use tokio::sync::mpsc;
use zeromq::{Endpoint, PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// A publisher that could not start.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Binding a socket failed (port taken, bad address).
    #[error("cannot bind the KV-event {what} socket of DP rank {rank} on {address}: {source}")]
    Bind {
        /// `PUB` or `replay ROUTER`.
        what: &'static str,
        /// The DP rank.
        rank: usize,
        /// The address tried.
        address: String,
        /// The zeromq error.
        source: zeromq::ZmqError,
    },
    /// Rank `rank`'s port (base + rank) is past 65535.
    #[error("KV-event port {base} + DP rank {rank} is past 65535")]
    PortRange {
        /// Rank 0's port.
        base: u16,
        /// The DP rank.
        rank: usize,
    },
}

/// A rank publisher's counters, for `/_sim/kv_events`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PublisherStatus {
    /// The DP rank.
    pub dp_rank: usize,
    /// Port of the PUB socket.
    pub endpoint_port: u16,
    /// Port of the replay ROUTER, if any.
    pub replay_endpoint_port: Option<u16>,
    /// The seq the next batch gets.
    pub next_seq: i64,
    /// Batches held for replay.
    pub buffered: usize,
    /// Batches still to be withheld from the PUB socket (test hook).
    pub drop_next: u64,
    /// Batches withheld so far.
    pub dropped: u64,
}

/// Sequence state and replay buffer.
#[derive(Debug)]
struct Ring {
    next_seq: i64,
    drop_next: u64,
    dropped: u64,
    capacity: usize,
    buffer: VecDeque<(i64, Vec<u8>)>,
}

/// The publisher of one DP rank.
#[derive(Debug)]
pub struct RankPublisher {
    rank: usize,
    topic: Vec<u8>,
    ring: Arc<Mutex<Ring>>,
    live: mpsc::UnboundedSender<ZmqMessage>,
    pub_port: u16,
    replay_port: Option<u16>,
}

fn tcp_port(endpoint: &Endpoint) -> u16 {
    match endpoint {
        Endpoint::Tcp(_, port) => *port,
        // Only tcp:// addresses are ever bound here.
        _ => 0,
    }
}

/// Multipart message from frames (the zeromq crate wants one frame first).
fn message(frames: Vec<Vec<u8>>) -> Option<ZmqMessage> {
    let mut frames = frames.into_iter();
    let mut m = ZmqMessage::from(frames.next()?);
    for f in frames {
        m.push_back(f.into());
    }
    Some(m)
}

impl RankPublisher {
    /// Binds rank `rank`'s PUB socket on `pub_address` and, if given, its
    /// replay ROUTER on `replay_address`, and starts their tasks.
    pub async fn bind(
        rank: usize,
        topic: &str,
        buffer_steps: usize,
        pub_address: &str,
        replay_address: Option<&str>,
    ) -> Result<RankPublisher, PublishError> {
        let mut pub_socket = PubSocket::new();
        let bound = pub_socket
            .bind(pub_address)
            .await
            .map_err(|source| PublishError::Bind {
                what: "PUB",
                rank,
                address: pub_address.into(),
                source,
            })?;
        let pub_port = tcp_port(&bound);
        let ring = Arc::new(Mutex::new(Ring {
            next_seq: 0,
            drop_next: 0,
            dropped: 0,
            capacity: buffer_steps,
            buffer: VecDeque::new(),
        }));
        let topic = topic.as_bytes().to_vec();
        let mut replay_port = None;
        if let Some(address) = replay_address {
            let mut router = RouterSocket::new();
            let bound = router
                .bind(address)
                .await
                .map_err(|source| PublishError::Bind {
                    what: "replay ROUTER",
                    rank,
                    address: address.into(),
                    source,
                })?;
            replay_port = Some(tcp_port(&bound));
            tokio::spawn(serve_replay(rank, router, Arc::clone(&ring), topic.clone()));
        }
        let (live, rx) = mpsc::unbounded_channel();
        tokio::spawn(send_live(rank, pub_socket, rx));
        tracing::info!(rank, pub_port, ?replay_port, "KV-event publisher bound");
        Ok(RankPublisher {
            rank,
            topic,
            ring,
            live,
            pub_port,
            replay_port,
        })
    }

    /// Port of the PUB socket.
    pub fn pub_port(&self) -> u16 {
        self.pub_port
    }

    /// Port of the replay ROUTER, if any.
    pub fn replay_port(&self) -> Option<u16> {
        self.replay_port
    }

    /// Publishes one msgpack batch: gives it the next seq, keeps it for
    /// replay, and sends it unless the drop hook withholds it. Returns its seq.
    pub fn publish(&self, payload: Vec<u8>) -> i64 {
        let mut ring = self.ring.lock();
        let seq = ring.next_seq;
        ring.next_seq += 1;
        let frames = (ring.drop_next == 0)
            .then(|| vec![self.topic.clone(), seq_bytes(seq).to_vec(), payload.clone()]);
        if ring.capacity > 0 {
            if ring.buffer.len() == ring.capacity {
                ring.buffer.pop_front();
            }
            ring.buffer.push_back((seq, payload));
        }
        match frames.and_then(message) {
            // Sent while locked, so the channel keeps seq order.
            Some(m) => {
                if self.live.send(m).is_err() {
                    tracing::warn!(rank = self.rank, seq, "KV-event PUB task is gone");
                }
            }
            None => {
                ring.drop_next -= 1;
                ring.dropped += 1;
                tracing::debug!(rank = self.rank, seq, "KV-event batch withheld (test hook)");
            }
        }
        seq
    }

    /// Withholds the next `n` batches from the PUB socket; they still get
    /// their seq and stay replayable, so subscribers see a gap.
    pub fn drop_next(&self, n: u64) {
        self.ring.lock().drop_next = n;
    }

    /// As after a process restart: the next batch is seq 0, the replay
    /// buffer is empty, nothing is being withheld.
    pub fn restart(&self) {
        let mut ring = self.ring.lock();
        ring.next_seq = 0;
        ring.drop_next = 0;
        ring.buffer.clear();
    }

    /// Current counters.
    pub fn status(&self) -> PublisherStatus {
        let ring = self.ring.lock();
        PublisherStatus {
            dp_rank: self.rank,
            endpoint_port: self.pub_port,
            replay_endpoint_port: self.replay_port,
            next_seq: ring.next_seq,
            buffered: ring.buffer.len(),
            drop_next: ring.drop_next,
            dropped: ring.dropped,
        }
    }
}

/// Sends live messages until every sender is gone.
async fn send_live(
    rank: usize,
    mut socket: PubSocket,
    mut rx: mpsc::UnboundedReceiver<ZmqMessage>,
) {
    while let Some(m) = rx.recv().await {
        if let Err(e) = socket.send(m).await {
            tracing::warn!(rank, error = %e, "KV-event PUB send failed");
        }
    }
}

/// Answers replay requests: `[client, "", start]` in, then every buffered
/// batch with seq >= start and the end marker, in 0.5.23's layout
/// (`[topic, seq, payload]`, end `[b"", -1, b""]`) after `[client, ""]`.
async fn serve_replay(
    rank: usize,
    mut router: RouterSocket,
    ring: Arc<Mutex<Ring>>,
    topic: Vec<u8>,
) {
    loop {
        let frames = match router.recv().await {
            Ok(m) => m.into_vec(),
            Err(e) => {
                tracing::warn!(rank, error = %e, "KV-event replay receive failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let request = match parse_replay_request(&frames) {
            Ok(r) => r,
            Err(e) => {
                // SGLang logs and ignores malformed requests too.
                tracing::warn!(rank, error = %e, "invalid KV-event replay request");
                continue;
            }
        };
        let client = request.client_id.to_vec();
        let start = i64::try_from(request.start_seq).unwrap_or(i64::MAX);
        let batches: Vec<(i64, Vec<u8>)> = ring
            .lock()
            .buffer
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        tracing::debug!(
            rank,
            start,
            batches = batches.len(),
            "serving KV-event replay"
        );
        let replies = batches
            .iter()
            .map(|(seq, payload)| ReplayReply::Batch { seq: *seq, payload })
            .chain(std::iter::once(ReplayReply::End));
        for reply in replies {
            let mut frames = vec![client.clone(), Vec::new()];
            frames.extend(replay_reply_frames(reply, &topic, ReplayLayout::WithTopic));
            let Some(m) = message(frames) else { continue };
            if let Err(e) = router.send(m).await {
                tracing::warn!(rank, error = %e, "KV-event replay send failed");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn publisher(buffer: usize) -> RankPublisher {
        RankPublisher::bind(
            0,
            "t",
            buffer,
            "tcp://127.0.0.1:0",
            Some("tcp://127.0.0.1:0"),
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn seqs_count_from_zero_and_restart() {
        let p = publisher(2).await;
        assert_ne!(p.pub_port(), 0);
        assert!(p.replay_port().is_some_and(|port| port != 0));
        assert_eq!(p.publish(vec![1]), 0);
        assert_eq!(p.publish(vec![2]), 1);
        assert_eq!(p.publish(vec![3]), 2);
        let s = p.status();
        // The buffer keeps the last `buffer_steps` batches only.
        assert_eq!((s.next_seq, s.buffered), (3, 2));
        assert_eq!(
            p.ring.lock().buffer.iter().map(|b| b.0).collect::<Vec<_>>(),
            vec![1, 2]
        );
        p.drop_next(5);
        p.restart();
        let s = p.status();
        assert_eq!((s.next_seq, s.buffered, s.drop_next), (0, 0, 0));
        assert_eq!(p.publish(vec![4]), 0);
    }

    #[tokio::test]
    async fn dropped_batches_are_counted_and_kept_for_replay() {
        let p = publisher(10).await;
        p.drop_next(2);
        for i in 0..3 {
            p.publish(vec![i]);
        }
        let s = p.status();
        assert_eq!((s.drop_next, s.dropped, s.buffered), (0, 2, 3));
    }

    #[tokio::test]
    async fn zero_buffer_steps_keeps_nothing() {
        let p = publisher(0).await;
        p.publish(vec![1]);
        assert_eq!(p.status().buffered, 0);
    }

    #[tokio::test]
    async fn taken_port_is_a_bind_error() {
        let p = publisher(1).await;
        let taken = format!("tcp://127.0.0.1:{}", p.pub_port());
        let err = RankPublisher::bind(1, "", 1, &taken, None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("DP rank 1"), "{err}");
    }
}
