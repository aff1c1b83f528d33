//! Requests in flight, by the ticket the front door chose for them: one
//! record each, holding what the request counts on its unit and, in PD
//! mode, its prefill half.
//!
//! Load is counted when a decision is made and released when the front door
//! reports the request's end; a prefill still running then is stopped. A report can arrive before the decision is
//! recorded (the client left while the decision was on its way), so an end
//! for an unknown ticket leaves a tombstone that cancels the late decision.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use sglang_envoy_proto::PrefillOutcome;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::routing_key::RoutingKey;
use crate::workers::{Sent, Worker};

/// How long a tombstone waits for its decision.
const TOMBSTONE_TTL: Duration = Duration::from_secs(60);

/// What one request in flight counts on its unit: one request, its
/// estimated prefill `work`, and its routing key. Released when dropped
/// (the request ended, was abandoned or reaped, or its ticket came back
/// already ended), so no path can forget to release it.
#[derive(Debug)]
pub struct Counted {
    /// The unit the request was sent to.
    pub worker: Arc<Worker>,
    /// The policy's estimate of its prefill work.
    pub work: u64,
    /// When it was sent, relative to the unit's load reports.
    sent: Sent,
    /// The client's routing key, counted among the unit's keys in flight.
    pub routing_key: Option<RoutingKey>,
    /// The units Envoy may try, one per attempt (`retry::plan`); empty when
    /// there is nothing to attribute (info requests, prefill halves, tests).
    pub plan: Vec<Arc<Worker>>,
    /// PD: the prefill half sent for the request.
    pub prefill: Option<PrefillHandle>,
    /// The cached tokens the worker is expected to report, predicted from
    /// its KV events (checked against its report at the end).
    pub predicted_cached: Option<u64>,
}

/// The prefill half of a PD request, sent by a task: its outcome once
/// known, and the means to stop it.
#[derive(Debug, Clone)]
pub struct PrefillHandle {
    outcome: watch::Receiver<Option<PrefillOutcome>>,
    task: Arc<AbortHandle>,
}

impl PrefillHandle {
    /// The prefill run by `task`, which sends its outcome on `outcome`.
    pub fn new(outcome: watch::Receiver<Option<PrefillOutcome>>, task: AbortHandle) -> Self {
        PrefillHandle {
            outcome,
            task: Arc::new(task),
        }
    }

    /// Waits for the outcome (a failure if the prefill was stopped first).
    pub async fn outcome(mut self) -> PrefillOutcome {
        match self.outcome.wait_for(Option::is_some).await {
            Ok(o) => o.clone().unwrap_or_default(),
            Err(_) => PrefillOutcome {
                ok: false,
                http_status: 499,
                message: "the request ended before its prefill did".into(),
                error_type: "prefill_failed".into(),
                ..Default::default()
            },
        }
    }

    /// True while the prefill runs: no outcome yet, and not stopped.
    pub fn running(&self) -> bool {
        self.outcome.borrow().is_none() && !self.task.is_finished()
    }

    /// Stops the prefill if it still runs: it then serves nobody (the
    /// client went away, or the decode failed and its error went back),
    /// and dropping its connection aborts it on the worker, which frees
    /// the KV cache it holds for a decode that never comes.
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Counted {
    /// Counts a request on `worker`.
    pub fn start(worker: Arc<Worker>, work: u64, routing_key: Option<RoutingKey>) -> Counted {
        let sent = worker.start(work);
        if let Some(key) = routing_key {
            worker.hold_key(key);
        }
        Counted {
            worker,
            work,
            sent,
            routing_key,
            plan: Vec::new(),
            prefill: None,
            predicted_cached: None,
        }
    }

    /// The same, with the prefill half sent for the request.
    pub fn with_prefill(mut self, prefill: PrefillHandle) -> Counted {
        self.prefill = Some(prefill);
        self
    }

    /// The same, with the attempt plan whose outcomes its end attributes.
    pub fn with_plan(mut self, plan: Vec<Arc<Worker>>) -> Counted {
        self.plan = plan;
        self
    }

    /// Its worker has prefilled it: its work leaves the worker's queue,
    /// once; its load stays until it ends.
    pub fn prefilled(&mut self) {
        self.worker.prefilled(std::mem::take(&mut self.work));
    }

    /// This request, expected to find `tokens` cached on its worker.
    pub fn with_prediction(mut self, tokens: Option<u64>) -> Counted {
        self.predicted_cached = tokens;
        self
    }
}

impl Drop for Counted {
    /// Releases what [`Counted::start`] counted, and stops the prefill half.
    fn drop(&mut self) {
        if let Some(prefill) = &self.prefill {
            prefill.stop();
        }
        self.worker.finish(self.work, self.sent);
        if let Some(key) = self.routing_key {
            self.worker.release_key(key);
        }
    }
}

enum Slot {
    Open { counted: Counted, since: Instant },
    Ended { at: Instant },
}

/// The table of requests in flight.
#[derive(Default)]
pub struct Tickets {
    slots: DashMap<u64, Slot>,
}

impl Tickets {
    /// Records that `ticket` holds `counted` until it ends. Returns false, and
    /// releases `counted` at once, when the request had already ended.
    pub fn open(&self, ticket: u64, counted: Counted) -> bool {
        match self.slots.entry(ticket) {
            Entry::Vacant(v) => {
                v.insert(Slot::Open {
                    counted,
                    since: Instant::now(),
                });
                true
            }
            Entry::Occupied(mut o) => match o.get() {
                Slot::Ended { .. } => {
                    o.remove();
                    drop(counted);
                    false
                }
                // A reused ticket: release the older request's load rather
                // than leak it.
                Slot::Open { .. } => {
                    let older = o.insert(Slot::Open {
                        counted,
                        since: Instant::now(),
                    });
                    drop(older);
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
            Slot::Open { counted, .. } => Some(std::mem::take(&mut counted.plan)),
            Slot::Ended { .. } => None,
        }
    }

    /// Open `ticket`'s worker has prefilled it ([`Counted::prefilled`]).
    /// False when the ticket is not open here.
    pub fn prefilled(&self, ticket: u64) -> bool {
        let Some(mut slot) = self.slots.get_mut(&ticket) else {
            return false;
        };
        match slot.value_mut() {
            Slot::Open { counted, .. } => {
                counted.prefilled();
                true
            }
            Slot::Ended { .. } => false,
        }
    }

    /// How many open tickets have a prefill half still running: what a
    /// control plane going away waits for (its end would abort them).
    pub fn prefills_running(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| match slot.value() {
                Slot::Open { counted, .. } => counted.prefill.as_ref().is_some_and(|p| p.running()),
                Slot::Ended { .. } => false,
            })
            .count()
    }

    /// The prefill half of open `ticket`, to wait for its outcome.
    pub fn prefill(&self, ticket: u64) -> Option<PrefillHandle> {
        match self.slots.get(&ticket)?.value() {
            Slot::Open { counted, .. } => counted.prefill.clone(),
            Slot::Ended { .. } => None,
        }
    }

    /// Ends `ticket`; returns what the caller must release.
    pub fn close(&self, ticket: u64) -> Option<Counted> {
        match self.slots.entry(ticket) {
            Entry::Occupied(o) => match o.get() {
                Slot::Open { .. } => match o.remove() {
                    Slot::Open { counted, .. } => Some(counted),
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
            Slot::Open { since, .. } => {
                // Dropped, so released, when not kept.
                let keep = now.duration_since(*since) < timeout;
                if !keep {
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
        assert!(t.open(7, Counted::start(w.clone(), 5, None)));
        assert_eq!(t.open_count(), 1);
        assert_eq!(
            t.close(7).map(|h| (h.worker.url.clone(), h.work)),
            Some((w.url.clone(), 5))
        );
        assert!(t.close(7).is_none());
        assert_eq!(t.open_count(), 0);
    }

    #[test]
    fn a_prefilled_request_keeps_its_load_but_not_its_work() {
        let t = Tickets::default();
        let w = workers(1).remove(0);
        assert!(t.open(3, Counted::start(w.clone(), 500, None)));
        assert!(t.open(4, Counted::start(w.clone(), 70, None)));
        assert!(t.prefilled(3));
        assert_eq!((w.load(), w.own_work()), (2, 70));
        // Reported twice (a retry of the report): taken off once.
        assert!(t.prefilled(3));
        assert_eq!(w.own_work(), 70);
        assert!(!t.prefilled(99), "not open here");
        drop(t.close(3));
        assert_eq!(
            (w.load(), w.own_work()),
            (1, 70),
            "its end takes no work twice"
        );
        drop(t.close(4));
        assert_eq!((w.load(), w.own_work()), (0, 0));
    }

    #[test]
    fn end_before_decision_cancels_it() {
        let t = Tickets::default();
        let w = workers(1).remove(0);
        assert!(t.close(9).is_none());
        let key = RoutingKey::from_header("k");
        assert!(
            !t.open(9, Counted::start(w.clone(), 3, key)),
            "decision after the end must be refused"
        );
        assert_eq!(t.open_count(), 0);
        assert_eq!(
            (w.load(), w.own_work(), w.routing_keys()),
            (0, 0, 0),
            "a refused decision is released"
        );
    }

    #[test]
    fn reap_releases_stale_requests() {
        let t = Tickets::default();
        let w = workers(1).remove(0);
        assert!(t.open(
            1,
            Counted::start(w.clone(), 40, RoutingKey::from_header("k"))
        ));
        assert_eq!(w.routing_keys(), 1);
        assert_eq!(t.reap(Duration::from_secs(3600)), 0);
        assert_eq!(t.reap(Duration::ZERO), 1);
        assert_eq!((w.load(), w.own_work(), w.routing_keys()), (0, 0, 0));
    }

    #[tokio::test]
    async fn running_prefills_are_counted_until_their_outcome_or_their_stop() {
        let t = Tickets::default();
        let w = workers(1).remove(0);
        let mut senders = Vec::new();
        for ticket in [1, 2, 3] {
            let (tx, rx) = watch::channel(None);
            let task = tokio::spawn(std::future::pending::<()>());
            let mut counted = Counted::start(w.clone(), 1, None);
            counted.prefill = Some(PrefillHandle::new(rx, task.abort_handle()));
            assert!(t.open(ticket, counted));
            senders.push(tx);
        }
        // A decode without a prefill half is not waited for.
        assert!(t.open(4, Counted::start(w.clone(), 1, None)));
        assert_eq!(t.prefills_running(), 3);
        senders[0].send_replace(Some(PrefillOutcome::default()));
        assert_eq!(t.prefills_running(), 2, "its outcome came");
        drop(t.close(2));
        tokio::task::yield_now().await;
        assert_eq!(t.prefills_running(), 1, "stopped with its request");
        drop(t.close(3));
        tokio::task::yield_now().await;
        assert_eq!(t.prefills_running(), 0);
    }
}
