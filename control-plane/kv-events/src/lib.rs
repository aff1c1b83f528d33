//! SGLang KV cache events, as pure code: what the control plane (subscriber)
//! and the simulated worker (publisher) share.
//!
//! SGLang workers started with `--kv-events-config '{"publisher": "zmq", ...}'`
//! run one publisher per DP rank (PUB port = base port + rank), sending ZMQ
//! multipart messages `[topic, seq, msgpack(EventBatch)]` and serving a
//! replay ROUTER. This crate holds:
//!
//! * [`event`], [`decode`], [`encode`]: the msgpack batch, in both layouts
//!   SGLang has used (arrays in 0.5.18 and before, maps in 0.5.23), decoded
//!   leniently and encoded byte-identical to msgspec;
//! * [`frame`]: the PUB and replay frame layouts;
//! * [`hash`]: the SHA-256 page chain behind the block hashes, so a router
//!   can hash a prompt the way the worker did;
//! * [`seq`] and [`index`]: sequence tracking and the per-(worker, rank)
//!   block index with its prefix queries and memory caps.
//!
//! Facts were read from SGLang's released sources (PyPI `sglang` 0.5.23,
//! compared with 0.5.10 and 0.5.18); each module names its files.

// The bytes this crate parses come off the network: outside tests, no
// construct that can panic on input.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]
#![warn(missing_docs)]

pub mod decode;
pub mod encode;
pub mod error;
pub mod event;
pub mod frame;
pub mod hash;
pub mod index;
mod msgpack;
pub mod seq;

pub use decode::decode_batch;
pub use encode::{encode_batch, Layout};
pub use error::{DecodeError, FrameError, HashError};
pub use event::{BlockRemoved, BlockStored, EventBatch, KvEvent, TokenIds};
pub use hash::{block_hashes, ChainStart};
pub use index::{ApplyOutcome, IndexLimits, KvIndex, PrefixMatch, Untrusted};
pub use seq::{SeqStatus, SeqTracker};
