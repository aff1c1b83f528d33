//! The event types SGLang publishes, as plain Rust values.
//!
//! Read from SGLang 0.5.23 (PyPI wheel), `sglang/srt/disaggregation/kv_events.py`,
//! and compared with 0.5.10 and 0.5.18 of the same file:
//!
//! * `EventBatch` is a msgspec `Struct(array_like=True)`: the positional
//!   array `[ts: float, events: list, attn_dp_rank: int | None]`. The
//!   `attn_dp_rank` field arrived after the first releases (before 0.5.10),
//!   so very old publishers send `[ts, events]`. msgspec writes all three
//!   even when `attn_dp_rank` is None (it does not omit defaults of
//!   array-like structs; checked with msgspec 0.22), and the publisher fills
//!   it with its rank before queueing.
//! * Events are a msgspec tagged union (`tag=True`, default tag field
//!   `"type"`, tag value = class name: `"BlockStored"`, `"BlockRemoved"`,
//!   `"AllBlocksCleared"`).
//!   * **0.5.23**: events are *maps* (`array_like` dropped, `omit_defaults`
//!     kept): `{"type": tag, field: value, ...}` in declaration order, with
//!     defaulted fields (`medium`, `cache_salt`, `session_id`, `lora_name`)
//!     left out when None. Required fields (`parent_block_hash`, `lora_id`)
//!     are written even when None.
//!   * **0.5.18 and before** (read in 0.5.10 and 0.5.18; the switch lies in
//!     0.5.19..=0.5.23, not bisected): events are arrays
//!     with the tag first, then every field positionally:
//!     `["BlockStored", block_hashes, parent_block_hash, token_ids,
//!     block_size, lora_id, medium]`, `["BlockRemoved", block_hashes,
//!     medium]`, `["AllBlocksCleared"]` (the oldest releases lack
//!     `medium`). 0.5.18 appends a ninth element to a salted store, a map
//!     `{"cache_salt": str}` (its `BlockStoredWithMetadata`).
//! * `token_ids` is a list of ints, or, for EAGLE bigram keys, a list of
//!   `[id, id]` pairs (0.5.23 `mem_cache/events.py`, "bigram pages expose
//!   tuples").
//! * Block hashes are signed int64 (see [`crate::hash`] for how they are made).

/// One msgpack payload: the events of one scheduler step of one DP rank.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Publisher wall-clock time, seconds since the epoch (Python `time.time()`).
    pub ts: f64,
    /// The events, in the order the cache produced them.
    pub events: Vec<KvEvent>,
    /// The publisher's DP rank, when it says (absent before ~0.5.x).
    pub attn_dp_rank: Option<i64>,
}

/// One cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Pages became cached.
    BlockStored(BlockStored),
    /// Pages were evicted.
    BlockRemoved(BlockRemoved),
    /// The whole cache was flushed.
    AllBlocksCleared,
    /// An event type this crate does not know. Kept rather than failing the
    /// batch, so a consumer can tell that its view may have drifted.
    Unknown {
        /// The tag the publisher used.
        tag: String,
    },
}

/// Token ids of the stored pages, concatenated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenIds {
    /// Ordinary token ids.
    Flat(Vec<u64>),
    /// EAGLE bigram keys: each logical token is the pair `(t[i], t[i+1])`.
    Bigram(Vec<[u64; 2]>),
}

impl TokenIds {
    /// Number of logical tokens (pairs count once).
    pub fn len(&self) -> usize {
        match self {
            TokenIds::Flat(v) => v.len(),
            TokenIds::Bigram(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for TokenIds {
    fn default() -> Self {
        TokenIds::Flat(Vec::new())
    }
}

/// `BlockStored`: consecutive pages, each chained to the one before.
///
/// SGLang's recorder coalesces consecutive single-page stores into one event
/// when each page's parent is the previous page, so `block_hashes[i]`'s parent
/// is `block_hashes[i-1]` and `block_hashes[0]`'s is `parent_block_hash`;
/// `token_ids` holds all pages' tokens back to back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockStored {
    /// One hash per page.
    pub block_hashes: Vec<i64>,
    /// The page before the first one, or None at the root of the tree.
    pub parent_block_hash: Option<i64>,
    /// The pages' tokens.
    pub token_ids: TokenIds,
    /// Tokens per page (SGLang writes the page's length, i.e. `page_size`
    /// for the full pages the radix cache stores).
    pub block_size: u32,
    /// Always None from SGLang's radix cache (it publishes `lora_name`).
    pub lora_id: Option<i64>,
    /// Storage tier, e.g. `"GPU"`, `"CPU_PINNED"`, `"DISK"`, `"EXTERNAL"`.
    pub medium: Option<String>,
    /// The request's cache salt (0.5.18 metadata map, 0.5.23 field).
    pub cache_salt: Option<String>,
    /// Session that triggered the store (0.5.23; attribution only).
    pub session_id: Option<String>,
    /// Public LoRA adapter name (0.5.23).
    pub lora_name: Option<String>,
}

/// `BlockRemoved`: pages evicted from one tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRemoved {
    /// The evicted pages.
    pub block_hashes: Vec<i64>,
    /// The tier they left; None from releases before tiers were named (GPU).
    pub medium: Option<String>,
}
