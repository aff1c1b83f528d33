//! One worker's queue of prefill work, and how fast the worker drains it.
//!
//! The router counts each request's estimated prefill work (uncached
//! prompt bytes) from the moment it is sent until its worker reports it
//! prefilled (a stream's first bytes) or it ends. Counted that way, a
//! prefill that is nearly done weighs as much as one that has not started,
//! and a follow-up that would have waited a few milliseconds for it is
//! priced as if it had to wait the whole prefill.
//!
//! The reports tell how fast a worker prefills: between two of them (or
//! since its queue filled) it prefilled the reported request's work. The
//! queue keeps the decayed sums of both, its pace, and credits the request
//! at its head with what that pace has prefilled since the last report,
//! never more than the head's own work: a report that is late says
//! nothing about the requests behind it. With several prefill lanes the
//! pace is the lanes' sum, and crediting one head at it stays on the side
//! of the old count.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How much of the past pace each new report keeps: about the last ten
/// reports count.
const PACE_DECAY: f64 = 0.9;

/// The prefill work queued on one worker (see the module's doc).
#[derive(Debug, Default)]
pub struct PrefillQueue {
    /// Work of each request not yet prefilled, in the order they were
    /// sent (a worker prefills in about that order).
    works: VecDeque<u64>,
    /// Their sum.
    total: u64,
    /// Since when the head has been prefilling, by the router's clock:
    /// the last report, or when the queue filled; `None` while empty.
    head_since: Option<Instant>,
    /// Decayed sums of the work reported prefilled and of the busy time it
    /// took: their ratio is the worker's pace.
    reported_bytes: f64,
    reported_secs: f64,
}

impl PrefillQueue {
    /// Queues a request's `work`, sent at `now`.
    pub fn push(&mut self, work: u64, now: Instant) {
        if work == 0 {
            return;
        }
        if self.works.is_empty() {
            self.head_since = Some(now);
        }
        self.works.push_back(work);
        self.total = self.total.saturating_add(work);
    }

    /// A request of `work` was reported prefilled at `now`: it leaves the
    /// queue, the time since the last report teaches the pace, and the
    /// next request is taken to start now.
    pub fn prefilled(&mut self, work: u64, now: Instant) {
        if !self.remove(work) {
            return;
        }
        if let Some(since) = self.head_since {
            let secs = now.saturating_duration_since(since).as_secs_f64();
            self.reported_bytes = self.reported_bytes * PACE_DECAY + work as f64;
            self.reported_secs = self.reported_secs * PACE_DECAY + secs;
        }
        self.head_since = (!self.works.is_empty()).then_some(now);
    }

    /// A request of `work` ended before any report of its prefill (a whole
    /// answer, or a failure): it leaves the queue, teaching nothing.
    pub fn ended(&mut self, work: u64) {
        if self.remove(work) && self.works.is_empty() {
            self.head_since = None;
        }
    }

    /// The work queued, all of it counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The work still to prefill at `now`: [`PrefillQueue::total`] less what
    /// the pace says the head has prefilled since it started. A worker that
    /// has not reported yet goes at `fallback` (its siblings' pace: a fleet
    /// is mostly one kind of GPU), if any.
    pub fn remaining(&self, now: Instant, fallback: Option<f64>) -> u64 {
        let (Some(since), Some(&head)) = (self.head_since, self.works.front()) else {
            return self.total;
        };
        let elapsed = now.saturating_duration_since(since).as_secs_f64();
        let done = self.pace().or(fallback).map_or(0.0, |p| p * elapsed);
        self.total - (done as u64).min(head)
    }

    /// Bytes prefilled per second, once a report with measurable time has
    /// taught it.
    pub fn pace(&self) -> Option<f64> {
        (self.reported_secs > Duration::from_micros(100).as_secs_f64())
            .then(|| self.reported_bytes / self.reported_secs)
    }

    /// Takes the oldest request of `work` off the queue; false when none
    /// is queued (already released).
    fn remove(&mut self, work: u64) -> bool {
        let Some(at) = self.works.iter().position(|&w| w == work) else {
            return false;
        };
        self.works.remove(at);
        self.total -= work;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn without_a_report_everything_queued_counts() {
        let t0 = Instant::now();
        let mut q = PrefillQueue::default();
        q.push(1000, t0);
        q.push(0, t0);
        q.push(500, t0);
        assert_eq!((q.total(), q.remaining(t0 + ms(900), None)), (1500, 1500));
        // At a sibling's pace of 1 byte per ms, 900 of the head's 1000.
        assert_eq!(q.remaining(t0 + ms(900), Some(1000.0)), 600);
        assert_eq!(q.pace(), None);
    }

    #[test]
    fn reports_teach_the_pace_and_the_head_is_credited_with_it() {
        let t0 = Instant::now();
        let mut q = PrefillQueue::default();
        q.push(1000, t0);
        q.push(2000, t0 + ms(10));
        q.push(3000, t0 + ms(20));
        // The first took 100 ms: 10 bytes per ms.
        q.prefilled(1000, t0 + ms(100));
        assert_eq!(q.pace().map(f64::round), Some(10_000.0));
        // The second has been prefilling since then: 150 ms of 200.
        assert_eq!(q.remaining(t0 + ms(250), None), 5000 - 1500);
        // Never credited beyond the head's own work.
        assert_eq!(q.remaining(t0 + ms(900), None), 3000);
        q.prefilled(2000, t0 + ms(300));
        assert_eq!(q.remaining(t0 + ms(300), None), 3000);
        q.prefilled(3000, t0 + ms(600));
        assert_eq!((q.total(), q.remaining(t0 + ms(700), None)), (0, 0));
    }

    #[test]
    fn an_end_before_a_report_teaches_nothing_and_an_empty_queue_waits() {
        let t0 = Instant::now();
        let mut q = PrefillQueue::default();
        q.push(1000, t0);
        q.ended(1000);
        q.ended(1000);
        assert_eq!((q.total(), q.pace()), (0, None));
        // Idle for a second: the next request's prefill starts when sent.
        q.push(800, t0 + ms(1000));
        q.prefilled(800, t0 + ms(1080));
        assert_eq!(q.pace().map(f64::round), Some(10_000.0));
        // A report for work no longer queued changes nothing.
        q.prefilled(800, t0 + ms(1090));
        assert_eq!(q.pace().map(f64::round), Some(10_000.0));
    }

    #[test]
    fn parallel_lanes_reporting_together_add_their_pace() {
        let t0 = Instant::now();
        let mut q = PrefillQueue::default();
        for _ in 0..4 {
            q.push(1000, t0);
        }
        for _ in 0..4 {
            q.prefilled(1000, t0 + ms(100));
        }
        // About four times one lane's 10 bytes per ms (the decay weighs
        // the last reports, which took no time, a little more).
        let pace = q.pace().unwrap_or(0.0);
        assert!((35_000.0..=50_000.0).contains(&pace), "{pace}");
    }
}
