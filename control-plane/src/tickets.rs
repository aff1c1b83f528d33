//! Requests in flight, by the ticket the filter chose for them.
//!
//! Load is counted when a decision is made and released when the filter
//! reports the request's end. A report can arrive before the decision is
//! recorded (the client left while the decision was on its way), so an end
//! for an unknown ticket leaves a tombstone that cancels the late decision.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use crate::workers::Worker;

/// How long a tombstone waits for its decision.
const TOMBSTONE_TTL: Duration = Duration::from_secs(60);

enum Slot {
    Open { request: Counted, since: Instant },
    Ended { at: Instant },
}

/// A request counted as load, as its end must release it.
#[derive(Debug, Clone)]
pub struct Counted {
    /// The unit whose load counts the request.
    pub worker: Arc<Worker>,
    /// The estimated work counted with it.
    pub work: u64,
    /// The units Envoy may try, one per attempt (`retry::plan`); empty when
    /// there is nothing to attribute (info requests, tests).
    pub plan: Vec<Arc<Worker>>,
}

/// The table of requests in flight.
#[derive(Default)]
pub struct Tickets {
    slots: DashMap<u64, Slot>,
}

impl Tickets {
    /// Records that `ticket` counts as load (`request.work` too) on
    /// `request.worker` (the caller has started it there). Returns false when
    /// the request had already ended; the caller then releases it at once.
    pub fn open(&self, ticket: u64, request: Counted) -> bool {
        match self.slots.entry(ticket) {
            Entry::Vacant(v) => {
                v.insert(Slot::Open {
                    request,
                    since: Instant::now(),
                });
                true
            }
            Entry::Occupied(o) => match o.get() {
                Slot::Ended { .. } => {
                    o.remove();
                    false
                }
                // A reused ticket: release the older request's load rather
                // than leak it.
                Slot::Open { .. } => {
                    let mut o = o;
                    if let Slot::Open { request: old, .. } = o.insert(Slot::Open {
                        request,
                        since: Instant::now(),
                    }) {
                        old.worker.finish(old.work);
                    }
                    true
                }
            },
        }
    }

    /// The attempt plan of open `ticket`, taken (so that its outcome is
    /// recorded once: the end then finds an empty plan).
    pub fn take_plan(&self, ticket: u64) -> Option<Vec<Arc<Worker>>> {
        let mut slot = self.slots.get_mut(&ticket)?;
        match slot.value_mut() {
            Slot::Open { request, .. } => Some(std::mem::take(&mut request.plan)),
            Slot::Ended { .. } => None,
        }
    }

    /// Ends `ticket`; returns the request the caller must release.
    pub fn close(&self, ticket: u64) -> Option<Counted> {
        match self.slots.entry(ticket) {
            Entry::Occupied(o) => match o.get() {
                Slot::Open { .. } => match o.remove() {
                    Slot::Open { request, .. } => Some(request),
                    Slot::Ended { .. } => None,
                },
                Slot::Ended { .. } => None,
            },
            Entry::Vacant(v) => {
                v.insert(Slot::Ended { at: Instant::now() });
                None
            }
        }
    }

    /// Releases requests open longer than `timeout` (their end was lost, e.g.
    /// an Envoy restart) and drops old tombstones. Returns how many were released.
    pub fn reap(&self, timeout: Duration) -> usize {
        let now = Instant::now();
        let mut released = 0;
        self.slots.retain(|_, slot| match slot {
            Slot::Open { request, since } => {
                let keep = now.duration_since(*since) < timeout;
                if !keep {
                    request.worker.finish(request.work);
                    released += 1;
                }
                keep
            }
            Slot::Ended { at } => now.duration_since(*at) < TOMBSTONE_TTL,
        });
        released
    }

    /// Requests currently open.
    pub fn open_count(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s.value(), Slot::Open { .. }))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::workers;

    fn counted(worker: Arc<Worker>, work: u64) -> Counted {
        Counted {
            worker,
            work,
            plan: Vec::new(),
        }
    }

    #[test]
    fn open_then_close_returns_worker_once() {
        let t = Tickets::default();
        let w = workers(1).remove(0);
        assert!(t.open(7, counted(w.clone(), 5)));
        assert_eq!(t.open_count(), 1);
        assert_eq!(
            t.close(7).map(|c| (c.worker.url.clone(), c.work)),
            Some((w.url.clone(), 5))
        );
        assert!(t.close(7).is_none());
        assert_eq!(t.open_count(), 0);
    }

    #[test]
    fn end_before_decision_cancels_it() {
        let t = Tickets::default();
        let w = workers(1).remove(0);
        assert!(t.close(9).is_none());
        assert!(
            !t.open(9, counted(w, 0)),
            "decision after the end must be refused"
        );
        assert_eq!(t.open_count(), 0);
    }

    #[test]
    fn reap_releases_stale_requests() {
        let t = Tickets::default();
        let w = workers(1).remove(0);
        w.start(40);
        assert!(t.open(1, counted(w.clone(), 40)));
        assert_eq!(t.reap(Duration::from_secs(3600)), 0);
        assert_eq!(t.reap(Duration::ZERO), 1);
        assert_eq!((w.load(), w.pending_work()), (0, 0));
    }
}
