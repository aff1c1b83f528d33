use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;

use super::{
    lowest_at_random, matched_lens, spill_gate, with_exact, CacheOutcome, Policy, RouteInput,
    Selection,
};
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
    /// requests are prefilled (a stream's first bytes) or end (a whole
    /// answer). Below 1 the policy stays longer with workers that hold the
    /// prefix (more cache hits) before replicating it.
    pub queue_weight: f64,
    /// Whether the prefill under way on a worker counts only for what is
    /// left of it, by the pace the worker's prefill reports showed
    /// ([`crate::workers::PrefillQueue`]); else it counts in full until
    /// its report.
    pub prefill_progress: bool,
    /// Matches shorter than this many bytes count as none: they are under
    /// a KV page (a token is ~4 bytes), and following them would pile
    /// unrelated prompts onto one worker's cache for no saving.
    pub min_match: usize,
    /// Whether a worker far above the fleet's mean of requests in flight is
    /// passed over, however cheap its cache makes it (`spill_gate.rs`;
    /// only where the tree's estimate, not KV events, gives the matches).
    pub spill_gate: bool,
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
            spill_gate: true,
            prefill_progress: true,
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
    /// Decisions made so far: the clock of `last_chosen`.
    decisions: AtomicU64,
    /// When each worker (by tree tenant) was last chosen, on that clock.
    last_chosen: DashMap<u32, u64>,
}

impl CostAware {
    /// A policy with an empty tree.
    pub fn new(config: CostAwareConfig) -> Self {
        CostAware {
            config,
            tree: Tree::new(),
            decisions: AtomicU64::new(0),
            last_chosen: DashMap::new(),
        }
    }

    /// A prompt every worker holds about the same amount of (none, or a
    /// template's opening words: within [`CostAwareConfig::min_match`],
    /// under a KV page) is pure balancing: its prefill costs about the same
    /// everywhere. The work in flight is then a poor guide, since
    /// it cannot tell a request still prefilling from one decoding (the
    /// prefill lane is free behind it); the fewest requests in flight, and
    /// among those the worker chosen longest ago (whose requests are the
    /// oldest, most likely past their prefill), is a better one. Key of
    /// each worker, lowest wins.
    fn cold_keys(&self, workers: &[Arc<Worker>]) -> Vec<(u64, usize)> {
        workers
            .iter()
            .map(|w| {
                let last = self.last_chosen.get(&w.tenant).map_or(0, |t| *t);
                (w.routing_load() as u64, last as usize)
            })
            .collect()
    }

    /// Each worker's cached prefix of the request (bytes; the events'
    /// exact count where `input` has one, else the tree's guess), and
    /// other matches for the choice to follow, if any.
    ///
    /// They differ in one case: the events say no worker holds more of the
    /// prompt than another (it was evicted everywhere, or its worker
    /// restarted), while the tree remembers where it was sent. The choice
    /// then follows the tree: the prompt goes back to its old worker,
    /// beside the prompts sent with it, instead of landing wherever the
    /// load is lowest and evicting some other prompt's pages there. Each
    /// prompt keeps one home, and small caches stop trading prompts. The
    /// work counted is still priced on the exact match.
    fn matches(
        &self,
        workers: &[Arc<Worker>],
        input: &RouteInput<'_>,
    ) -> (Vec<usize>, Option<Vec<usize>>) {
        if input.text.is_empty() {
            return (vec![0; workers.len()], None);
        }
        let floor = |m: usize| if m < self.config.min_match { 0 } else { m };
        let tree = matched_lens(&self.tree.match_prefix(input.text), workers);
        if input.exact.is_none() {
            return (tree.into_iter().map(floor).collect(), None);
        }
        let exact: Vec<usize> = with_exact(tree.clone(), input)
            .into_iter()
            .map(floor)
            .collect();
        let hint = self
            .is_cold(&exact)
            .then(|| tree.into_iter().map(floor).collect());
        (exact, hint)
    }

    /// Whether no worker holds more of the prompt than another, by
    /// `matched`: a choice of balance alone.
    fn is_cold(&self, matched: &[usize]) -> bool {
        let spread = matched.iter().max().zip(matched.iter().min());
        spread.is_none_or(|(hi, lo)| hi - lo < self.config.min_match)
    }

    /// Requests in flight are priced by `load(w)`, the worker's
    /// [`Worker::routing_load`]: requests its engine reports that this
    /// router did not send (another router's, or sent to it directly) cost
    /// `per_request_cost` each, as a request of this router's does beyond
    /// its work. Pricing them at the mean work of this router's requests
    /// was measured worse with two routers in front of one fleet
    /// (docs/cost-aware-policy.md).
    ///
    /// The work queued is what is left of it at `now` where
    /// [`CostAwareConfig::prefill_progress`] says so.
    fn cost(&self, w: &Worker, uncached: u64, now: Option<(Instant, Option<f64>)>) -> u64 {
        let work = if let Some((now, fleet_pace)) = now {
            w.remaining_work(now, fleet_pace)
        } else {
            w.pending_work()
        };
        let queued = (work as f64 * self.config.queue_weight) as u64;
        uncached
            .saturating_add(queued)
            .saturating_add(w.routing_load() as u64 * self.config.per_request_cost)
    }
}

/// The mean prefill pace of the `workers` that have reported one: the
/// guess for those that have not.
fn fleet_pace(workers: &[Arc<Worker>]) -> Option<f64> {
    let paces: Vec<f64> = workers.iter().filter_map(|w| w.prefill_pace()).collect();
    (!paces.is_empty()).then(|| paces.iter().sum::<f64>() / paces.len() as f64)
}

impl Policy for CostAware {
    fn name(&self) -> &'static str {
        "cost_aware"
    }

    fn select(&self, workers: &[Arc<Worker>], input: &RouteInput<'_>) -> Selection {
        let text = input.text;
        let len = text.len() as u64;
        let (matched, hint) = self.matches(workers, input);
        let guide = hint.as_ref().unwrap_or(&matched);
        // Lowest (cost, load) wins; among equals the smaller tree, then at
        // random. Tree sizes are read only for the tied few.
        let keys: Vec<(u64, usize)> = if self.is_cold(guide) {
            self.cold_keys(workers)
        } else {
            let now = self
                .config
                .prefill_progress
                .then(|| (Instant::now(), fleet_pace(workers)));
            let mut keys: Vec<(u64, usize)> = workers
                .iter()
                .zip(guide)
                .map(|(w, &m)| {
                    let uncached = len.saturating_sub(m as u64);
                    (self.cost(w, uncached, now), w.routing_load())
                })
                .collect();
            // A worker far above the mean of requests in flight is passed
            // over, however cheap its cache makes it (`spill_gate.rs`).
            // Not where KV events give the exact matches: there, behind two
            // routers, it measured worse (docs/cost-aware-policy.md).
            if self.config.spill_gate && input.exact.is_none() {
                let limit = spill_gate::limit(keys.iter().map(|k| k.1));
                // Read for the debug line only: not on every decision.
                let cheapest = tracing::enabled!(tracing::Level::DEBUG)
                    .then(|| keys.iter().map(|k| k.0).min().unwrap_or_default());
                for (w, key) in workers.iter().zip(keys.iter_mut()) {
                    if key.1 as f64 > limit {
                        // Why a warm worker lost a prompt it held (a
                        // replication the price alone would not make).
                        tracing::debug!(
                            worker = %w.url, in_flight = key.1, limit, cost = key.0,
                            cheapest = cheapest.unwrap_or_default(), queued = w.pending_work(),
                            "spill gate passed over a worker"
                        );
                        key.0 = u64::MAX;
                    }
                }
            }
            keys
        };
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
        if let Some(w) = workers.get(index) {
            let now = self.decisions.fetch_add(1, Ordering::Relaxed) + 1;
            self.last_chosen.insert(w.tenant, now);
            if !text.is_empty() {
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

    fn keeps_tree(&self) -> bool {
        true
    }

    fn prices_queued_prefill(&self) -> bool {
        true
    }

    fn learn(&self, worker: &Worker, text: &[u8]) {
        if !text.is_empty() {
            self.tree.insert(text, worker.tenant);
        }
    }

    fn on_removed(&self, worker: &Worker) {
        self.tree.remove_tenant(worker.tenant);
        self.last_chosen.remove(&worker.tenant);
    }

    fn maintain(&self, registered: &[Arc<Worker>]) {
        self.tree
            .retain_tenants(|t| registered.iter().any(|w| w.tenant == t));
        self.last_chosen
            .retain(|t, _| registered.iter().any(|w| w.tenant == *t));
        self.tree.evict_to(self.config.max_tree_size);
    }
}

#[cfg(test)]
mod tests;
