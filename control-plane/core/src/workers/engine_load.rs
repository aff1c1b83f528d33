//! A unit's load as its engine reports it (`/v1/loads` or `/get_load`:
//! running plus waiting requests, whoever sent them), merged with the
//! requests this router sent since the report.
//!
//! The report is the truth as of when it arrived; requests this router
//! starts afterwards are added until the next one. A request sent while a
//! report was on its way may be in that report and is then not added again:
//! such a request is missed until the next report rather than counted
//! twice. Without a live report (never polled, the last poll failed, or
//! polling is off) there is no engine load and the router's own in-flight
//! count stands alone.

use std::sync::atomic::{AtomicUsize, Ordering};

/// No live report.
const NONE: usize = usize::MAX;

/// The engine's last report of one unit and the router's sends since.
#[derive(Debug)]
pub struct EngineLoad {
    /// Running plus waiting requests in the last live report, or [`NONE`].
    reported: AtomicUsize,
    /// Requests this router has started on the unit, ever.
    sent: AtomicUsize,
    /// `sent` when the last report arrived.
    sent_at_report: AtomicUsize,
}

impl Default for EngineLoad {
    fn default() -> Self {
        EngineLoad {
            reported: AtomicUsize::new(NONE),
            sent: AtomicUsize::new(0),
            sent_at_report: AtomicUsize::new(0),
        }
    }
}

impl EngineLoad {
    /// The router started a request on the unit.
    pub fn on_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// A report arrived: `requests` running or waiting at the engine.
    pub fn record(&self, requests: usize) {
        // The base first: a reader between the two stores sees the old
        // report with fewer sends added, never a send counted twice.
        self.sent_at_report
            .store(self.sent.load(Ordering::Relaxed), Ordering::Relaxed);
        self.reported
            .store(requests.min(NONE - 1), Ordering::Relaxed);
    }

    /// The report is gone (a poll failed, or is stale): back to the
    /// router's own counts.
    pub fn forget(&self) {
        self.reported.store(NONE, Ordering::Relaxed);
    }

    /// Running plus waiting requests in the last live report.
    pub fn reported(&self) -> Option<usize> {
        let r = self.reported.load(Ordering::Relaxed);
        (r != NONE).then_some(r)
    }

    /// The report plus the requests sent since; `None` without a live
    /// report.
    pub fn merged(&self) -> Option<usize> {
        let reported = self.reported()?;
        let since = self
            .sent
            .load(Ordering::Relaxed)
            .saturating_sub(self.sent_at_report.load(Ordering::Relaxed));
        Some(reported.saturating_add(since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_after_a_report_are_added_until_the_next() {
        let e = EngineLoad::default();
        e.on_sent();
        assert_eq!(e.merged(), None, "no report yet");
        // The report already holds the first request (and 39 from elsewhere).
        e.record(40);
        assert_eq!(e.merged(), Some(40));
        e.on_sent();
        e.on_sent();
        assert_eq!(e.merged(), Some(42));
        // The next report holds those two: not added again.
        e.record(42);
        assert_eq!(e.merged(), Some(42));
        e.forget();
        assert_eq!((e.reported(), e.merged()), (None, None));
        e.record(3);
        assert_eq!(e.merged(), Some(3));
    }
}
