//! A unit's load as its engine reports it (`/v1/loads` or `/get_load`:
//! running plus waiting requests, whoever sent them), merged with the
//! requests this router sent since the report.
//!
//! The report is the truth as of when it arrived; requests this router
//! starts afterwards are added while they are in flight, until the next
//! report (which holds those still running). A request of this router's
//! that ends stops counting at once, whether it was sent before the report
//! (and so is in it: taken off the report) or after (taken off what was
//! added), as it would in the router's own count: a worker that just
//! finished a burst does not look busy for the rest of the interval, and
//! the router's own finished requests never pass for someone else's. A
//! request sent while a report was on its way may be in that report and is
//! then not added again: it is missed until the next report rather than
//! counted twice. Without a live report (never polled, the last poll
//! failed, or polling is off) there is no engine load and the router's own
//! in-flight count stands alone.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// No live report.
const NONE: usize = usize::MAX;

/// The engine's last report of one unit and the router's sends since.
#[derive(Debug)]
pub struct EngineLoad {
    /// Running plus waiting requests in the last live report, or [`NONE`].
    reported: AtomicUsize,
    /// Counts reports (and lost reports): which report a request was sent
    /// after.
    epoch: AtomicU64,
    /// Requests sent since the last report and still in flight.
    fresh: AtomicUsize,
    /// Requests sent before the last report (so held in it) that ended
    /// since.
    gone: AtomicUsize,
}

/// When a request was sent, relative to the reports: given back when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sent(u64);

impl Default for EngineLoad {
    fn default() -> Self {
        EngineLoad {
            reported: AtomicUsize::new(NONE),
            epoch: AtomicU64::new(0),
            fresh: AtomicUsize::new(0),
            gone: AtomicUsize::new(0),
        }
    }
}

impl EngineLoad {
    /// The router started a request on the unit.
    pub fn on_sent(&self) -> Sent {
        let epoch = self.epoch.load(Ordering::Acquire);
        self.fresh.fetch_add(1, Ordering::AcqRel);
        Sent(epoch)
    }

    /// A request [`EngineLoad::on_sent`] returned `sent` for ended.
    pub fn on_ended(&self, sent: Sent) {
        if sent.0 == self.epoch.load(Ordering::Acquire) {
            let _ = self
                .fresh
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        } else {
            self.gone.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A report arrived: `requests` running or waiting at the engine.
    pub fn record(&self, requests: usize) {
        self.new_epoch();
        self.reported
            .store(requests.min(NONE - 1), Ordering::Release);
    }

    /// The report is gone (a poll failed, or is stale): back to the
    /// router's own counts.
    pub fn forget(&self) {
        self.new_epoch();
        self.reported.store(NONE, Ordering::Release);
    }

    /// Requests sent until now are the report's (or, without one, the
    /// router's own count's) from here on.
    fn new_epoch(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.fresh.store(0, Ordering::Release);
        self.gone.store(0, Ordering::Release);
    }

    /// Running plus waiting requests in the last live report.
    pub fn reported(&self) -> Option<usize> {
        let r = self.reported.load(Ordering::Acquire);
        (r != NONE).then_some(r)
    }

    /// The report, less this router's requests in it that ended since,
    /// plus the requests sent since and still in flight; `None` without a
    /// live report.
    pub fn merged(&self) -> Option<usize> {
        let reported = self.reported()?;
        Some(
            reported
                .saturating_sub(self.gone.load(Ordering::Acquire))
                .saturating_add(self.fresh.load(Ordering::Acquire)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_after_a_report_are_added_while_in_flight_until_the_next() {
        let e = EngineLoad::default();
        let first = e.on_sent();
        assert_eq!(e.merged(), None, "no report yet");
        // The report already holds the first request (and 39 from elsewhere).
        e.record(40);
        assert_eq!(e.merged(), Some(40));
        let (a, b) = (e.on_sent(), e.on_sent());
        assert_eq!(e.merged(), Some(42));
        // One of them ends before the next report: it stops counting.
        e.on_ended(a);
        assert_eq!(e.merged(), Some(41));
        // The first request ends: it is in the report, so it comes off the
        // report (it is not someone else's request still running).
        e.on_ended(first);
        assert_eq!(e.merged(), Some(40));
        // The next report holds the one still running: not added again, and
        // its end takes it off that report.
        e.record(40);
        e.on_ended(b);
        assert_eq!(e.merged(), Some(39));
        e.forget();
        assert_eq!((e.reported(), e.merged()), (None, None));
        e.record(3);
        assert_eq!(e.merged(), Some(3));
    }
}
