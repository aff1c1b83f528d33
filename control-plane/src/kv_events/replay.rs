//! Asking a publisher's replay ROUTER for batches missed in a gap.
//!
//! The layout is the kv-events crate's ([`sglang_envoy_kv_events::frame`]):
//! a DEALER sends the empty delimiter a REQ socket would add, then the
//! 8-byte start sequence; the publisher answers with every buffered batch
//! from there on, one message each, then an end marker. A DEALER rather
//! than a REQ: REQ takes exactly one reply per request, and the replay
//! sends many.

use std::time::Duration;

use sglang_envoy_kv_events::frame::{parse_replay_reply, replay_request, ReplayReply};
use sglang_envoy_kv_events::{decode_batch, DecodeError, EventBatch, FrameError};
use zeromq::{DealerSocket, Socket, SocketOptions, SocketRecv, SocketSend, ZmqError, ZmqMessage};

/// Why a gap could not be filled.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Connecting, sending or receiving failed.
    #[error("replay transport: {0}")]
    Transport(#[from] ZmqError),
    /// The whole exchange took longer than allowed.
    #[error("replay timed out after {0:?}")]
    Timeout(Duration),
    /// A reply was not a replay frame set.
    #[error("replay reply: {0}")]
    Frame(#[from] FrameError),
    /// A replayed batch did not decode.
    #[error("replayed batch: {0}")]
    Decode(#[from] DecodeError),
    /// The publisher no longer holds every batch of the gap (its ring
    /// buffer moved on, or it restarted).
    #[error("replay covers {got} of the {wanted} missed batches")]
    Incomplete {
        /// Batches received in order from the start.
        got: u64,
        /// Batches missed.
        wanted: u64,
    },
}

/// The batches `from..until` (sequence numbers, `until` excluded) from the
/// replay endpoint, in order, all or nothing, within `timeout`.
pub async fn fetch(
    endpoint: &str,
    from: i64,
    until: i64,
    timeout: Duration,
) -> Result<Vec<(i64, EventBatch)>, ReplayError> {
    match tokio::time::timeout(timeout, exchange(endpoint, from, until, timeout)).await {
        Ok(r) => r,
        Err(_) => Err(ReplayError::Timeout(timeout)),
    }
}

async fn exchange(
    endpoint: &str,
    from: i64,
    until: i64,
    timeout: Duration,
) -> Result<Vec<(i64, EventBatch)>, ReplayError> {
    let wanted = u64::try_from(until.saturating_sub(from)).unwrap_or(0);
    let start = u64::try_from(from).unwrap_or(0);
    let mut options = SocketOptions::default();
    options.connect_timeout(timeout);
    let mut socket = DealerSocket::with_options(options);
    socket.connect(endpoint).await?;
    let mut request = ZmqMessage::from(Vec::<u8>::new());
    request.push_back(replay_request(start).to_vec().into());
    socket.send(request).await?;
    let mut got = Vec::new();
    let mut next = from;
    loop {
        let reply = socket.recv().await?.into_vec();
        // The DEALER sees the ROUTER's empty delimiter first.
        let frames = match reply.split_first() {
            Some((first, rest)) if first.is_empty() => rest,
            _ => &reply[..],
        };
        match parse_replay_reply(frames)? {
            ReplayReply::End => break,
            ReplayReply::Batch { seq, payload } => {
                if seq < next {
                    // Older than wanted (a replay starts at or after the
                    // request's start; tolerate one that does not).
                    continue;
                }
                if seq > next {
                    // A hole inside the replay: the gap cannot be closed.
                    break;
                }
                got.push((seq, decode_batch(payload)?));
                next += 1;
                if next >= until {
                    // Everything missed is here; the rest of the replay
                    // repeats live messages, and dropping the socket ends it.
                    break;
                }
            }
        }
    }
    if next < until {
        return Err(ReplayError::Incomplete {
            got: got.len() as u64,
            wanted,
        });
    }
    Ok(got)
}
