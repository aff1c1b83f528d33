//! Timing and scheduling: DP ranks, each with a prefix cache and a limited
//! number of concurrent prefills (so queues form like on a GPU), and a decode
//! phase that emits one token every `decode_us_per_token`.
//!
//! Everything a sequence holds (its prefill permit, its place in the load
//! counters) lives in values owned by the request's future or response
//! stream, so a client hanging up drops them and the load goes back down.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::{sleep_until, Instant};

use crate::cache::{prefix_hashes, PrefixCache};
use crate::control::Control;
use crate::kv_events::KvEvents;
use crate::tokens::Token;

/// One data-parallel rank: its own cache, prefill slots and load counters.
#[derive(Debug)]
struct Rank {
    cache: Mutex<PrefixCache>,
    prefill: Semaphore,
    /// Sequences waiting for a prefill slot.
    queued: AtomicU64,
    /// Sequences prefilling or decoding.
    running: AtomicU64,
    /// Prompt plus requested completion tokens of queued and running sequences.
    tokens: AtomicU64,
}

/// Load of one rank, as SGLang's `/get_load` reports it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RankLoad {
    /// The rank.
    pub dp_rank: usize,
    /// Running plus queued sequences.
    pub num_reqs: u64,
    /// Sequences waiting for a prefill slot.
    pub num_waiting_reqs: u64,
    /// Tokens of the sequences in flight.
    pub num_tokens: u64,
}

/// The simulated GPU: all DP ranks.
#[derive(Debug)]
pub struct Engine {
    ranks: Vec<Arc<Rank>>,
    next: AtomicUsize,
    control: Arc<Control>,
    /// With `--kv-events-config`: the caches hold pages and publish events.
    kv: Option<Arc<KvEvents>>,
}

impl Engine {
    /// `dp_size` ranks (at least one), each allowing `max_running_prefills`
    /// concurrent prefills (at least one) and caching `cache_tokens` tokens
    /// (in whole pages when `kv` publishes KV events).
    pub fn new(
        dp_size: usize,
        max_running_prefills: usize,
        cache_tokens: usize,
        control: Arc<Control>,
        kv: Option<Arc<KvEvents>>,
    ) -> Engine {
        let capacity = match &kv {
            Some(kv) => cache_tokens / kv.page_size(),
            None => cache_tokens,
        };
        let ranks = (0..dp_size.max(1))
            .map(|_| {
                Arc::new(Rank {
                    cache: Mutex::new(PrefixCache::new(capacity)),
                    prefill: Semaphore::new(max_running_prefills.max(1)),
                    queued: AtomicU64::new(0),
                    running: AtomicU64::new(0),
                    tokens: AtomicU64::new(0),
                })
            })
            .collect();
        Engine {
            ranks,
            next: AtomicUsize::new(0),
            control,
            kv,
        }
    }

    /// Empties every rank's cache, as SGLang's `/flush_cache` does, and
    /// publishes `AllBlocksCleared`. Like SGLang, refuses (false) while
    /// requests are running or waiting.
    pub fn flush(&self) -> bool {
        if self.loads().iter().any(|l| l.num_reqs > 0) {
            return false;
        }
        for (i, rank) in self.ranks.iter().enumerate() {
            let mut cache = rank.cache.lock();
            cache.clear();
            if let Some(kv) = &self.kv {
                kv.publish_cleared(i);
            }
        }
        true
    }

    /// As a restarted worker: empty caches, publishers back at seq 0 with
    /// nothing to replay, and no event about it (a new process announces
    /// nothing; subscribers notice the seq going back).
    pub fn restart_kv(&self) {
        for (i, rank) in self.ranks.iter().enumerate() {
            let mut cache = rank.cache.lock();
            cache.clear();
            if let Some(kv) = &self.kv {
                kv.restart(i);
            }
        }
    }

    /// The rank for a request: `requested` if it names an existing rank,
    /// else the next one round-robin.
    pub fn pick_rank(&self, requested: Option<i64>) -> usize {
        match requested.and_then(|r| usize::try_from(r).ok()) {
            Some(r) if r < self.ranks.len() => r,
            _ => self.next.fetch_add(1, Ordering::Relaxed) % self.ranks.len(),
        }
    }

    /// Current load of every rank.
    pub fn loads(&self) -> Vec<RankLoad> {
        self.ranks
            .iter()
            .enumerate()
            .map(|(dp_rank, r)| {
                let queued = r.queued.load(Ordering::Relaxed);
                RankLoad {
                    dp_rank,
                    num_reqs: queued + r.running.load(Ordering::Relaxed),
                    num_waiting_reqs: queued,
                    num_tokens: r.tokens.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Admits a sequence of `prompt_tokens` whose KV is computed elsewhere
    /// on `rank`: it waits (counted as queued) until [`Admitted::start`].
    pub fn admit(&self, rank: usize, prompt_tokens: usize, max_new: usize) -> Admitted {
        let rank_index = rank % self.ranks.len();
        let rank = Arc::clone(&self.ranks[rank_index]);
        Admitted {
            rank: rank_index,
            prompt_tokens,
            seq: SeqGuard::queued(rank, (prompt_tokens + max_new) as u64),
            control: Arc::clone(&self.control),
        }
    }

    /// Queues a sequence of `tokens` on `rank`, waits for a prefill slot,
    /// and spends the prefill time of its uncached tokens. `max_new` is only
    /// counted in the load. The returned value keeps the sequence counted as
    /// running until it is dropped or decoded.
    pub async fn prefill(&self, rank: usize, tokens: &[Token], max_new: usize) -> Prefilled {
        let rank_index = rank % self.ranks.len();
        let rank = Arc::clone(&self.ranks[rank_index]);
        let mut seq = SeqGuard::queued(Arc::clone(&rank), (tokens.len() + max_new) as u64);
        // Keys: one per token, or with KV events one per full page (its
        // hash), so the cache matches what the events told subscribers.
        let (hashes, pages, unit) = match &self.kv {
            None => (prefix_hashes(tokens), None, 1),
            Some(kv) => {
                let pages = kv.pages(tokens);
                (pages.keys(), Some(pages), kv.page_size())
            }
        };
        // The semaphore is never closed; if it were, run without a slot.
        let permit = rank.prefill.acquire().await.ok();
        seq.start();
        // Matched when the prefill starts, as SGLang's scheduler does: a
        // request queued behind an identical one benefits from it.
        let cached = rank.cache.lock().match_len(&hashes) * unit;
        let us = (tokens.len() - cached) as u64 * self.control.get().prefill_us_per_token;
        if us > 0 {
            sleep_until(Instant::now() + Duration::from_micros(us)).await;
        }
        {
            let mut cache = rank.cache.lock();
            let inserted = cache.insert(&hashes);
            // Published under the cache lock: batches leave in the order
            // the cache changed.
            if let (Some(kv), Some(pages)) = (&self.kv, &pages) {
                kv.publish_insert(rank_index, pages, &inserted);
            }
        }
        drop(permit);
        Prefilled {
            rank: rank_index,
            prompt_tokens: tokens.len(),
            cached_tokens: cached,
            _seq: seq,
            control: Arc::clone(&self.control),
        }
    }
}

/// A sequence admitted without a prefill (a decode worker's, whose KV comes
/// from a prefill worker): counted as waiting on its rank until started.
#[derive(Debug)]
pub struct Admitted {
    rank: usize,
    prompt_tokens: usize,
    seq: SeqGuard,
    control: Arc<Control>,
}

impl Admitted {
    /// Its rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The KV has arrived: the sequence runs, with nothing to prefill and
    /// nothing from this rank's prefix cache.
    pub fn start(mut self) -> Prefilled {
        self.seq.start();
        Prefilled {
            rank: self.rank,
            prompt_tokens: self.prompt_tokens,
            cached_tokens: 0,
            _seq: self.seq,
            control: self.control,
        }
    }
}

/// A sequence past its prefill.
#[derive(Debug)]
pub struct Prefilled {
    /// Rank it ran on.
    pub rank: usize,
    /// Its prompt length in tokens.
    pub prompt_tokens: usize,
    /// How many of those were prefix-cache hits.
    pub cached_tokens: usize,
    /// Held only for its `Drop`: keeps the sequence in the load.
    _seq: SeqGuard,
    control: Arc<Control>,
}

impl Prefilled {
    /// Spends the time of generating `n` tokens at once.
    pub async fn decode(self, n: usize) {
        let us = n as u64 * self.control.get().decode_us_per_token;
        if us > 0 {
            sleep_until(Instant::now() + Duration::from_micros(us)).await;
        }
    }

    /// Yields the indexes `0..n` of generated tokens, one per decode step.
    /// Steps are timed against deadlines rather than by sleeping each step,
    /// because tokio timers are millisecond-grained: sub-millisecond steps
    /// then come in small bursts but at the right average rate.
    pub fn decode_stream(self, n: usize) -> BoxStream<'static, usize> {
        let start = (0usize, Instant::now(), self);
        stream::unfold(start, move |(i, deadline, this)| async move {
            if i >= n {
                // Dropping `this` here ends the sequence's load.
                return None;
            }
            let deadline = deadline + Duration::from_micros(this.control.get().decode_us_per_token);
            if deadline > Instant::now() {
                sleep_until(deadline).await;
            }
            Some((i, (i + 1, deadline, this)))
        })
        .boxed()
    }
}

/// Keeps one sequence in its rank's load counters while alive.
#[derive(Debug)]
struct SeqGuard {
    rank: Arc<Rank>,
    running: bool,
    tokens: u64,
}

impl SeqGuard {
    fn queued(rank: Arc<Rank>, tokens: u64) -> SeqGuard {
        rank.queued.fetch_add(1, Ordering::Relaxed);
        rank.tokens.fetch_add(tokens, Ordering::Relaxed);
        SeqGuard {
            rank,
            running: false,
            tokens,
        }
    }

    fn start(&mut self) {
        if !self.running {
            self.running = true;
            self.rank.running.fetch_add(1, Ordering::Relaxed);
            self.rank.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for SeqGuard {
    fn drop(&mut self) {
        let counter = if self.running {
            &self.rank.running
        } else {
            &self.rank.queued
        };
        counter.fetch_sub(1, Ordering::Relaxed);
        self.rank.tokens.fetch_sub(self.tokens, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::tokenize;

    fn engine(dp: usize) -> Engine {
        Engine::new(dp, 1, 1000, Arc::new(Control::new(0, 0)), None)
    }

    #[test]
    fn pinned_ranks_and_round_robin() {
        let e = engine(2);
        assert_eq!(e.pick_rank(Some(1)), 1);
        assert_eq!(e.pick_rank(Some(0)), 0);
        let a = e.pick_rank(Some(7));
        let b = e.pick_rank(None);
        assert_ne!(a, b);
        assert_ne!(e.pick_rank(Some(-1)), e.pick_rank(None));
    }

    #[tokio::test]
    async fn load_follows_sequences() {
        let e = engine(1);
        let p = e.prefill(0, &tokenize("abcdefgh"), 3).await;
        assert_eq!(p.cached_tokens, 0);
        assert_eq!(e.loads()[0].num_reqs, 1);
        assert_eq!(e.loads()[0].num_tokens, 5);
        let q = e.prefill(0, &tokenize("abcdefgh"), 3).await;
        assert_eq!(q.cached_tokens, 2);
        drop(p);
        let tokens: Vec<usize> = q.decode_stream(3).collect().await;
        assert_eq!(tokens, vec![0, 1, 2]);
        assert_eq!(e.loads()[0].num_reqs, 0);
        assert_eq!(e.loads()[0].num_tokens, 0);
    }

    #[tokio::test]
    async fn flush_empties_caches_unless_busy() {
        let e = engine(2);
        let p = e.prefill(1, &tokenize("abcdefgh"), 1).await;
        // A running sequence blocks the flush, as in SGLang.
        assert!(!e.flush());
        drop(p);
        assert!(e.flush());
        let q = e.prefill(1, &tokenize("abcdefgh"), 1).await;
        assert_eq!(q.cached_tokens, 0);
        drop(q);
        e.restart_kv();
        assert_eq!(
            e.prefill(1, &tokenize("abcdefgh"), 1).await.cached_tokens,
            0
        );
    }

    #[tokio::test]
    async fn admitted_sequences_wait_then_run_uncached() {
        let e = engine(2);
        let a = e.admit(1, 4, 2);
        assert_eq!(a.rank(), 1);
        assert_eq!(e.loads()[1].num_waiting_reqs, 1);
        assert_eq!(e.loads()[1].num_tokens, 6);
        let p = a.start();
        assert_eq!((p.rank, p.prompt_tokens, p.cached_tokens), (1, 4, 0));
        assert_eq!(e.loads()[1].num_waiting_reqs, 0);
        assert_eq!(e.loads()[1].num_reqs, 1);
        drop(p);
        assert_eq!(e.loads()[1].num_reqs, 0);
        drop(e.admit(0, 4, 2));
        assert_eq!(e.loads()[0].num_reqs, 0);
        assert_eq!(e.loads()[0].num_tokens, 0);
    }
}
