use std::sync::Arc;

use super::{least_loaded, rendezvous, CacheOutcome, Policy, RouteInput, Selection};
use crate::stable_hash::stable_hash;
use crate::workers::Worker;

/// Bytes of routing text hashed per token of `--prefix-token-count`.
///
/// smg hashes the first `prefix_token_count` tokens of a request, or four
/// characters per token of an untokenized one. This router has no
/// tokenizer; it hashes four bytes of the routing text per token. Bytes
/// rather than characters because bytes follow tokens more closely across
/// scripts: English runs about four characters (bytes) per token, while a
/// CJK character is three bytes and about one token, so four characters
/// of it would be three or four tokens where four bytes are one or two.
pub const BYTES_PER_TOKEN: usize = 4;

/// Settings of the prefix-hash policy (smg's flags and meaning).
#[derive(Debug, Clone, Copy)]
pub struct PrefixHashConfig {
    /// `--prefix-token-count`: the head hashed is this many tokens'
    /// worth of routing text ([`BYTES_PER_TOKEN`] bytes each).
    pub prefix_token_count: usize,
    /// `--prefix-hash-load-factor`: a worker is overloaded when its load
    /// exceeds the mean load times this...
    pub load_factor: f64,
    /// `--prefix-hash-balance-abs-threshold`: ...and exceeds the mean by
    /// more than this.
    pub balance_abs_threshold: usize,
}

/// smg's `prefix_hash` policy: requests whose routing text starts with the
/// same head (the first `prefix_token_count` × 4 bytes, or all of a shorter
/// text) go to one worker, where that prefix is likely in the KV cache;
/// distinct heads spread over the workers by hash. A lighter `cache_aware`:
/// no tree and no memory, but only requests sharing the whole head group
/// together. The routing text is the one `cache_aware` matches on (chat
/// messages as `role\ncontent\n`, so a shared system prompt of a kilobyte
/// or more groups its conversations).
///
/// The head's stable hash is placed on the workers by rendezvous hashing
/// (smg: a hash ring), so a head keeps its worker while the worker is
/// available, and only the heads of a worker that leaves move. When that
/// worker is overloaded (its load above the mean, counting the request
/// being placed, times `load_factor` and by more than
/// `balance_abs_threshold`; loads as every policy reads them,
/// [`Worker::load`]), the request goes to the head's next worker in its
/// rendezvous order that is not overloaded. That is what smg's flag
/// describes ("walks the ring"), but smg 1.13.0's code sends it to the
/// least loaded worker instead: a hot prefix's overflow then lands
/// wherever is emptiest at that moment, and each such worker prefills the
/// prefix anew. Walking keeps the overflow of one head on one second
/// worker, whose cache warms to it. (The walk always ends: the least
/// loaded worker is never above the mean, so never overloaded.)
///
/// A request without routing text goes to the least loaded worker (ties at
/// random); smg's policy finds no worker for a request without tokens.
pub struct PrefixHash {
    config: PrefixHashConfig,
}

impl PrefixHash {
    /// A policy with these settings.
    pub fn new(config: PrefixHashConfig) -> Self {
        PrefixHash { config }
    }

    /// The bytes of `text` that are hashed.
    fn head<'t>(&self, text: &'t [u8]) -> &'t [u8] {
        let len = self
            .config
            .prefix_token_count
            .saturating_mul(BYTES_PER_TOKEN);
        &text[..text.len().min(len)]
    }

    fn choose(&self, workers: &[Arc<Worker>], text: &[u8]) -> (usize, CacheOutcome) {
        if text.is_empty() {
            let index = least_loaded(workers, |_| true).unwrap_or(0);
            return (index, CacheOutcome::NotApplicable);
        }
        let key = stable_hash(self.head(text));
        let home = rendezvous::owner(workers, key);
        let loads: Vec<usize> = workers.iter().map(|w| w.routing_load()).collect();
        // The mean counts the request being placed (as smg does), so an
        // idle fleet never calls a worker overloaded.
        let mean = (loads.iter().sum::<usize>() + 1) as f64 / workers.len().max(1) as f64;
        let overloaded = |i: usize| {
            let load = loads[i] as f64;
            load > mean * self.config.load_factor
                && load - mean > self.config.balance_abs_threshold as f64
        };
        if !overloaded(home) {
            return (home, CacheOutcome::NotApplicable);
        }
        let next = rendezvous::preference(workers, key)
            .into_iter()
            .find(|&i| !overloaded(i));
        (next.unwrap_or(home), CacheOutcome::Imbalanced)
    }
}

impl Policy for PrefixHash {
    fn name(&self) -> &'static str {
        "prefix_hash"
    }

    fn select(&self, workers: &[Arc<Worker>], input: &RouteInput<'_>) -> Selection {
        let (index, cache) = self.choose(workers, input.text);
        Selection {
            index,
            cache,
            work: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::{set_load, workers};

    fn policy() -> PrefixHash {
        PrefixHash::new(PrefixHashConfig {
            prefix_token_count: 256,
            load_factor: 1.25,
            balance_abs_threshold: 10,
        })
    }

    fn pick(p: &PrefixHash, ws: &[Arc<Worker>], text: &str) -> usize {
        p.select(ws, &RouteInput::of_text(text.as_bytes())).index
    }

    /// `n` bytes of text that differ from one `seed` to the next at once.
    fn text(seed: usize, n: usize) -> String {
        (0..n)
            .map(|i| (b'a' + ((i * 7 + seed * 13) % 26) as u8) as char)
            .collect()
    }

    #[test]
    fn a_shared_head_keeps_requests_together_whatever_follows() {
        let p = policy();
        let ws = workers(4);
        for seed in 0..20 {
            let prefix = format!("{seed}:{}", text(seed, 1024));
            let home = pick(&p, &ws, &format!("{prefix} question one"));
            for q in 0..10 {
                let t = format!("{prefix} {} {q}", text(q, 50 + q * 30));
                assert_eq!(pick(&p, &ws, &t), home, "prefix {seed}, question {q}");
            }
        }
    }

    #[test]
    fn distinct_heads_spread() {
        let p = policy();
        let ws = workers(4);
        let mut share = [0u32; 4];
        for seed in 0..400 {
            share[pick(&p, &ws, &format!("{seed} {}", text(seed, 200)))] += 1;
        }
        // 100 expected each; the binomial's standard deviation is about 9.
        assert!(share.iter().all(|&n| (60..=140).contains(&n)), "{share:?}");
    }

    #[test]
    fn only_the_head_counts() {
        let p = PrefixHash::new(PrefixHashConfig {
            prefix_token_count: 4,
            ..policy().config
        });
        let ws = workers(8);
        // The first 16 bytes decide; what differs after them does not.
        let mut homes = std::collections::HashSet::new();
        for tail in 0..30 {
            homes.insert(pick(&p, &ws, &format!("0123456789abcdef{tail}")));
        }
        assert_eq!(homes.len(), 1);
        // A difference inside the head is a different head.
        let mut homes = std::collections::HashSet::new();
        for head in 0..30 {
            homes.insert(pick(&p, &ws, &format!("{head:02}23456789abcdef")));
        }
        assert!(homes.len() > 3, "30 heads on {homes:?}");
    }

    #[test]
    fn an_overloaded_home_sends_the_overflow_to_one_next_worker() {
        let p = policy();
        let ws = workers(4);
        let t = text(1, 2000);
        let home = pick(&p, &ws, &t);
        // Mean with the new request: (30 + 1) / 4 = 7.75; 30 exceeds both
        // 7.75 × 1.25 and 7.75 + 10.
        set_load(&ws[home], 30);
        let next = pick(&p, &ws, &t);
        assert_ne!(next, home);
        let expected = rendezvous::preference(&ws, stable_hash(p.head(t.as_bytes())))[1];
        assert_eq!(next, expected, "the head's second choice, not any idle one");
        for _ in 0..20 {
            assert_eq!(pick(&p, &ws, &t), next, "the overflow stays together");
        }
        let outcome = p.select(&ws, &RouteInput::of_text(t.as_bytes())).cache;
        assert_eq!(outcome, CacheOutcome::Imbalanced);
    }

    #[test]
    fn a_busy_home_under_both_thresholds_keeps_its_requests() {
        let p = policy();
        let ws = workers(2);
        let t = text(2, 2000);
        let home = pick(&p, &ws, &t);
        // Mean (10 + 1) / 2 = 5.5: 10 is above 1.25 × 5.5 but only 4.5
        // above the mean, under the absolute threshold of 10.
        set_load(&ws[home], 10);
        assert_eq!(pick(&p, &ws, &t), home);
        // 40: (41 / 2) = 20.5; 40 > 25.6 and 19.5 over the mean.
        set_load(&ws[home], 40);
        assert_ne!(pick(&p, &ws, &t), home);
    }

    #[test]
    fn no_text_goes_to_the_least_loaded() {
        let p = policy();
        let ws = workers(3);
        set_load(&ws[0], 2);
        set_load(&ws[1], 1);
        set_load(&ws[2], 3);
        for _ in 0..20 {
            assert_eq!(pick(&p, &ws, ""), 1);
        }
    }
}
