//! The prefix cache of one DP rank, standing in for SGLang's radix cache.
//!
//! Every prefix of every prefilled prompt is stored by its rolling hash; one
//! stored prefix stands for one cached token (the last token of the prefix),
//! so the capacity is counted in tokens like a radix tree's. A prompt's cache
//! hit is its longest stored prefix.
//!
//! The store keeps the *prefix property*: when a prefix is stored, all its
//! shorter prefixes are stored too. Inserting or touching a prompt gives all
//! its prefixes the same tick, so a prefix is never older than any longer
//! prefix of it; eviction takes the oldest tick first and, on equal ticks, the
//! longest prefix first, so a prefix is never evicted before its extensions.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use crate::tokens::Token;

/// Rolling hashes `h_1..h_n` of the prefixes of `tokens` (`h_k` covers the
/// first `k` tokens).
pub fn prefix_hashes(tokens: &[Token]) -> Vec<u64> {
    let mut h: u64 = 0x5175_6c6c_6d5f_7369;
    tokens
        .iter()
        .map(|&t| {
            h = mix(h ^ mix(t.wrapping_add(0x9e37_79b9_7f4a_7c15)));
            h
        })
        .collect()
}

/// splitmix64's finalizer: a cheap, well-spread 64-bit mix.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Where one stored prefix sits in the LRU order.
#[derive(Debug, Clone, Copy)]
struct Entry {
    tick: u64,
    len: u32,
}

/// What one [`PrefixCache::insert`] changed (used to publish KV events).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inserted {
    /// Indexes of the keys newly stored and still stored afterwards (the
    /// prefix property makes them one range).
    pub new: Range<usize>,
    /// Keys stored before this insert and evicted by it, oldest first.
    pub evicted: Vec<u64>,
}

/// A prefix cache with LRU eviction. Its unit is whatever one key stands
/// for: a token (the default), or a page of tokens when KV events are on.
#[derive(Debug)]
pub struct PrefixCache {
    capacity: usize,
    tick: u64,
    entries: HashMap<u64, Entry>,
    /// LRU order: oldest tick first, then longest prefix first.
    order: BTreeSet<(u64, Reverse<u32>, u64)>,
}

impl PrefixCache {
    /// An empty cache holding at most `capacity` tokens.
    pub fn new(capacity: usize) -> PrefixCache {
        PrefixCache {
            capacity,
            tick: 0,
            entries: HashMap::new(),
            order: BTreeSet::new(),
        }
    }

    /// Number of cached tokens.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Length of the longest cached prefix of the prompt with `hashes`
    /// (see [`prefix_hashes`]).
    pub fn match_len(&self, hashes: &[u64]) -> usize {
        // The prefix property makes the first miss the end of the match.
        hashes
            .iter()
            .take_while(|h| self.entries.contains_key(h))
            .count()
    }

    /// Stores (or refreshes) every prefix of the prompt with `hashes`, then
    /// evicts least recently used keys past the capacity, and says which
    /// keys came and went.
    pub fn insert(&mut self, hashes: &[u64]) -> Inserted {
        self.tick += 1;
        let tick = self.tick;
        let mut first_new = None;
        for (i, &h) in hashes.iter().enumerate() {
            let len = u32::try_from(i + 1).unwrap_or(u32::MAX);
            let fresh = Entry { tick, len };
            match self.entries.insert(h, fresh) {
                Some(old) => {
                    self.order.remove(&(old.tick, Reverse(old.len), h));
                }
                None => {
                    first_new.get_or_insert(i);
                }
            }
            self.order.insert((tick, Reverse(len), h));
        }
        let first_new = first_new.unwrap_or(hashes.len());
        let mut kept_end = hashes.len();
        let mut evicted = Vec::new();
        while self.entries.len() > self.capacity {
            let Some((t, Reverse(len), h)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&h);
            // A prompt longer than the cache loses its own new tail at
            // once (longest first): those keys were never really stored.
            if t == tick && len as usize > first_new {
                kept_end = kept_end.min(len as usize - 1);
            } else {
                evicted.push(h);
            }
        }
        Inserted {
            new: first_new..kept_end.max(first_new),
            evicted,
        }
    }

    /// Drops everything (SGLang's `/flush_cache`, or a restart).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::tokenize;

    fn hashes(s: &str) -> Vec<u64> {
        prefix_hashes(&tokenize(s))
    }

    #[test]
    fn longest_shared_prefix_hits() {
        let mut c = PrefixCache::new(1000);
        let a = hashes("aaaabbbbccccdddd");
        assert_eq!(c.match_len(&a), 0);
        assert_eq!(
            c.insert(&a),
            Inserted {
                new: 0..4,
                evicted: vec![]
            }
        );
        assert_eq!(c.len(), 4);
        assert_eq!(c.match_len(&a), 4);
        assert_eq!(c.match_len(&hashes("aaaabbbbxxxxdddd")), 2);
        assert_eq!(c.match_len(&hashes("zaaabbbb")), 0);
        // Shared prefixes are stored once.
        assert_eq!(c.insert(&hashes("aaaabbbbeeee")).new, 2..3);
        assert_eq!(c.len(), 5);
        // A repeat stores nothing.
        assert_eq!(c.insert(&a).new, 4..4);
        c.clear();
        assert_eq!((c.len(), c.match_len(&a)), (0, 0));
    }

    #[test]
    fn lru_evicts_old_prompts_longest_first() {
        let mut c = PrefixCache::new(4);
        let a = hashes("aaaabbbbcccc");
        let b = hashes("xxxxyyyyzzzz");
        c.insert(&a);
        let ins = c.insert(&b);
        // a's two longest prefixes made room for b, longest first.
        assert_eq!(ins.new, 0..3);
        assert_eq!(ins.evicted, vec![a[2], a[1]]);
        // 4 tokens fit: b is whole, a keeps only its head.
        assert_eq!(c.len(), 4);
        assert_eq!(c.match_len(&b), 3);
        assert_eq!(c.match_len(&a), 1);
        // A prompt longer than the cache keeps its head.
        let long = hashes(&"0123".repeat(10));
        let ins = c.insert(&long);
        // Only the head that stays counts as stored; only old keys as evicted.
        assert_eq!(ins.new, 0..4);
        assert_eq!(ins.evicted.len(), 4);
        assert!(!ins.evicted.iter().any(|h| long.contains(h)));
        assert_eq!(c.match_len(&long), 4);
        assert_eq!(c.match_len(&a), 0);
        assert_eq!(c.match_len(&b), 0);
    }

    #[test]
    fn touching_a_prompt_protects_it() {
        let mut c = PrefixCache::new(4);
        let a = hashes("aaaabbbb");
        let b = hashes("ccccdddd");
        c.insert(&a);
        c.insert(&b);
        c.insert(&a);
        c.insert(&hashes("eeeeffff"));
        assert_eq!(c.match_len(&a), 2);
        assert_eq!(c.match_len(&b), 0);
    }

    #[test]
    fn zero_capacity_caches_nothing() {
        let mut c = PrefixCache::new(0);
        let a = hashes("aaaabbbb");
        assert_eq!(c.insert(&a), Inserted::default());
        assert_eq!(c.match_len(&a), 0);
    }
}
