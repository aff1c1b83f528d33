//! Rendezvous (highest-random-weight) hashing: where a hashed key lives
//! among the workers a policy is given.
//!
//! Each worker gets a weight for the key, a stable hash of the key and the
//! worker's URL; the key lives on the heaviest. A worker that leaves the
//! slice (removed, unhealthy, circuit open) takes only its own keys with
//! it, each to that key's next heaviest worker, so they spread over the
//! rest; when it comes back they return. A worker that joins takes about
//! 1/(N+1) of the keys, from every other worker alike. Weights depend on
//! nothing but the key and the URL, so every control plane, restarted or
//! not, places a key alike.
//!
//! smg puts 150 virtual nodes per worker on a hash ring instead. That
//! gives the same guarantees up to the ring's unevenness (with 150 points
//! per worker, shares stray by several percent from 1/N) and needs a ring
//! rebuilt whenever the set of workers changes. Rendezvous hashing needs
//! no state and its shares are even in expectation; it costs one hash of
//! each worker's URL per decision, O(N) instead of O(log N), which for
//! fleets of tens of workers is a microsecond or so.

use std::sync::Arc;

use crate::stable_hash::{mix, stable_hash};
use crate::workers::Worker;

/// The weight of `worker` for a key hashed to `key`.
fn weight(key: u64, worker: &Worker) -> u64 {
    mix(key ^ stable_hash(worker.url.as_bytes()))
}

/// The index of the worker `key` lives on (0 for an empty slice).
pub(crate) fn owner(workers: &[Arc<Worker>], key: u64) -> usize {
    workers
        .iter()
        .enumerate()
        .max_by_key(|(_, w)| weight(key, w))
        .map_or(0, |(i, _)| i)
}

/// Every index of `workers`, in `key`'s order of preference: its owner
/// first, then the worker it would move to without the owner, and so on.
pub(crate) fn preference(workers: &[Arc<Worker>], key: u64) -> Vec<usize> {
    let mut weighed: Vec<(u64, usize)> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| (weight(key, w), i))
        .collect();
    weighed.sort_unstable_by(|a, b| b.cmp(a));
    weighed.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::workers;

    #[test]
    fn the_owner_heads_the_preference_and_each_worker_appears_once() {
        let ws = workers(5);
        for k in 0..200u64 {
            let key = stable_hash(&k.to_le_bytes());
            let order = preference(&ws, key);
            assert_eq!(order[0], owner(&ws, key));
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2, 3, 4]);
        }
    }

    #[test]
    fn keys_spread_evenly() {
        let ws = workers(4);
        let mut share = [0u32; 4];
        for k in 0..8000u64 {
            share[owner(&ws, stable_hash(format!("k{k}").as_bytes()))] += 1;
        }
        // 2000 expected each; a binomial's standard deviation is about 39.
        assert!(
            share.iter().all(|&n| (1800..=2200).contains(&n)),
            "{share:?}"
        );
    }
}
