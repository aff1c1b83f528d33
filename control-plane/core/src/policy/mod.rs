//! Routing policies: given the healthy workers and a request's routing text,
//! choose one worker.

mod bucket;
mod cache_aware;
mod consistent_hashing;
mod cost_aware;
mod least_load;
mod manual;
mod power_of_two;
mod prefix_hash;
mod random;
mod rendezvous;
mod round_robin;
mod spill_gate;

use std::sync::Arc;

pub use bucket::{Bucket, BucketConfig};
pub use cache_aware::{CacheAware, CacheAwareConfig};
pub use consistent_hashing::ConsistentHashing;
pub use cost_aware::{CostAware, CostAwareConfig, MIN_MATCH};
/// The cost-aware policy's shipped weights.
pub use cost_aware::{MAX_TREE_SIZE, PER_REQUEST_COST, QUEUE_WEIGHT};
pub use least_load::LeastLoad;
pub use manual::{AssignmentMode, Manual, ManualConfig};
pub use power_of_two::PowerOfTwo;
pub use prefix_hash::{PrefixHash, PrefixHashConfig, BYTES_PER_TOKEN};
pub use random::Random;
pub use round_robin::RoundRobin;

use crate::routing_key::RoutingKey;
use crate::tree::{PrefixMatch, TenantId};
use crate::workers::Worker;

/// What a policy knows about one request.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    /// Text the cache-aware policies match on and `prefix_hash` hashes the
    /// head of (may be empty).
    pub text: &'a [u8],
    /// The client's sticky-session key (`X-SMG-Routing-Key`), if it sent one.
    pub routing_key: Option<RoutingKey>,
    /// Exact cached prefixes, one per worker of the slice the policy is
    /// given, in `text`'s units (bytes): `Some` where the worker's KV
    /// events say what it holds, `None` where the approximate tree must
    /// guess. The cache-aware policies use these over their tree's.
    pub exact: Option<&'a [Option<usize>]>,
}

impl<'a> RouteInput<'a> {
    /// A request with this routing text and no routing key.
    pub fn of_text(text: &'a [u8]) -> Self {
        RouteInput {
            text,
            routing_key: None,
            exact: None,
        }
    }
}

/// How the cache-aware policy reached its choice (for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// The policy does not look at caches.
    NotApplicable,
    /// Sent to the worker with the best prefix match above the threshold.
    Hit,
    /// Match below the threshold: sent to the worker with the smallest tree.
    Miss,
    /// Loads were imbalanced: sent to the least loaded worker.
    Imbalanced,
}

/// A policy's choice: an index into the worker slice it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection {
    /// Index of the chosen worker.
    pub index: usize,
    /// How it was chosen.
    pub cache: CacheOutcome,
    /// Estimated prefill work the request adds to the chosen worker (bytes
    /// of the prompt it does not hold); 0 for policies that do not estimate.
    pub work: u64,
}

/// A routing policy. `select` is called on the request path for every
/// request, with a non-empty slice of healthy workers.
pub trait Policy: Send + Sync {
    /// Name as on the command line.
    fn name(&self) -> &'static str;
    /// Chooses one of `workers` (never empty).
    fn select(&self, workers: &[Arc<Worker>], input: &RouteInput<'_>) -> Selection;
    /// Whether the policy keeps an approximate radix tree of what it sent
    /// where: its choices are then worth telling other control planes.
    fn keeps_tree(&self) -> bool {
        false
    }
    /// Whether the policy prices the prefill queued on each worker
    /// ([`crate::workers::Worker::pending_work`]): a request's work should
    /// then leave the queue when its prefill ends, not when it does.
    fn prices_queued_prefill(&self) -> bool {
        false
    }
    /// Another control plane sent `text` to `worker`: a policy with a tree
    /// records it as it records its own choices.
    fn learn(&self, _worker: &Worker, _text: &[u8]) {}
    /// Forgets a removed worker.
    fn on_removed(&self, _worker: &Worker) {}
    /// Periodic upkeep (tree eviction), called every `--eviction-interval-secs`
    /// with every registered worker.
    fn maintain(&self, _registered: &[Arc<Worker>]) {}
}

/// Routing policy for choosing a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Uniformly random healthy worker.
    Random,
    /// Healthy workers in turn.
    RoundRobin,
    /// Two random healthy workers; the one with fewer requests in flight.
    PowerOfTwo,
    /// sglang-router's cache-aware policy: prefix match on approximate radix
    /// trees, shortest queue when loads are imbalanced.
    CacheAware,
    /// This router's own: the worker where the request is expected to
    /// start soonest, weighing the prefill its cache saves against the
    /// prefill work queued on it (see docs/cost-aware-policy.md).
    CostAware,
    /// sglang-router's sticky sessions: requests with the same
    /// `X-SMG-Routing-Key` header go to the same worker (another one only
    /// while it is unhealthy); requests without it as `--assignment-mode`.
    Manual,
    /// smg's: the worker with the fewest requests in flight, of all of
    /// them (ties at random).
    LeastLoad,
    /// smg's: requests whose routing text starts with the same
    /// `--prefix-token-count` × 4 bytes go to one worker (by hash), the
    /// next one for that prefix while it is overloaded.
    PrefixHash,
    /// smg's: requests with the same `X-SMG-Routing-Key` go to the worker
    /// the key hashes to among the healthy ones (only the keys of a worker
    /// that leaves move); requests without it to a random worker.
    ConsistentHashing,
    /// sglang-router's prefill policy for PD (`--prefill-policy` only):
    /// each prefill worker takes a range of prompt lengths, fitted every
    /// `--bucket-adjust-interval-secs` to share the characters equally.
    Bucket,
}

/// For each worker, the bytes of the request its tenant holds, in one pass
/// over the match (sorted by tenant) instead of a scan per worker.
pub(crate) fn matched_lens(matched: &PrefixMatch, workers: &[Arc<Worker>]) -> Vec<usize> {
    let mut held: Vec<(TenantId, usize)> = matched.iter().collect();
    held.sort_unstable_by_key(|(t, _)| *t);
    workers
        .iter()
        .map(|w| {
            held.binary_search_by_key(&w.tenant, |(t, _)| *t)
                .map_or(0, |i| held[i].1)
        })
        .collect()
}

/// The tree's `matched` lengths, with the exact ones (from the workers' KV
/// events) in their place where `input` has them.
pub(crate) fn with_exact(mut matched: Vec<usize>, input: &RouteInput<'_>) -> Vec<usize> {
    if let Some(exact) = input.exact {
        for (m, e) in matched.iter_mut().zip(exact) {
            if let Some(e) = e {
                *m = *e;
            }
        }
    }
    matched
}

/// The index of the least loaded worker among those `keep` accepts; ties
/// are broken at random so equal workers share traffic (sglang-router always
/// picks the first, which sends idle-time traffic to one worker).
pub(crate) fn least_loaded(workers: &[Arc<Worker>], keep: impl Fn(usize) -> bool) -> Option<usize> {
    lowest_at_random(workers.len(), |i| {
        keep(i).then(|| workers[i].routing_load())
    })
}

/// The index in `0..n` with the smallest key (`None` keys are skipped),
/// ties broken uniformly at random; `None` when no index has a key.
///
/// Two passes and one random draw: the minimum and how many share it, then
/// the chosen one among them. (Reservoir sampling drew a random number per
/// tie, which at 64 idle workers was a visible share of a decision.)
pub(crate) fn lowest_at_random<K: Ord + Copy>(
    n: usize,
    key: impl Fn(usize) -> Option<K>,
) -> Option<usize> {
    let mut min: Option<K> = None;
    let mut ties = 0usize;
    for k in (0..n).filter_map(&key) {
        match min {
            Some(m) if k > m => {}
            Some(m) if k == m => ties += 1,
            _ => (min, ties) = (Some(k), 1),
        }
    }
    let min = min?;
    let mut pick = if ties > 1 {
        rand::random_range(0..ties)
    } else {
        0
    };
    // Keys read again may have moved (loads change concurrently); then the
    // last candidate seen, or the first index with a key, wins.
    let mut last = None;
    for i in 0..n {
        if key(i).is_some_and(|k| k <= min) {
            if pick == 0 {
                return Some(i);
            }
            pick -= 1;
            last = Some(i);
        }
    }
    last.or_else(|| (0..n).find(|&i| key(i).is_some()))
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Arc;

    use crate::workers::{Worker, WorkerAddress, WorkerSpec};

    /// `n` healthy workers on loopback ports 1..=n, tenants 0..n.
    pub fn workers(n: usize) -> Vec<Arc<Worker>> {
        (0..n)
            .map(|i| {
                let port = i as u16 + 1;
                let w = Worker::new(
                    WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
                    WorkerSpec::REGULAR,
                    None,
                    Arc::default(),
                    i as u32,
                );
                w.set_healthy(true);
                Arc::new(w)
            })
            .collect()
    }

    /// Sets a worker's load to `n`.
    pub fn set_load(w: &Worker, n: usize) {
        while w.load() > n {
            w.decrement_load();
        }
        while w.load() < n {
            w.increment_load();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn least_loaded_picks_minimum_and_spreads_ties() {
        let ws = workers(3);
        set_load(&ws[0], 2);
        assert!(matches!(least_loaded(&ws, |_| true), Some(1 | 2)));
        let mut seen = [0; 3];
        for _ in 0..200 {
            seen[least_loaded(&ws, |_| true).unwrap()] += 1;
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1] > 40 && seen[2] > 40, "ties not spread: {seen:?}");
        assert_eq!(least_loaded(&ws, |i| i == 0), Some(0));
        assert_eq!(least_loaded(&ws, |_| false), None);
    }
}

/// Every load-reading policy routes on the engine's report merged with the
/// router's own sends: a worker whose engine holds 100 requests from
/// elsewhere is passed over while its own count is zero.
#[cfg(test)]
mod engine_load_tests {
    use super::test_support::workers;
    use super::*;

    fn policies() -> Vec<Box<dyn Policy>> {
        vec![
            Box::new(PowerOfTwo),
            // sglang-router's defaults: 100 against 0 is imbalanced.
            Box::new(CacheAware::new(CacheAwareConfig {
                cache_threshold: 0.3,
                balance_abs_threshold: 64,
                balance_rel_threshold: 1.5,
                max_tree_size: 1 << 20,
            })),
            Box::new(CostAware::new(CostAwareConfig::default())),
            Box::new(Manual::new(ManualConfig {
                max_idle: std::time::Duration::ZERO,
                assignment: AssignmentMode::MinLoad,
            })),
        ]
    }

    #[test]
    fn a_worker_busy_with_traffic_from_elsewhere_is_passed_over() {
        for p in policies() {
            let ws = workers(2);
            ws[0].engine.record(100);
            ws[1].engine.record(0);
            for i in 0..20 {
                let text = format!("distinct prompt number {i} for {}", p.name());
                let s = p.select(&ws, &RouteInput::of_text(text.as_bytes()));
                assert_eq!(
                    s.index,
                    1,
                    "{} sent request {i} to the busy worker",
                    p.name()
                );
                ws[1].increment_load();
            }
            // Its report lost: back to the router's own counts, which now
            // favour the other worker.
            ws[0].engine.forget();
            ws[1].engine.record(20);
            let s = p.select(&ws, &RouteInput::of_text(b"one more distinct prompt"));
            assert_eq!(s.index, 0, "{}", p.name());
        }
    }
}
