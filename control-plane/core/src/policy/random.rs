use std::sync::Arc;

use super::{CacheOutcome, Policy, RouteInput, Selection};
use crate::workers::Worker;

/// A uniformly random healthy worker.
pub struct Random;

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn select(&self, workers: &[Arc<Worker>], _input: &RouteInput<'_>) -> Selection {
        Selection {
            index: rand::random_range(0..workers.len()),
            cache: CacheOutcome::NotApplicable,
            work: 0,
        }
    }
}
