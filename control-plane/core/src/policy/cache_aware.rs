use std::sync::Arc;

use super::{least_loaded, matched_lens, with_exact, CacheOutcome, Policy, RouteInput, Selection};
use crate::tree::Tree;
use crate::workers::Worker;

/// Thresholds of the cache-aware policy (sglang-router's meaning).
#[derive(Debug, Clone, Copy)]
pub struct CacheAwareConfig {
    /// Match rate above which the best-matching worker is chosen.
    pub cache_threshold: f32,
    /// Imbalanced when max load - min load exceeds this...
    pub balance_abs_threshold: usize,
    /// ...and max load exceeds min load times this.
    pub balance_rel_threshold: f32,
    /// Per-worker tree size kept by eviction.
    pub max_tree_size: usize,
}

/// sglang-router's cache-aware policy.
///
/// When loads are balanced: the worker whose approximate tree holds the
/// longest prefix of the request, if that prefix covers more than
/// `cache_threshold` of it; otherwise the worker with the smallest tree (most
/// room in its cache). When loads are imbalanced: the least loaded worker.
/// Either way the request's text is then recorded in the chosen worker's tree.
/// Ties go to the less loaded worker, then at random.
pub struct CacheAware {
    config: CacheAwareConfig,
    tree: Tree,
}

impl CacheAware {
    /// A policy with an empty tree.
    pub fn new(config: CacheAwareConfig) -> Self {
        CacheAware {
            config,
            tree: Tree::new(),
        }
    }

    fn imbalanced(&self, workers: &[Arc<Worker>]) -> bool {
        let (mut min, mut max) = (usize::MAX, 0);
        for w in workers {
            let l = w.routing_load();
            min = min.min(l);
            max = max.max(l);
        }
        max.saturating_sub(min) > self.config.balance_abs_threshold
            && max as f32 > min as f32 * self.config.balance_rel_threshold
    }

    fn choose(&self, workers: &[Arc<Worker>], input: &RouteInput<'_>) -> (usize, CacheOutcome) {
        let text = input.text;
        let any = |_| true;
        if text.is_empty() {
            return (least_loaded(workers, any).unwrap_or(0), CacheOutcome::Miss);
        }
        if self.imbalanced(workers) {
            return (
                least_loaded(workers, any).unwrap_or(0),
                CacheOutcome::Imbalanced,
            );
        }
        let matched = with_exact(matched_lens(&self.tree.match_prefix(text), workers), input);
        let best = matched.iter().copied().max().unwrap_or(0);
        let rate = best as f32 / text.len() as f32;
        if best > 0 && rate > self.config.cache_threshold {
            let index = least_loaded(workers, |i| matched[i] == best);
            return (index.unwrap_or(0), CacheOutcome::Hit);
        }
        let sizes: Vec<usize> = workers
            .iter()
            .map(|w| self.tree.tenant_size(w.tenant))
            .collect();
        let smallest = sizes.iter().copied().min().unwrap_or(0);
        let index = least_loaded(workers, |i| sizes[i] == smallest);
        (index.unwrap_or(0), CacheOutcome::Miss)
    }
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn select(&self, workers: &[Arc<Worker>], input: &RouteInput<'_>) -> Selection {
        let (index, cache) = self.choose(workers, input);
        if !input.text.is_empty() {
            if let Some(w) = workers.get(index) {
                self.tree.insert(input.text, w.tenant);
            }
        }
        Selection {
            index,
            cache,
            work: 0,
        }
    }

    fn keeps_tree(&self) -> bool {
        true
    }

    fn learn(&self, worker: &Worker, text: &[u8]) {
        if !text.is_empty() {
            self.tree.insert(text, worker.tenant);
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
    use crate::policy::test_support::{set_load, workers};

    fn policy() -> CacheAware {
        CacheAware::new(CacheAwareConfig {
            cache_threshold: 0.3,
            balance_abs_threshold: 4,
            balance_rel_threshold: 1.5,
            max_tree_size: 1 << 20,
        })
    }

    fn pick(p: &CacheAware, ws: &[Arc<Worker>], text: &str) -> Selection {
        p.select(ws, &RouteInput::of_text(text.as_bytes()))
    }

    #[test]
    fn exact_matches_from_kv_events_override_the_tree() {
        let p = policy();
        let ws = workers(2);
        let prompt = "system prompt ".repeat(20);
        let first = pick(&p, &ws, &prompt).index;
        let exact = if first == 0 {
            [Some(0), Some(prompt.len())]
        } else {
            [Some(prompt.len()), Some(0)]
        };
        let input = RouteInput {
            exact: Some(&exact),
            ..RouteInput::of_text(prompt.as_bytes())
        };
        let s = p.select(&ws, &input);
        assert_eq!(s.index, 1 - first);
        assert_eq!(s.cache, CacheOutcome::Hit);
    }

    #[test]
    fn shared_prefix_sticks_to_one_worker() {
        let p = policy();
        let ws = workers(4);
        let prefix = "system prompt ".repeat(20);
        let first = pick(&p, &ws, &format!("{prefix} question 0")).index;
        for i in 1..20 {
            let s = pick(&p, &ws, &format!("{prefix} question {i}"));
            assert_eq!(s.index, first);
            assert_eq!(s.cache, CacheOutcome::Hit);
        }
    }

    #[test]
    fn distinct_prompts_spread_to_smallest_trees() {
        let p = policy();
        let ws = workers(4);
        let mut used = [false; 4];
        for i in 0..4 {
            let s = pick(&p, &ws, &format!("{i} unrelated prompt number {i}"));
            assert_eq!(s.cache, CacheOutcome::Miss);
            used[s.index] = true;
        }
        assert_eq!(used, [true; 4], "each new prompt goes to an empty tree");
    }

    #[test]
    fn imbalance_overrides_cache_affinity() {
        let p = policy();
        let ws = workers(2);
        let text = "a long shared prefix that matches well";
        let first = pick(&p, &ws, text).index;
        set_load(&ws[first], 10);
        let s = pick(&p, &ws, text);
        assert_eq!(s.cache, CacheOutcome::Imbalanced);
        assert_ne!(s.index, first);
    }

    #[test]
    fn upkeep_drops_tenants_of_unregistered_workers_and_trims_trees() {
        let p = CacheAware::new(CacheAwareConfig {
            max_tree_size: 8,
            ..policy().config
        });
        let ws = workers(2);
        pick(&p, &ws, "first prompt, long enough to trim");
        pick(&p, &ws, "second prompt, long enough to trim");
        // Worker 1 is gone from the registry: only worker 0 is passed.
        p.maintain(&ws[..1]);
        assert_eq!(p.tree.tenant_size(ws[1].tenant), 0);
        assert!(p.tree.tenant_size(ws[0].tenant) <= 8);
    }

    #[test]
    fn a_prompt_another_control_plane_sent_follows_it() {
        let p = policy();
        let ws = workers(4);
        let prefix = "system prompt ".repeat(20);
        // Each worker but the last gets a prompt of its own, so the
        // smallest tree (where a miss goes) is the last one's.
        for (i, w) in ws.iter().take(3).enumerate() {
            p.learn(w, format!("{i} other prompt").as_bytes());
        }
        p.learn(&ws[1], format!("{prefix} question 0").as_bytes());
        let s = pick(&p, &ws, &format!("{prefix} question 1"));
        assert_eq!((s.index, s.cache), (1, CacheOutcome::Hit));
        assert!(p.keeps_tree());
    }

    #[test]
    fn removed_worker_is_forgotten() {
        let p = policy();
        let ws = workers(2);
        let text = "prefix held by one worker only";
        let first = pick(&p, &ws, text).index;
        p.on_removed(&ws[first]);
        assert_eq!(p.tree.tenant_size(ws[first].tenant), 0);
    }
}
