//! ZMQ multipart layouts of SGLang's `ZmqEventPublisher`
//! (`sglang/srt/disaggregation/kv_events.py`, read in 0.5.10, 0.5.18, 0.5.23).
//!
//! **Live PUB messages**: `[topic, seq, payload]`. `topic` is the configured
//! topic's UTF-8 (default empty), `seq` comes from `itertools.count()` per
//! publisher (so from 0, +1 per batch, back to 0 when the process restarts)
//! written as `seq.to_bytes(8, "big")`: 8 bytes big-endian, never negative.
//! `payload` is the msgpack batch ([`crate::decode_batch`]).
//!
//! **Replay** (ROUTER at `replay_endpoint`, port offset by the DP rank like
//! the PUB one): the publisher reads `[client_id, b"", start]`, so a client
//! uses a REQ socket (which adds the empty delimiter) or a DEALER that sends
//! the empty frame itself, and `start` is parsed by `int.from_bytes(start,
//! "big")` (unsigned, any length; send 8 bytes). It then sends every batch
//! still in its ring buffer (`buffer_steps`, default 10 000) whose seq is
//! `>= start`, and an end marker whose seq is `(-1).to_bytes(8, "big",
//! signed=True)`, i.e. eight `0xff` bytes. After the ROUTER's identity and
//! the delimiter are stripped, the client sees:
//!
//! | release | batch reply | end marker |
//! |---|---|---|
//! | 0.5.18 and before (read in 0.5.10, 0.5.18) | `[seq, payload]` | `[-1, b""]` |
//! | 0.5.23 | `[topic, seq, payload]` | `[b"", -1, b""]` |
//!
//! [`parse_replay_reply`] accepts both.

use crate::error::FrameError;

/// The end-of-replay sequence number.
pub const REPLAY_END_SEQ: i64 = -1;

/// A live message, borrowed from its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PubMessage<'a> {
    /// The topic frame.
    pub topic: &'a [u8],
    /// The publisher's sequence number of this batch.
    pub seq: i64,
    /// The msgpack batch.
    pub payload: &'a [u8],
}

fn seq_from(frame: &[u8]) -> Result<i64, FrameError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| FrameError::SeqLength { len: frame.len() })?;
    Ok(i64::from_be_bytes(bytes))
}

/// The 8-byte big-endian form of a sequence number.
pub fn seq_bytes(seq: i64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// Split a live PUB message into its parts.
pub fn parse_pub_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<PubMessage<'_>, FrameError> {
    let [topic, seq, payload] = frames else {
        return Err(FrameError::FrameCount {
            expected: "3",
            got: frames.len(),
        });
    };
    let seq = seq_from(seq.as_ref())?;
    if seq < 0 {
        return Err(FrameError::NegativeSeq { seq });
    }
    Ok(PubMessage {
        topic: topic.as_ref(),
        seq,
        payload: payload.as_ref(),
    })
}

/// The frames of a live PUB message, as the publisher sends them.
pub fn pub_frames(topic: &[u8], seq: i64, payload: &[u8]) -> [Vec<u8>; 3] {
    [topic.to_vec(), seq_bytes(seq).to_vec(), payload.to_vec()]
}

/// The request frame a replay client sends (after REQ's implicit empty
/// delimiter): the first sequence number it wants.
pub fn replay_request(start_seq: u64) -> [u8; 8] {
    start_seq.to_be_bytes()
}

/// A replay request as the publisher's ROUTER receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayRequest<'a> {
    /// The ROUTER identity frame, to address the replies.
    pub client_id: &'a [u8],
    /// First sequence number wanted.
    pub start_seq: u64,
}

/// Parse `[client_id, b"", start]` as SGLang's publisher does: any message
/// of another length is refused, the middle frame is not checked, and
/// `start` is an unsigned big-endian integer of up to 8 bytes.
pub fn parse_replay_request<F: AsRef<[u8]>>(frames: &[F]) -> Result<ReplayRequest<'_>, FrameError> {
    let [client_id, _delimiter, start] = frames else {
        return Err(FrameError::FrameCount {
            expected: "3",
            got: frames.len(),
        });
    };
    let start = start.as_ref();
    if start.len() > 8 {
        return Err(FrameError::ReplayStartLength { len: start.len() });
    }
    let start_seq = start.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    Ok(ReplayRequest {
        client_id: client_id.as_ref(),
        start_seq,
    })
}

/// Which replay reply layout to write (see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplayLayout {
    /// SGLang 0.5.23: replies carry the topic like live messages.
    #[default]
    WithTopic,
    /// SGLang 0.5.18 and before: `[seq, payload]`.
    SeqPayload,
}

/// One reply as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayReply<'a> {
    /// A buffered batch.
    Batch {
        /// Its sequence number.
        seq: i64,
        /// Its msgpack payload.
        payload: &'a [u8],
    },
    /// No more batches follow.
    End,
}

/// Parse a reply in either layout.
pub fn parse_replay_reply<F: AsRef<[u8]>>(frames: &[F]) -> Result<ReplayReply<'_>, FrameError> {
    let (seq, payload) = match frames {
        [_, seq, payload] | [seq, payload] => (seq.as_ref(), payload.as_ref()),
        _ => {
            return Err(FrameError::FrameCount {
                expected: "2 or 3",
                got: frames.len(),
            })
        }
    };
    let seq = seq_from(seq)?;
    if seq == REPLAY_END_SEQ {
        if !payload.is_empty() {
            return Err(FrameError::EndMarkerPayload { len: payload.len() });
        }
        return Ok(ReplayReply::End);
    }
    if seq < 0 {
        return Err(FrameError::NegativeSeq { seq });
    }
    Ok(ReplayReply::Batch { seq, payload })
}

/// The frames a publisher sends for one reply (without the ROUTER identity
/// and empty delimiter, which the transport adds).
pub fn replay_reply_frames(
    reply: ReplayReply<'_>,
    topic: &[u8],
    layout: ReplayLayout,
) -> Vec<Vec<u8>> {
    let (topic, seq, payload): (&[u8], i64, &[u8]) = match reply {
        ReplayReply::Batch { seq, payload } => (topic, seq, payload),
        // 0.5.23 sends an empty topic on the end marker.
        ReplayReply::End => (&[], REPLAY_END_SEQ, &[]),
    };
    let mut out = Vec::with_capacity(3);
    if layout == ReplayLayout::WithTopic {
        out.push(topic.to_vec());
    }
    out.push(seq_bytes(seq).to_vec());
    out.push(payload.to_vec());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pub_message_round_trips_and_checks_seq() {
        let frames = pub_frames(b"kv", 258, b"\x93");
        assert_eq!(frames[1], vec![0, 0, 0, 0, 0, 0, 1, 2]);
        let m = parse_pub_message(&frames).unwrap();
        assert_eq!((m.topic, m.seq, m.payload), (&b"kv"[..], 258, &b"\x93"[..]));
        let short: [&[u8]; 3] = [b"", &[0, 1], b""];
        assert_eq!(
            parse_pub_message(&short),
            Err(FrameError::SeqLength { len: 2 })
        );
        let neg: [&[u8]; 3] = [b"", &[0xff; 8], b""];
        assert_eq!(
            parse_pub_message(&neg),
            Err(FrameError::NegativeSeq { seq: -1 })
        );
        let two: [&[u8]; 2] = [b"", b""];
        assert!(matches!(
            parse_pub_message(&two),
            Err(FrameError::FrameCount { got: 2, .. })
        ));
    }

    #[test]
    fn replay_request_parses_like_int_from_bytes() {
        let req = replay_request(0x0102);
        assert_eq!(req, [0, 0, 0, 0, 0, 0, 1, 2]);
        let frames: [&[u8]; 3] = [b"id", b"", &req];
        let p = parse_replay_request(&frames).unwrap();
        assert_eq!((p.client_id, p.start_seq), (&b"id"[..], 0x0102));
        // Python's int.from_bytes accepts shorter frames; so do we.
        let short: [&[u8]; 3] = [b"id", b"", &[7]];
        assert_eq!(parse_replay_request(&short).unwrap().start_seq, 7);
        let long: [&[u8]; 3] = [b"id", b"", &[0; 9]];
        assert_eq!(
            parse_replay_request(&long),
            Err(FrameError::ReplayStartLength { len: 9 })
        );
    }

    #[test]
    fn replay_replies_in_both_layouts() {
        for layout in [ReplayLayout::WithTopic, ReplayLayout::SeqPayload] {
            let f = replay_reply_frames(
                ReplayReply::Batch {
                    seq: 5,
                    payload: b"p",
                },
                b"t",
                layout,
            );
            assert_eq!(
                f.len(),
                if layout == ReplayLayout::WithTopic {
                    3
                } else {
                    2
                }
            );
            assert_eq!(
                parse_replay_reply(&f).unwrap(),
                ReplayReply::Batch {
                    seq: 5,
                    payload: b"p"
                }
            );
            let end = replay_reply_frames(ReplayReply::End, b"t", layout);
            assert_eq!(end.last().map(Vec::len), Some(0));
            assert_eq!(end[end.len() - 2], vec![0xff; 8]);
            assert_eq!(parse_replay_reply(&end).unwrap(), ReplayReply::End);
        }
        let bad_end: [&[u8]; 2] = [&[0xff; 8], b"x"];
        assert_eq!(
            parse_replay_reply(&bad_end),
            Err(FrameError::EndMarkerPayload { len: 1 })
        );
    }
}
