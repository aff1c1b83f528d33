use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{CacheOutcome, Policy, RouteInput, Selection};
use crate::workers::Worker;

/// Healthy workers in turn.
#[derive(Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn select(&self, workers: &[Arc<Worker>], _input: &RouteInput<'_>) -> Selection {
        Selection {
            index: self.next.fetch_add(1, Ordering::Relaxed) % workers.len(),
            cache: CacheOutcome::NotApplicable,
            work: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::workers;

    #[test]
    fn cycles_through_workers() {
        let ws = workers(3);
        let rr = RoundRobin::default();
        let input = RouteInput::of_text(b"");
        let picks: Vec<usize> = (0..6).map(|_| rr.select(&ws, &input).index).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }
}
