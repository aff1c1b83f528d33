//! Admission control (`--max-concurrent-requests`, `--queue-size`,
//! `--queue-timeout-secs`): at most so many inference requests in flight;
//! the next ones wait in a bounded queue, first come first served, until a
//! request ends. A full queue is a 429, a wait past the timeout a 408.
//!
//! Slots belong to tickets: a request holds its slot from admission until
//! its end is reported (`release`), whichever front door it came through.
//! The wasm filter asks again once admitted, so an admitted ticket that is
//! asked about again is simply let through.
//!
//! sglang-router's limiter is a token bucket whose tokens also refill at
//! `--rate-limit-tokens-per-second` (by default the limit per second), so
//! more requests than the limit can run at once; this one is a strict limit
//! on requests in flight.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use parking_lot::Mutex;
use sglang_envoy_lifecycle::{LocalReply, Unrouted};
use sglang_envoy_proto::{AdmissionOutcome, Rejection};
use tokio::sync::oneshot;

/// The limits (`--max-concurrent-requests` and the queue's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionOptions {
    /// Inference requests in flight at most.
    pub limit: usize,
    /// Requests waiting at most; 0: none wait (429 at once).
    pub queue_size: usize,
    /// Longest wait in the queue.
    pub queue_timeout: Duration,
}

/// What `admit` decided.
#[derive(Debug)]
pub enum Admit {
    /// The request holds a slot: route it.
    Now,
    /// The request waits; the receiver fires when it holds a slot.
    Queued(oneshot::Receiver<()>),
    /// The queue is full.
    Full,
}

/// Why a queued request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotAdmitted {
    /// It waited `--queue-timeout-secs`.
    #[error("the request waited {0:?} in the router's queue without a free slot")]
    TimedOut(Duration),
    /// It ended while waiting (client gone).
    #[error("the request ended while it waited")]
    Gone,
}

#[derive(Default)]
struct State {
    /// Tickets holding a slot, since when.
    holding: HashMap<u64, Instant>,
    /// Tickets waiting for one, oldest first.
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
}

/// The admission state of the control plane (all front doors, all Envoys).
pub struct Admission {
    options: AdmissionOptions,
    state: Mutex<State>,
}

impl Admission {
    /// Admission with `options`.
    pub fn new(options: AdmissionOptions) -> Self {
        Admission {
            options,
            state: Mutex::new(State::default()),
        }
    }

    /// The limits.
    pub fn options(&self) -> &AdmissionOptions {
        &self.options
    }

    /// Takes a slot for `ticket` if one is free (or it holds one already),
    /// else queues it, or says the queue is full.
    pub fn admit(&self, ticket: u64) -> Admit {
        let mut state = self.state.lock();
        if state.holding.contains_key(&ticket) {
            return Admit::Now;
        }
        if state.holding.len() < self.options.limit && state.waiting.is_empty() {
            state.holding.insert(ticket, Instant::now());
            return Admit::Now;
        }
        if state.waiting.len() >= self.options.queue_size {
            return Admit::Full;
        }
        let (tx, rx) = oneshot::channel();
        state.waiting.push_back((ticket, tx));
        Admit::Queued(rx)
    }

    /// Waits for `ticket`'s slot (after `Admit::Queued`), at most the queue
    /// timeout. On a timeout the ticket leaves the queue.
    pub async fn wait(&self, ticket: u64, slot: oneshot::Receiver<()>) -> Result<(), NotAdmitted> {
        // Whoever waits can go away (the filter's call is cancelled when its
        // client leaves): the place in the queue goes with it, at once.
        struct Leave<'a>(&'a Admission, u64, bool);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                if !self.2 {
                    self.0.state.lock().waiting.retain(|(t, _)| *t != self.1);
                }
            }
        }
        let mut leave = Leave(self, ticket, false);
        let waited = tokio::time::timeout(self.options.queue_timeout, slot).await;
        leave.2 = true;
        match waited {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(NotAdmitted::Gone),
            Err(_) => {
                let mut state = self.state.lock();
                // Admitted at the last moment: keep the slot.
                if state.holding.contains_key(&ticket) {
                    return Ok(());
                }
                state.waiting.retain(|(t, _)| *t != ticket);
                Err(NotAdmitted::TimedOut(self.options.queue_timeout))
            }
        }
    }

    /// `ticket` ended: its slot goes to the oldest waiting request still
    /// there; a ticket that was waiting leaves the queue.
    pub fn release(&self, ticket: u64) {
        let mut state = self.state.lock();
        if state.holding.remove(&ticket).is_none() {
            state.waiting.retain(|(t, _)| *t != ticket);
            return;
        }
        Self::pass_on(&mut state);
    }

    /// Gives free slots to the oldest waiting requests still there.
    fn pass_on(state: &mut State) {
        while let Some((next, tx)) = state.waiting.pop_front() {
            state.holding.insert(next, Instant::now());
            if tx.send(()).is_ok() {
                return;
            }
            // Its waiter is gone (the wait was abandoned): try the next.
            state.holding.remove(&next);
        }
    }

    /// Frees slots held longer than `timeout` (their end was never
    /// reported: an Envoy that died) and passes them on.
    pub fn reap(&self, timeout: Duration) -> usize {
        let mut state = self.state.lock();
        let before = state.holding.len();
        state.holding.retain(|_, since| since.elapsed() < timeout);
        let freed = before - state.holding.len();
        for _ in 0..freed {
            if state.holding.len() < self.options.limit {
                Self::pass_on(&mut state);
            }
        }
        freed
    }

    /// Requests holding a slot, and waiting for one.
    pub fn counts(&self) -> (usize, usize) {
        let state = self.state.lock();
        (state.holding.len(), state.waiting.len())
    }
}

/// Admission control in front of the engine: queues requests over the
/// limit, and keeps each queued request's wait until its front door asks
/// for it (the wasm filter does so with a second call, `AwaitAdmission`).
pub struct Gate {
    admission: Admission,
    /// Queued tickets: their slot's receiver, and since when.
    queued: DashMap<u64, (Instant, oneshot::Receiver<()>)>,
}

impl Gate {
    /// A gate with `options`.
    pub fn new(options: AdmissionOptions) -> Self {
        Gate {
            admission: Admission::new(options),
            queued: DashMap::new(),
        }
    }

    /// `None` when `ticket` may be routed now; else the answer: queued
    /// (ask `AwaitAdmission`, then `Route` again) or a 429.
    pub fn check(&self, ticket: u64) -> Option<Unrouted> {
        match self.admission.admit(ticket) {
            Admit::Now => None,
            Admit::Queued(slot) => {
                self.queued.insert(ticket, (Instant::now(), slot));
                let wait = self.admission.options().queue_timeout;
                Some(Unrouted::Queued {
                    wait_ms: wait.as_millis() as u64,
                })
            }
            Admit::Full => Some(Unrouted::Rejected(LocalReply::new(
                429,
                "rate_limit_exceeded",
                "too many requests: the router's queue is full; retry later",
            ))),
        }
    }

    /// Waits until queued `ticket` holds a slot, or gives up.
    pub async fn wait(&self, ticket: u64) -> AdmissionOutcome {
        let Some((_, (_, slot))) = self.queued.remove(&ticket) else {
            // Admitted already (asked twice), or never queued here.
            return match self.admission.admit(ticket) {
                Admit::Now => admitted(),
                _ => rejected(
                    503,
                    "service_unavailable",
                    "no queued request has this ticket",
                ),
            };
        };
        match self.admission.wait(ticket, slot).await {
            Ok(()) => admitted(),
            Err(e @ NotAdmitted::TimedOut(_)) => rejected(408, "timeout", &e.to_string()),
            Err(e @ NotAdmitted::Gone) => rejected(499, "client_cancelled", &e.to_string()),
        }
    }

    /// `ticket` ended (or will not be routed): frees its slot or its place.
    pub fn release(&self, ticket: u64) {
        self.queued.remove(&ticket);
        self.admission.release(ticket);
    }

    /// Forgets queued requests nobody waited for within the queue timeout
    /// (their front door went away), and frees slots held past `timeout`.
    pub fn reap(&self, timeout: Duration) -> usize {
        let wait = self.admission.options().queue_timeout;
        let stale: Vec<u64> = self
            .queued
            .iter()
            .filter(|e| e.value().0.elapsed() > wait + Duration::from_secs(5))
            .map(|e| *e.key())
            .collect();
        for ticket in &stale {
            self.release(*ticket);
        }
        stale.len() + self.admission.reap(timeout)
    }

    /// Requests holding a slot, and waiting for one.
    pub fn counts(&self) -> (usize, usize) {
        self.admission.counts()
    }
}

fn admitted() -> AdmissionOutcome {
    AdmissionOutcome {
        admitted: true,
        rejection: None,
    }
}

fn rejected(status: u32, kind: &str, message: &str) -> AdmissionOutcome {
    AdmissionOutcome {
        admitted: false,
        rejection: Some(Rejection {
            http_status: status,
            message: message.to_string(),
            error_type: kind.to_string(),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(limit: usize, queue_size: usize, timeout_ms: u64) -> Admission {
        Admission::new(AdmissionOptions {
            limit,
            queue_size,
            queue_timeout: Duration::from_millis(timeout_ms),
        })
    }

    #[tokio::test]
    async fn slots_queue_and_pass_on_in_order() {
        let a = admission(1, 2, 5_000);
        assert!(matches!(a.admit(1), Admit::Now));
        assert!(
            matches!(a.admit(1), Admit::Now),
            "an admitted ticket asks again"
        );
        let Admit::Queued(rx2) = a.admit(2) else {
            panic!("2 should wait")
        };
        let Admit::Queued(rx3) = a.admit(3) else {
            panic!("3 should wait")
        };
        assert!(matches!(a.admit(4), Admit::Full));
        assert_eq!(a.counts(), (1, 2));
        a.release(1);
        assert_eq!(a.wait(2, rx2).await, Ok(()));
        assert_eq!(a.counts(), (1, 1));
        a.release(2);
        assert_eq!(a.wait(3, rx3).await, Ok(()));
        a.release(3);
        assert_eq!(a.counts(), (0, 0));
    }

    #[tokio::test]
    async fn a_wait_times_out_and_leaves_the_queue() {
        let a = admission(1, 1, 50);
        assert!(matches!(a.admit(1), Admit::Now));
        let Admit::Queued(rx) = a.admit(2) else {
            panic!("2 should wait")
        };
        assert_eq!(
            a.wait(2, rx).await,
            Err(NotAdmitted::TimedOut(Duration::from_millis(50)))
        );
        assert_eq!(a.counts(), (1, 0));
        // The slot then goes to nobody.
        a.release(1);
        assert_eq!(a.counts(), (0, 0));
    }

    #[tokio::test]
    async fn a_request_that_ends_while_waiting_leaves_the_queue() {
        let a = admission(1, 2, 5_000);
        assert!(matches!(a.admit(1), Admit::Now));
        let Admit::Queued(rx2) = a.admit(2) else {
            panic!()
        };
        let Admit::Queued(rx3) = a.admit(3) else {
            panic!()
        };
        a.release(2);
        drop(rx2);
        a.release(1);
        assert_eq!(
            a.wait(3, rx3).await,
            Ok(()),
            "the slot skipped the gone request"
        );
        assert_eq!(a.counts(), (1, 0));
    }

    #[test]
    fn no_queue_means_full_at_once() {
        let a = admission(2, 0, 1_000);
        assert!(matches!(a.admit(1), Admit::Now));
        assert!(matches!(a.admit(2), Admit::Now));
        assert!(matches!(a.admit(3), Admit::Full));
    }

    #[tokio::test]
    async fn the_gate_queues_answers_and_passes_slots_on() {
        let g = Gate::new(AdmissionOptions {
            limit: 1,
            queue_size: 1,
            queue_timeout: Duration::from_millis(200),
        });
        assert!(g.check(1).is_none(), "a free slot: route it");
        assert_eq!(g.check(2), Some(Unrouted::Queued { wait_ms: 200 }));
        assert!(matches!(g.check(3), Some(Unrouted::Rejected(r)) if r.status == 429));
        g.release(1);
        assert!(g.wait(2).await.admitted);
        assert!(g.check(2).is_none(), "the admitted ticket asks again");
        // A queued request nobody frees a slot for times out.
        let _ = g.check(4);
        let timed_out = g.wait(4).await;
        assert_eq!(timed_out.rejection.map(|r| r.http_status), Some(408));
        g.release(2);
        assert_eq!(g.counts(), (0, 0));
    }
}
