//! When each server's health endpoint is probed next.
//!
//! A healthy server is probed every `--health-check-interval-secs`. A server
//! that is not healthy (not yet, at startup or once added, or no longer,
//! after failed checks or a failed request) is probed on a fast schedule so
//! it serves within seconds of its health endpoint answering: 1 s after a
//! failed probe, then a second longer after each further one, up to 3 s;
//! after a good probe that did not make it healthy yet (the success
//! threshold), 1 s. A server down for longer than
//! `--worker-startup-timeout-secs` is probed less and less often, doubling
//! the wait up to the interval, as a dead server would otherwise be probed
//! every 3 s forever. None of these waits exceeds the interval.

use std::time::{Duration, Instant};

/// First wait of the fast schedule, and the wait after a good probe.
pub const FAST_FIRST: Duration = Duration::from_secs(1);
/// Longest wait of the fast schedule: a server whose health endpoint starts
/// answering is probed within this, then admitted (or, with a success
/// threshold of 2, once more a second later).
pub const FAST_MAX: Duration = Duration::from_secs(3);

/// The flags the schedule follows.
#[derive(Debug, Clone, Copy)]
pub struct ProbePlan {
    /// Between two probes of a healthy server.
    pub interval: Duration,
    /// How long a server that is not healthy stays on the fast schedule.
    pub fast_window: Duration,
}

/// One server's schedule.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    due: Instant,
    /// The last wait after a failed probe while not healthy (zero after a
    /// good one).
    gap: Duration,
    /// Since when the server is not healthy; `None` while it is.
    down_since: Option<Instant>,
}

impl Schedule {
    /// A server just registered, healthy or not: probed at once.
    pub fn new(now: Instant, healthy: bool) -> Schedule {
        Schedule {
            due: now,
            gap: Duration::ZERO,
            down_since: (!healthy).then_some(now),
        }
    }

    /// When the next probe is due.
    pub fn due(&self) -> Instant {
        self.due
    }

    /// Whether the schedule treats the server as healthy.
    pub fn healthy(&self) -> bool {
        self.down_since.is_none()
    }

    /// Records a probe's outcome (`ok`) and the server's health after it.
    pub fn probed(&mut self, now: Instant, ok: bool, healthy: bool, plan: &ProbePlan) {
        if healthy {
            self.down_since = None;
            self.gap = Duration::ZERO;
            self.due = now + plan.interval;
            return;
        }
        let down_since = *self.down_since.get_or_insert(now);
        let wait = if ok {
            self.gap = Duration::ZERO;
            FAST_FIRST
        } else if now.duration_since(down_since) < plan.fast_window {
            self.gap = (self.gap + FAST_FIRST).min(FAST_MAX);
            self.gap
        } else {
            self.gap = (self.gap.max(FAST_MAX) * 2).min(plan.interval);
            self.gap
        };
        self.due = now + wait.min(plan.interval);
    }

    /// The server's health changed outside the probes (a failed request
    /// took it out, an admin added it healthy...): switch schedules.
    pub fn health_changed(&mut self, now: Instant, healthy: bool, plan: &ProbePlan) {
        if healthy == self.healthy() {
            return;
        }
        if healthy {
            self.down_since = None;
            self.due = now + plan.interval;
        } else {
            // Whoever took it out has just seen it fail.
            self.down_since = Some(now);
            self.gap = FAST_FIRST;
            self.due = self.due.min(now + FAST_FIRST.min(plan.interval));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: ProbePlan = ProbePlan {
        interval: Duration::from_secs(60),
        fast_window: Duration::from_secs(30),
    };

    fn secs(d: Duration) -> u64 {
        d.as_secs()
    }

    /// The waits between the probes of a server that keeps failing.
    fn waits_while_down(plan: &ProbePlan, probes: usize) -> Vec<u64> {
        let start = Instant::now();
        let mut s = Schedule::new(start, false);
        let mut now = start;
        let mut waits = Vec::new();
        for _ in 0..probes {
            s.probed(now, false, false, plan);
            waits.push(secs(s.due() - now));
            now = s.due();
        }
        waits
    }

    #[test]
    fn a_server_that_is_not_up_is_probed_fast_then_less_and_less() {
        let start = Instant::now();
        assert_eq!(Schedule::new(start, false).due(), start, "probed at once");
        assert_eq!(
            waits_while_down(&PLAN, 16),
            [1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 6, 12, 24, 48, 60],
            "fast for the window (30 s), then doubling"
        );
        assert_eq!(
            waits_while_down(&PLAN, 20)[19],
            60,
            "never past the interval"
        );
        let short = ProbePlan {
            interval: Duration::from_secs(2),
            fast_window: Duration::from_secs(30),
        };
        assert!(waits_while_down(&short, 10).iter().all(|&w| w <= 2));
    }

    #[test]
    fn a_good_probe_short_of_the_threshold_is_followed_within_a_second() {
        let start = Instant::now();
        let mut s = Schedule::new(start, false);
        for i in 0..5 {
            s.probed(start + Duration::from_secs(i), false, false, &PLAN);
        }
        let now = start + Duration::from_secs(10);
        s.probed(now, true, false, &PLAN);
        assert_eq!(s.due() - now, FAST_FIRST);
        s.probed(now + FAST_FIRST, true, true, &PLAN);
        assert!(s.healthy());
        assert_eq!(s.due() - (now + FAST_FIRST), PLAN.interval);
        // A failed probe of a healthy server (below the failure threshold)
        // keeps the interval.
        let later = now + Duration::from_secs(61);
        s.probed(later, false, true, &PLAN);
        assert_eq!(s.due() - later, PLAN.interval);
    }

    #[test]
    fn taken_out_by_a_failed_request_it_is_probed_within_a_second() {
        let start = Instant::now();
        let mut s = Schedule::new(start, true);
        s.probed(start, true, true, &PLAN);
        assert_eq!(s.due() - start, PLAN.interval);
        let now = start + Duration::from_secs(5);
        s.health_changed(now, false, &PLAN);
        assert!(!s.healthy());
        assert_eq!(s.due() - now, FAST_FIRST);
        s.probed(s.due(), false, false, &PLAN);
        assert_eq!(secs(s.due() - (now + FAST_FIRST)), 2, "backs off from 1 s");
        let back = now + Duration::from_secs(10);
        s.health_changed(back, true, &PLAN);
        assert!(s.healthy());
        assert_eq!(s.due() - back, PLAN.interval);
    }
}
