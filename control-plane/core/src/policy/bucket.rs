//! sglang-router's `bucket` prefill policy (`--prefill-policy bucket`,
//! `--bucket-adjust-interval-secs`): each prefill worker takes a range of
//! prompt lengths, so prompts of similar size batch together. The ranges
//! start as an even split of 0..4096 characters (the last one open-ended)
//! and are moved every interval so that each worker's range held an equal
//! share of the characters routed in the last interval. While the
//! characters routed to the workers in that window are imbalanced
//! (`--balance-abs-threshold` and `--balance-rel-threshold`, as the
//! cache-aware policy reads them), the worker with the fewest takes the
//! request instead.
//!
//! Buckets follow the workers in URL order, so a worker keeps its range
//! while others come and go; a change in the number of workers starts
//! again from the even split.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{CacheOutcome, Policy, RouteInput, Selection};
use crate::workers::Worker;

/// The first split covers prompts up to this many characters.
const INITIAL_SPAN: usize = 4096;

/// How the bucket policy behaves.
#[derive(Debug, Clone, Copy)]
pub struct BucketConfig {
    /// How often the ranges move, and the window they are fitted to.
    pub adjust_every: Duration,
    /// Imbalance when the most and fewest characters differ by more than
    /// this...
    pub balance_abs_threshold: usize,
    /// ...and the most is above this times the fewest.
    pub balance_rel_threshold: f32,
}

/// The bucket policy.
pub struct Bucket {
    config: BucketConfig,
    state: Mutex<State>,
}

struct State {
    /// Inclusive upper bound of each bucket but the last (ascending).
    cuts: Vec<usize>,
    /// The routed requests of the current window: when, how many
    /// characters, to which worker (URL).
    window: VecDeque<(Instant, usize, Arc<str>)>,
    last_adjust: Instant,
}

impl Bucket {
    /// A bucket policy with `config`.
    pub fn new(config: BucketConfig) -> Self {
        Bucket {
            config,
            state: Mutex::new(State {
                cuts: Vec::new(),
                window: VecDeque::new(),
                last_adjust: Instant::now(),
            }),
        }
    }

    /// The ranges' upper bounds now (for tests and logs).
    pub fn cuts(&self) -> Vec<usize> {
        self.state.lock().cuts.clone()
    }

    /// [`Policy::select`] at `now`.
    pub fn select_at(
        &self,
        workers: &[Arc<Worker>],
        input: &RouteInput<'_>,
        now: Instant,
    ) -> Selection {
        let chars = char_count(input.text);
        // Bucket i is the i-th worker in URL order.
        let mut order: Vec<usize> = (0..workers.len()).collect();
        order.sort_by(|a, b| workers[*a].url.cmp(&workers[*b].url));
        let mut s = self.state.lock();
        if s.cuts.len() + 1 != workers.len() {
            s.cuts = even_cuts(workers.len());
        }
        // The window holds one interval.
        while s
            .window
            .front()
            .is_some_and(|(t, _, _)| now.saturating_duration_since(*t) > self.config.adjust_every)
        {
            s.window.pop_front();
        }
        if now.saturating_duration_since(s.last_adjust) >= self.config.adjust_every {
            s.last_adjust = now;
            if let Some(cuts) = fitted_cuts(&s.window, workers.len()) {
                s.cuts = cuts;
            }
        }
        // Characters each worker was given in the window.
        let routed: Vec<usize> = workers
            .iter()
            .map(|w| {
                s.window
                    .iter()
                    .filter(|(_, _, url)| **url == *w.url)
                    .map(|(_, c, _)| c)
                    .sum()
            })
            .collect();
        let (most, fewest) = (
            routed.iter().copied().max().unwrap_or(0),
            routed.iter().copied().min().unwrap_or(0),
        );
        let imbalanced = most - fewest > self.config.balance_abs_threshold
            && most as f32 > self.config.balance_rel_threshold * fewest as f32;
        let index = if imbalanced {
            // The first of the least given, in URL order.
            order
                .iter()
                .copied()
                .min_by_key(|i| routed[*i])
                .unwrap_or(0)
        } else {
            let bucket = s.cuts.iter().take_while(|cut| chars > **cut).count();
            order[bucket.min(order.len() - 1)]
        };
        s.window
            .push_back((now, chars, Arc::from(workers[index].url.as_str())));
        Selection {
            index,
            cache: if imbalanced {
                CacheOutcome::Imbalanced
            } else {
                CacheOutcome::NotApplicable
            },
            work: 0,
        }
    }
}

impl Policy for Bucket {
    fn name(&self) -> &'static str {
        "bucket"
    }

    fn select(&self, workers: &[Arc<Worker>], input: &RouteInput<'_>) -> Selection {
        self.select_at(workers, input, Instant::now())
    }
}

/// Characters of UTF-8 `text` (bytes that do not continue a character).
fn char_count(text: &[u8]) -> usize {
    text.iter().filter(|b| (**b & 0xC0) != 0x80).count()
}

/// `n` buckets over 0..[`INITIAL_SPAN`], the last one open-ended.
fn even_cuts(n: usize) -> Vec<usize> {
    let gap = INITIAL_SPAN / n.max(1);
    (1..n).map(|i| i * gap - 1).collect()
}

/// Cuts that give each of `n` buckets an equal share of the window's
/// characters: bucket k ends at the prompt length where the running total
/// of the sorted lengths reaches k/n of the whole. `None` when the window
/// is empty (the cuts stay as they are).
fn fitted_cuts(window: &VecDeque<(Instant, usize, Arc<str>)>, n: usize) -> Option<Vec<usize>> {
    if window.is_empty() || n < 2 {
        return None;
    }
    let mut lengths: Vec<usize> = window.iter().map(|(_, c, _)| *c).collect();
    lengths.sort_unstable();
    let total: usize = lengths.iter().sum();
    let mut taken = lengths.iter();
    let (mut running, mut last) = (0usize, 0usize);
    let mut cuts: Vec<usize> = Vec::with_capacity(n - 1);
    for k in 1..n {
        let share = total / n * k + total % n * k / n;
        while running < share {
            let Some(&len) = taken.next() else { break };
            running += len;
            last = len;
        }
        // Strictly ascending, so every bucket keeps a range.
        let floor = cuts.last().map_or(0, |c| c + 1);
        cuts.push(last.max(floor));
    }
    Some(cuts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::workers;

    fn bucket(abs: usize) -> Bucket {
        Bucket::new(BucketConfig {
            adjust_every: Duration::from_secs(5),
            balance_abs_threshold: abs,
            balance_rel_threshold: 1.5,
        })
    }

    fn pick(b: &Bucket, ws: &[Arc<Worker>], chars: usize, at: Instant) -> usize {
        let text = "a".repeat(chars);
        b.select_at(ws, &RouteInput::of_text(text.as_bytes()), at)
            .index
    }

    #[test]
    fn prompts_go_to_the_bucket_of_their_length() {
        let ws = workers(3);
        let b = bucket(usize::MAX);
        let t = Instant::now();
        assert_eq!(pick(&b, &ws, 10, t), 0);
        assert_eq!(b.cuts(), [1364, 2729], "an even split of 0..4096");
        assert_eq!(pick(&b, &ws, 1364, t), 0);
        assert_eq!(pick(&b, &ws, 1365, t), 1);
        assert_eq!(pick(&b, &ws, 2730, t), 2);
        assert_eq!(
            pick(&b, &ws, 1_000_000, t),
            2,
            "the last bucket is open-ended"
        );
        // Characters, not bytes.
        let text = "é".repeat(1364);
        assert_eq!(
            b.select_at(&ws, &RouteInput::of_text(text.as_bytes()), t)
                .index,
            0
        );
    }

    #[test]
    fn ranges_move_to_share_the_last_interval_equally() {
        let ws = workers(3);
        let b = bucket(usize::MAX);
        let t = Instant::now();
        for chars in [5, 10, 15, 20, 24, 26] {
            pick(&b, &ws, chars, t);
        }
        // The next request after an interval fits the ranges to the window
        // (100 characters: a third is reached at 20, two thirds at 24).
        assert_eq!(pick(&b, &ws, 22, t + Duration::from_secs(5)), 1);
        assert_eq!(b.cuts(), [20, 24]);
        assert_eq!(pick(&b, &ws, 20, t + Duration::from_secs(5)), 0);
        assert_eq!(pick(&b, &ws, 25, t + Duration::from_secs(5)), 2);
        // Ten seconds later the window holds nothing older: the next fit
        // uses only what came since.
        let later = t + Duration::from_secs(11);
        assert_eq!(pick(&b, &ws, 100, later), 2);
        assert_eq!(b.cuts(), [20, 24], "nothing in the window, nothing moved");
    }

    #[test]
    fn imbalance_sends_the_request_to_the_worker_given_fewest_characters() {
        let ws = workers(2);
        let b = bucket(64);
        let t = Instant::now();
        assert_eq!(pick(&b, &ws, 3000, t), 1, "long prompts: the second bucket");
        // Worker 1 holds 3000 characters of the window, worker 0 none.
        assert_eq!(pick(&b, &ws, 3000, t), 0, "imbalanced: the least given");
        assert_eq!(pick(&b, &ws, 3000, t), 1);
    }

    #[test]
    fn a_change_in_the_number_of_workers_starts_from_the_even_split() {
        let b = bucket(usize::MAX);
        let t = Instant::now();
        pick(&b, &workers(2), 10, t);
        assert_eq!(b.cuts(), [2047]);
        pick(&b, &workers(4), 10, t);
        assert_eq!(b.cuts(), [1023, 2047, 3071]);
        pick(&b, &workers(1), 10, t);
        assert!(b.cuts().is_empty());
    }
}
