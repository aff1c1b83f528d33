//! Which blocks each (worker, DP rank) holds, built from its events, and the
//! prefix queries a router asks of it.
//!
//! Blocks are keyed by the hash the events carry, never recomputed here, so
//! the index is right whatever namespace produced them (see [`crate::hash`]
//! for which ones a router can compute for a prompt). A block remembers its
//! parent link, its page length and the storage tiers holding it: SGLang's
//! HiCache publishes a host copy as a second `BlockStored` with `medium =
//! "CPU_PINNED"`, and evicting one tier's copy must not forget the other's.
//!
//! # When a rank's view is not trusted
//!
//! A rank's view can only go wrong in one harmful direction: claiming blocks
//! the worker evicted, which happens when removals are missed. Missing
//! stores only under-reports, exactly as a colder cache would. So:
//!
//! * A sequence gap marks the rank untrusted ([`Untrusted::Gap`]): the lost
//!   batches may have held removals.
//! * A rank first seen mid-stream (first seq > 0) *is* trusted: everything
//!   before it is unknown, but removals of unknown blocks are no-ops.
//! * An event of an unknown type marks it untrusted ([`Untrusted::UnknownEvent`]).
//! * **Memory bound**: each rank holds at most
//!   [`IndexLimits::max_blocks_per_rank`] blocks and the index at most
//!   [`IndexLimits::max_blocks_total`]. A store past either cap is refused
//!   and the rank is marked [`Untrusted::Overflow`]: its view would go
//!   stale as the worker's cache turns over, so the router should fall back
//!   to its own approximate tree for it.
//!
//! Queries on an untrusted rank return None. `AllBlocksCleared`, a publisher
//! restart (seq going back) or [`KvIndex::clear_rank`] empty the rank and
//! trust it again: after a clear its state is known exactly.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

use crate::event::{BlockRemoved, BlockStored, EventBatch, KvEvent};
use crate::seq::{SeqStatus, SeqTracker};

/// Caps on the number of blocks held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexLimits {
    /// Blocks one (worker, rank) may hold.
    pub max_blocks_per_rank: usize,
    /// Blocks all ranks together may hold.
    pub max_blocks_total: usize,
}

impl Default for IndexLimits {
    /// 1 Mi blocks a rank (16 Mi tokens at page size 16, more than a GPU
    /// holds) and 4 Mi in all, about 200 MB at ~48 bytes a block.
    fn default() -> Self {
        IndexLimits {
            max_blocks_per_rank: 1 << 20,
            max_blocks_total: 1 << 22,
        }
    }
}

/// Why a rank's view is not used for routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untrusted {
    /// Batches were missed; removals may have been lost.
    Gap,
    /// A store was refused at a memory cap.
    Overflow,
    /// An event of an unknown type was applied.
    UnknownEvent,
}

/// Storage tiers as bits, so one block can sit on several.
const TIER_GPU: u8 = 1;
const TIER_CPU: u8 = 2;
const TIER_DISK: u8 = 4;
const TIER_EXTERNAL: u8 = 8;
const TIER_OTHER: u8 = 16;

/// The tier bit of an event's `medium`; None is the GPU (releases before
/// tiers were named only reported the GPU cache).
fn tier_of(medium: Option<&str>) -> u8 {
    match medium {
        None | Some("GPU") => TIER_GPU,
        Some("CPU_PINNED") => TIER_CPU,
        Some("DISK") => TIER_DISK,
        Some("EXTERNAL") => TIER_EXTERNAL,
        Some(_) => TIER_OTHER,
    }
}

#[derive(Debug, Clone, Copy)]
struct Block {
    parent: Option<i64>,
    tokens: u32,
    tiers: u8,
}

#[derive(Debug, Default)]
struct RankState {
    blocks: HashMap<i64, Block>,
    seq: SeqTracker,
    untrusted: Option<Untrusted>,
    /// Tokens per block, from the last store (SGLang's `--page-size`).
    page_size: Option<u32>,
}

/// How much of a prompt's page chain a rank holds, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Longest prefix held in GPU memory: reusable without a load.
    pub device_tokens: usize,
    /// Longest prefix held on any tier (GPU, host, disk, remote): at least
    /// `device_tokens`; HiCache can load the rest instead of recomputing.
    pub any_tier_tokens: usize,
}

/// What applying one sequenced batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// How the sequence number related to the last one.
    pub seq: SeqStatus,
    /// The rank's trust after the batch.
    pub untrusted: Option<Untrusted>,
}

/// The block index of a fleet, keyed by worker id `W` and DP rank.
#[derive(Debug)]
pub struct KvIndex<W> {
    workers: HashMap<W, HashMap<u32, RankState>>,
    total_blocks: usize,
    limits: IndexLimits,
}

impl<W: Eq + Hash + Clone> KvIndex<W> {
    /// An empty index with these caps.
    pub fn new(limits: IndexLimits) -> Self {
        KvIndex {
            workers: HashMap::new(),
            total_blocks: 0,
            limits,
        }
    }

    /// Blocks held over all ranks.
    pub fn total_blocks(&self) -> usize {
        self.total_blocks
    }

    fn rank<Q>(&self, worker: &Q, rank: u32) -> Option<&RankState>
    where
        W: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.workers.get(worker)?.get(&rank)
    }

    /// Blocks held by one rank (0 if never seen).
    pub fn blocks<Q>(&self, worker: &Q, rank: u32) -> usize
    where
        W: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.rank(worker, rank).map_or(0, |r| r.blocks.len())
    }

    /// Tokens per block of one rank, once it has stored a block.
    pub fn page_size<Q>(&self, worker: &Q, rank: u32) -> Option<usize>
    where
        W: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.rank(worker, rank)?.page_size.map(|p| p as usize)
    }

    /// The ranks of `worker` the index knows, in order.
    pub fn ranks<Q>(&self, worker: &Q) -> Vec<u32>
    where
        W: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut ranks: Vec<u32> = self
            .workers
            .get(worker)
            .map(|r| r.keys().copied().collect())
            .unwrap_or_default();
        ranks.sort_unstable();
        ranks
    }

    /// Makes a rank known (empty and trusted if it was not known): a
    /// subscriber calls this once subscribed, so a worker with nothing
    /// cached yet, which publishes nothing, is known to hold nothing.
    pub fn open_rank(&mut self, worker: &W, rank: u32) {
        self.state_mut(worker, rank);
    }

    /// Why a rank is untrusted, if it is.
    pub fn untrusted<Q>(&self, worker: &Q, rank: u32) -> Option<Untrusted>
    where
        W: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.rank(worker, rank)?.untrusted
    }

    /// The parent link a stored block was published with.
    pub fn parent_of<Q>(&self, worker: &Q, rank: u32, block: i64) -> Option<Option<i64>>
    where
        W: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.rank(worker, rank)?
            .blocks
            .get(&block)
            .map(|b| b.parent)
    }

    /// Apply a batch that arrived with sequence number `seq` on the
    /// publisher of (`worker`, `rank`): a restart empties the rank first, a gap (within a run, or the first batches of
    /// a restarted one) marks it untrusted.
    pub fn apply(&mut self, worker: &W, rank: u32, seq: i64, batch: &EventBatch) -> ApplyOutcome {
        let status = self.state_mut(worker, rank).seq.observe(seq);
        match status {
            SeqStatus::Restart { missed } => {
                self.clear_rank(worker, rank);
                if missed > 0 {
                    self.state_mut(worker, rank).untrusted = Some(Untrusted::Gap);
                }
            }
            SeqStatus::Gap { .. } => self.state_mut(worker, rank).untrusted = Some(Untrusted::Gap),
            SeqStatus::First | SeqStatus::InOrder => {}
        }
        self.apply_events(worker, rank, &batch.events);
        ApplyOutcome {
            seq: status,
            untrusted: self.untrusted(worker, rank),
        }
    }

    /// Apply events without sequence checks (e.g. replayed batches the
    /// caller has already ordered).
    pub fn apply_events(&mut self, worker: &W, rank: u32, events: &[KvEvent]) {
        // Even an empty batch makes the rank known: it answers queries (with
        // 0) instead of None.
        self.state_mut(worker, rank);
        for ev in events {
            match ev {
                KvEvent::BlockStored(s) => self.store(worker, rank, s),
                KvEvent::BlockRemoved(r) => self.remove(worker, rank, r),
                KvEvent::AllBlocksCleared => self.clear_rank(worker, rank),
                KvEvent::Unknown { .. } => {
                    self.state_mut(worker, rank).untrusted = Some(Untrusted::UnknownEvent)
                }
            }
        }
    }

    /// Empty one rank and trust it again (its sequence tracking is kept).
    pub fn clear_rank(&mut self, worker: &W, rank: u32) {
        let state = self.state_mut(worker, rank);
        let n = state.blocks.len();
        state.blocks = HashMap::new();
        state.untrusted = None;
        self.total_blocks = self.total_blocks.saturating_sub(n);
    }

    /// Forget a worker entirely (it left the fleet).
    pub fn remove_worker<Q>(&mut self, worker: &Q)
    where
        W: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(ranks) = self.workers.remove(worker) {
            let n: usize = ranks.values().map(|r| r.blocks.len()).sum();
            self.total_blocks = self.total_blocks.saturating_sub(n);
        }
    }

    fn state_mut(&mut self, worker: &W, rank: u32) -> &mut RankState {
        self.workers
            .entry(worker.clone())
            .or_default()
            .entry(rank)
            .or_default()
    }

    fn store(&mut self, worker: &W, rank: u32, s: &BlockStored) {
        let tier = tier_of(s.medium.as_deref());
        let limits = self.limits;
        let mut total = self.total_blocks;
        let state = self.state_mut(worker, rank);
        state.page_size = Some(s.block_size);
        let mut parent = s.parent_block_hash;
        for &h in &s.block_hashes {
            if let Some(b) = state.blocks.get_mut(&h) {
                b.tiers |= tier;
            } else if state.blocks.len() >= limits.max_blocks_per_rank
                || total >= limits.max_blocks_total
            {
                // Refuse rather than evict: which blocks the worker still
                // holds is its decision, and guessing would over-report.
                state.untrusted = Some(Untrusted::Overflow);
                break;
            } else {
                state.blocks.insert(
                    h,
                    Block {
                        parent,
                        tokens: s.block_size,
                        tiers: tier,
                    },
                );
                total += 1;
            }
            parent = Some(h);
        }
        self.total_blocks = total;
    }

    fn remove(&mut self, worker: &W, rank: u32, r: &BlockRemoved) {
        let tier = tier_of(r.medium.as_deref());
        let state = self.state_mut(worker, rank);
        let mut removed = 0;
        for h in &r.block_hashes {
            if let Some(b) = state.blocks.get_mut(h) {
                b.tiers &= !tier;
                if b.tiers == 0 {
                    state.blocks.remove(h);
                    removed += 1;
                }
            }
        }
        self.total_blocks = self.total_blocks.saturating_sub(removed);
    }

    /// How much of `prompt_blocks` (the event hashes of a prompt's full
    /// pages, in order) one rank holds; None if the rank is unknown or
    /// untrusted.
    pub fn match_prefix<Q>(
        &self,
        worker: &Q,
        rank: u32,
        prompt_blocks: &[i64],
    ) -> Option<PrefixMatch>
    where
        W: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let state = self.rank(worker, rank)?;
        if state.untrusted.is_some() {
            return None;
        }
        Some(match_in(state, prompt_blocks))
    }

    /// Tokens of the longest prefix of `prompt_blocks` in one rank's GPU
    /// memory; None if the rank is unknown or untrusted.
    pub fn cached_tokens<Q>(&self, worker: &Q, rank: u32, prompt_blocks: &[i64]) -> Option<usize>
    where
        W: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.match_prefix(worker, rank, prompt_blocks)
            .map(|m| m.device_tokens)
    }

    /// The match on every known rank, for routing: `Some` per trusted rank,
    /// `None` per untrusted one (fall back to the approximate tree there).
    pub fn match_all(&self, prompt_blocks: &[i64]) -> Vec<(&W, u32, Option<PrefixMatch>)> {
        let mut out = Vec::new();
        for (w, ranks) in &self.workers {
            for (&rank, state) in ranks {
                let m = state
                    .untrusted
                    .is_none()
                    .then(|| match_in(state, prompt_blocks));
                out.push((w, rank, m));
            }
        }
        out
    }
}

/// Walk the prompt's chain while the rank holds each page. Hashes chain, so
/// holding page `k` of the prompt means holding that exact prefix.
fn match_in(state: &RankState, prompt_blocks: &[i64]) -> PrefixMatch {
    let mut m = PrefixMatch::default();
    let mut on_device = true;
    for h in prompt_blocks {
        let Some(b) = state.blocks.get(h) else {
            break;
        };
        let tokens = b.tokens as usize;
        m.any_tier_tokens += tokens;
        on_device &= b.tiers & TIER_GPU != 0;
        if on_device {
            m.device_tokens += tokens;
        }
    }
    m
}
