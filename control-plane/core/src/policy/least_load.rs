use std::sync::Arc;

use super::{least_loaded, CacheOutcome, Policy, RouteInput, Selection};
use crate::workers::Worker;

/// smg's `least_load` policy: every request goes to the worker with the
/// least load, scanning them all (where `power_of_two` compares two).
///
/// smg 1.13.0 scores each worker's expected wait from the loads its
/// workers report (`(queued + dispatched tokens) / throughput` plus a
/// KV-pressure term, tuned by the `--least-load-*` flags), and when no
/// worker reports any, picks the fewest requests in flight. Here the load
/// is [`Worker::routing_load`], the same one every other policy reads: the
/// requests running and waiting in the engine's last report plus those sent
/// since (or the router's own in-flight count without a report), counted at
/// each decision so a burst cannot pile onto a worker that looked idle.
/// Requests, not tokens: the `--least-load-*` flags are accepted and checked
/// as smg checks them, and change nothing here.
///
/// Ties go to a worker at random, not to the first as in smg, so an idle
/// fleet shares sequential traffic instead of sending it all to one worker.
pub struct LeastLoad;

impl Policy for LeastLoad {
    fn name(&self) -> &'static str {
        "least_load"
    }

    fn select(&self, workers: &[Arc<Worker>], _input: &RouteInput<'_>) -> Selection {
        Selection {
            index: least_loaded(workers, |_| true).unwrap_or(0),
            cache: CacheOutcome::NotApplicable,
            work: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::{set_load, workers};

    fn pick(ws: &[Arc<Worker>]) -> usize {
        LeastLoad.select(ws, &RouteInput::of_text(b"x")).index
    }

    #[test]
    fn picks_the_least_loaded_of_all_workers() {
        let ws = workers(5);
        for (w, load) in ws.iter().zip([4, 3, 7, 1, 2]) {
            set_load(w, load);
        }
        for _ in 0..50 {
            assert_eq!(pick(&ws), 3);
        }
        set_load(&ws[3], 9);
        assert_eq!(pick(&ws), 4, "follows the loads as they change");
    }

    #[test]
    fn counts_its_own_decisions_and_fills_workers_evenly() {
        // Each decision's request is counted before the next decision (as
        // the engine does): a burst spreads one by one.
        let ws = workers(3);
        for _ in 0..9 {
            ws[pick(&ws)].increment_load();
        }
        let loads: Vec<usize> = ws.iter().map(|w| w.load()).collect();
        assert_eq!(loads, [3, 3, 3]);
    }

    #[test]
    fn equal_workers_share_traffic() {
        let ws = workers(3);
        let mut seen = [0; 3];
        for _ in 0..150 {
            seen[pick(&ws)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 20), "{seen:?}");
    }
}
