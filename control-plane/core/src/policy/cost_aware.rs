use std::sync::Arc;

use super::{lowest_at_random, matched_lens, CacheOutcome, Policy, RouteInput, Selection};
use crate::tree::Tree;
use crate::workers::Worker;

/// Tuning of the cost-aware policy.
#[derive(Debug, Clone, Copy)]
pub struct CostAwareConfig {
    /// Cost of one request in flight beyond its prefill (decode slots,
    /// batching), in prompt bytes.
    pub per_request_cost: u64,
    /// Per-worker tree size kept by eviction.
    pub max_tree_size: usize,
    /// Weight of the work already queued on a worker against the prefill
    /// this request would do there. Queued work is counted until its
    /// requests end, decode included, so it overstates the real prefill
    /// queue; below 1 the policy stays longer with workers that hold the
    /// prefix (more cache hits) before replicating it.
    pub queue_weight: f64,
    /// Matches shorter than this many bytes count as none: they are under
    /// a KV page (a token is ~4 bytes), and following them would pile
    /// unrelated prompts onto one worker's cache for no saving.
    pub min_match: usize,
}

/// Default of [`CostAwareConfig::min_match`]: a few tokens.
pub const MIN_MATCH: usize = 32;

/// Shipped [`CostAwareConfig::per_request_cost`] (`--cost-per-request`).
pub const PER_REQUEST_COST: u64 = 32;

/// Shipped [`CostAwareConfig::queue_weight`] (`--cost-queue-weight`).
pub const QUEUE_WEIGHT: f64 = 0.5;

/// Shipped [`CostAwareConfig::max_tree_size`] (`--max-tree-size`, shared
/// with `cache_aware`): 64 MiB of text per worker.
pub const MAX_TREE_SIZE: usize = 64 << 20;

impl Default for CostAwareConfig {
    /// The weights the control plane ships with (its flags' defaults).
    fn default() -> Self {
        CostAwareConfig {
            per_request_cost: PER_REQUEST_COST,
            max_tree_size: MAX_TREE_SIZE,
            queue_weight: QUEUE_WEIGHT,
            min_match: MIN_MATCH,
        }
    }
}

/// Chooses the worker where the request is expected to start soonest.
///
/// sglang-router's `cache_aware` switches between two modes on thresholds:
/// follow the longest prefix match (if it covers 30% of the prompt), else
/// the smallest tree, unless loads differ by more than 64 requests, then the
/// shortest queue. A long system prompt shared by everyone sends every
/// request to one worker until that absolute threshold trips.
///
/// This policy instead prices each worker in one unit, prompt bytes of
/// prefill: the part of this prompt the worker does not hold (its cost to
/// prefill here) plus the prefill work already queued on it (the uncached
/// bytes of its requests in flight) plus a small cost per request in
/// flight. The cheapest worker wins. A worker holding the prefix wins while
/// its queue is shorter than the prefill the prefix saves; once its queue
/// costs more than prefilling from scratch elsewhere, the request goes to
/// another worker, which then holds the prefix too, so hot prefixes get
/// replicated exactly as far as load requires. Ties go to the less loaded
/// worker, then to the smaller tree (more room for new prefixes, as
/// `cache_aware` does on a miss), then at random.
pub struct CostAware {
    config: CostAwareConfig,
    tree: Tree,
}

impl CostAware {
    /// A policy with an empty tree.
    pub fn new(config: CostAwareConfig) -> Self {
        CostAware {
            config,
            tree: Tree::new(),
        }
    }

    fn cost(&self, w: &Worker, uncached: u64) -> u64 {
        let queued = (w.pending_work() as f64 * self.config.queue_weight) as u64;
        uncached
            .saturating_add(queued)
            .saturating_add(w.routing_load() as u64 * self.config.per_request_cost)
    }
}

impl Policy for CostAware {
    fn name(&self) -> &'static str {
        "cost_aware"
    }

    fn select(&self, workers: &[Arc<Worker>], input: &RouteInput<'_>) -> Selection {
        let text = input.text;
        let len = text.len() as u64;
        let matched: Vec<usize> = if text.is_empty() {
            vec![0; workers.len()]
        } else {
            matched_lens(&self.tree.match_prefix(text), workers)
                .into_iter()
                .map(|m| if m < self.config.min_match { 0 } else { m })
                .collect()
        };
        // Lowest (cost, load) wins; among equals the smaller tree, then at
        // random. Tree sizes are read only for the tied few.
        let keys: Vec<(u64, usize)> = workers
            .iter()
            .zip(&matched)
            .map(|(w, &m)| (self.cost(w, len.saturating_sub(m as u64)), w.routing_load()))
            .collect();
        let best = keys.iter().copied().min().unwrap_or_default();
        let tied: Vec<usize> = (0..keys.len()).filter(|&i| keys[i] == best).collect();
        let index = if tied.len() > 1 {
            let sizes: Vec<usize> = tied
                .iter()
                .map(|&i| self.tree.tenant_size(workers[i].tenant))
                .collect();
            tied[lowest_at_random(sizes.len(), |i| Some(sizes[i])).unwrap_or(0)]
        } else {
            tied.first().copied().unwrap_or(0)
        };
        let held = matched.get(index).copied().unwrap_or(0);
        if !text.is_empty() {
            if let Some(w) = workers.get(index) {
                self.tree.insert(text, w.tenant);
            }
        }
        Selection {
            index,
            cache: if held > 0 {
                CacheOutcome::Hit
            } else {
                CacheOutcome::Miss
            },
            work: len.saturating_sub(held as u64),
        }
    }

    fn on_removed(&self, worker: &Worker) {
        self.tree.remove_tenant(worker.tenant);
    }

    fn maintain(&self, registered: &[Arc<Worker>]) {
        self.tree
            .retain_tenants(|t| registered.iter().any(|w| w.tenant == t));
        self.tree.evict_to(self.config.max_tree_size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::workers;
    use crate::workers::Sent;

    /// The policy with the weights the control plane ships with.
    fn policy() -> CostAware {
        CostAware::new(CostAwareConfig::default())
    }

    fn pick(p: &CostAware, ws: &[Arc<Worker>], text: &str) -> Selection {
        pick_sent(p, ws, text).0
    }

    /// [`pick`], with what ends the request.
    fn pick_sent(p: &CostAware, ws: &[Arc<Worker>], text: &str) -> (Selection, Sent) {
        let s = p.select(ws, &RouteInput::of_text(text.as_bytes()));
        let sent = ws[s.index].start(s.work);
        (s, sent)
    }

    #[test]
    fn distinct_prompts_spread_and_count_their_work() {
        let p = policy();
        let ws = workers(3);
        let mut used = [0; 3];
        for i in 0..3 {
            let prompt = format!("{i} some unrelated prompt");
            let s = pick(&p, &ws, &prompt);
            assert_eq!(s.cache, CacheOutcome::Miss);
            assert_eq!(s.work, prompt.len() as u64);
            used[s.index] += 1;
        }
        assert_eq!(used, [1, 1, 1]);
    }

    #[test]
    fn sequential_distinct_prompts_with_tiny_common_prefixes_spread() {
        // Idle workers (every request finished before the next): a 2-byte
        // common prefix ("00") is no reason to pile everything on one cache.
        let p = policy();
        let ws = workers(3);
        let mut used = [0; 3];
        for i in 0..30 {
            let (s, sent) = pick_sent(
                &p,
                &ws,
                &format!("{i:03} distinct prompt {}", "x".repeat(i % 7)),
            );
            ws[s.index].finish(s.work, sent);
            used[s.index] += 1;
        }
        assert!(used.iter().all(|&n| n >= 6), "{used:?}");
    }

    #[test]
    fn a_shared_prefix_stays_while_its_queue_is_cheaper_then_replicates() {
        let p = policy();
        let ws = workers(2);
        let system = "S".repeat(1000);
        let (first, sent) = pick_sent(&p, &ws, &format!("{system} q00"));
        let holder = first.index;
        ws[holder].finish(first.work, sent);
        // The holder prefills only the tail, so it takes the follow-ups
        // even with several of them in flight.
        for i in 1..10 {
            let s = pick(&p, &ws, &format!("{system} q{i:02}"));
            assert_eq!(s.index, holder, "follow-up {i}");
            assert_eq!(s.cache, CacheOutcome::Hit);
            assert!(s.work <= 3, "only the tail is new: {}", s.work);
        }
        // A long prefill queued on the holder costs more than prefilling the
        // whole prompt elsewhere: the prefix replicates to the other worker.
        ws[holder].start(5000);
        let moved = pick(&p, &ws, &format!("{system} q10"));
        assert_ne!(moved.index, holder);
        assert_eq!(moved.work, 1004, "the other worker prefills it all");
        // From now on both hold it: the next one is cheap on the other too.
        let next = pick(&p, &ws, &format!("{system} q11"));
        assert_eq!(next.index, moved.index);
        assert!(next.work <= 3);
    }
}
