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
    Open {
        worker: Arc<Worker>,
        work: u64,
        since: Instant,
    },
    Ended {
        at: Instant,
    },
}

/// The table of requests in flight.
#[derive(Default)]
pub struct Tickets {
    slots: DashMap<u64, Slot>,
}

impl Tickets {
    /// Records that `ticket` counts as load (and `work`) on `worker` (the
    /// caller has started it there). Returns false when the request had
    /// already ended; the caller then releases it at once.
    pub fn open(&self, ticket: u64, worker: Arc<Worker>, work: u64) -> bool {
        match self.slots.entry(ticket) {
            Entry::Vacant(v) => {
                v.insert(Slot::Open {
                    worker,
                    work,
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
                    if let Slot::Open {
                        worker: old,
                        work: old_work,
                        ..
                    } = o.insert(Slot::Open {
                        worker,
                        work,
                        since: Instant::now(),
                    }) {
                        old.finish(old_work);
                    }
                    true
                }
            },
        }
    }

    /// Ends `ticket`; returns the worker (and the work) the caller must release.
    pub fn close(&self, ticket: u64) -> Option<(Arc<Worker>, u64)> {
        match self.slots.entry(ticket) {
            Entry::Occupied(o) => match o.get() {
                Slot::Open { .. } => match o.remove() {
                    Slot::Open { worker, work, .. } => Some((worker, work)),
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
            Slot::Open {
                worker,
                work,
                since,
            } => {
                let keep = now.duration_since(*since) < timeout;
                if !keep {
                    worker.finish(*work);
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

    #[test]
    fn open_then_close_returns_worker_once() {
        let t = Tickets::default();
        let w = workers(1).remove(0);
        assert!(t.open(7, w.clone(), 5));
        assert_eq!(t.open_count(), 1);
        assert_eq!(
            t.close(7).map(|(w, work)| (w.url.clone(), work)),
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
        assert!(!t.open(9, w, 0), "decision after the end must be refused");
        assert_eq!(t.open_count(), 0);
    }

    #[test]
    fn reap_releases_stale_requests() {
        let t = Tickets::default();
        let w = workers(1).remove(0);
        w.start(40);
        assert!(t.open(1, w.clone(), 40));
        assert_eq!(t.reap(Duration::from_secs(3600)), 0);
        assert_eq!(t.reap(Duration::ZERO), 1);
        assert_eq!((w.load(), w.pending_work()), (0, 0));
    }
}
