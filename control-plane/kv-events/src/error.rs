//! Errors. Everything this crate parses comes off the network, so every
//! malformed input is an error value, never a panic.

use thiserror::Error;

/// Why a msgpack payload could not be decoded into an [`crate::EventBatch`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The input ended in the middle of a value.
    #[error("payload truncated at byte {at}")]
    Truncated {
        /// Offset at which more bytes were needed.
        at: usize,
    },
    /// A value of another msgpack type stood where `expected` was needed.
    #[error("expected {expected} at byte {at}, found marker 0x{marker:02x}")]
    UnexpectedType {
        /// What the decoder wanted, in words.
        expected: &'static str,
        /// The msgpack marker byte found instead.
        marker: u8,
        /// Offset of that marker.
        at: usize,
    },
    /// An integer did not fit the field's range (e.g. a uint64 above
    /// `i64::MAX` for a block hash, or a negative token id).
    #[error("integer out of range for {field} at byte {at}")]
    IntOutOfRange {
        /// The field being decoded.
        field: &'static str,
        /// Offset of the integer.
        at: usize,
    },
    /// A string was not UTF-8.
    #[error("invalid UTF-8 in string at byte {at}")]
    InvalidUtf8 {
        /// Offset of the string's marker.
        at: usize,
    },
    /// An array had fewer elements than the struct's required fields.
    #[error("{what} has {len} elements, needs at least {min}")]
    TooShort {
        /// The struct being decoded.
        what: &'static str,
        /// Elements present.
        len: usize,
        /// Required elements.
        min: usize,
    },
    /// A map-encoded event lacked a required field.
    #[error("{event} is missing field {field}")]
    MissingField {
        /// The event's tag.
        event: &'static str,
        /// The missing key.
        field: &'static str,
    },
    /// `token_ids` mixed plain ids and bigram pairs, or had a pair that was
    /// not two elements long.
    #[error("token_ids at byte {at} are neither all ids nor all [id, id] pairs")]
    MixedTokens {
        /// Offset of the offending element.
        at: usize,
    },
    /// Bytes followed the batch; msgspec would reject them too.
    #[error("{extra} trailing bytes after the batch")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
}

/// Why a ZMQ multipart message is not a KV-event frame set.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    /// The message had another number of parts.
    #[error("expected {expected} frames, got {got}")]
    FrameCount {
        /// Parts expected (a list of alternatives is spelled out in `expected`).
        expected: &'static str,
        /// Parts received.
        got: usize,
    },
    /// A sequence-number frame was not 8 bytes.
    #[error("sequence frame has {len} bytes, expected 8")]
    SeqLength {
        /// Its length.
        len: usize,
    },
    /// A live PUB message carried a negative sequence number; SGLang's
    /// counter starts at 0 and only the replay end marker is negative.
    #[error("negative sequence number {seq} on a live message")]
    NegativeSeq {
        /// The value.
        seq: i64,
    },
    /// A replay request's start sequence did not fit in 8 bytes.
    #[error("replay start frame has {len} bytes, at most 8 fit an int64")]
    ReplayStartLength {
        /// Its length.
        len: usize,
    },
    /// The replay end marker carried a payload (SGLang sends it empty).
    #[error("replay end marker with a {len}-byte payload")]
    EndMarkerPayload {
        /// Payload length.
        len: usize,
    },
}

/// Why block hashes could not be computed for a token sequence.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HashError {
    /// SGLang refuses token ids above `i64::MAX` (its native hasher throws),
    /// so no event can carry a hash for them.
    #[error("token id {token} does not fit a non-negative int64")]
    TokenOutOfRange {
        /// The id.
        token: u64,
    },
    /// A page size of 0 cannot split tokens into pages.
    #[error("page size must be positive")]
    ZeroPageSize,
}
