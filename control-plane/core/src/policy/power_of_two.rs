use std::sync::Arc;

use super::{CacheOutcome, Policy, RouteInput, Selection};
use crate::workers::Worker;

/// Two distinct random workers; the one with fewer requests in flight.
///
/// Loads are [`Worker::routing_load`]: the engine's last report plus what
/// this router sent since, updated at decision time, so a burst cannot pile
/// onto a worker that looked idle at the last poll (sglang-router 0.3.2
/// compares the last `/get_load` alone), and traffic from elsewhere counts.
pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn select(&self, workers: &[Arc<Worker>], _input: &RouteInput<'_>) -> Selection {
        let n = workers.len();
        let index = if n == 1 {
            0
        } else {
            let a = rand::random_range(0..n);
            let b = (a + rand::random_range(1..n)) % n;
            if workers[b].routing_load() < workers[a].routing_load() {
                b
            } else {
                a
            }
        };
        Selection {
            index,
            cache: CacheOutcome::NotApplicable,
            work: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::{set_load, workers};

    #[test]
    fn never_picks_the_busier_of_two() {
        let ws = workers(2);
        set_load(&ws[0], 5);
        for _ in 0..50 {
            assert_eq!(PowerOfTwo.select(&ws, &RouteInput::of_text(b"")).index, 1);
        }
    }
}
