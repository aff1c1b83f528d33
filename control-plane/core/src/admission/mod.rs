//! Admission control (`--max-concurrent-requests`, `--queue-size`,
//! `--queue-timeout-secs`): at most so many inference requests in flight;
//! the next ones wait in a bounded queue, first come first served, until a
//! request ends. A full queue is a 429, a wait past the timeout a 408.
//!
//! smg 1.13.0's tenant flags sit on the same gate: a tenant over its
//! request rate (`--tenant-rate-limit-*`, `tenants.rs`) is refused before
//! it takes a slot or a place, and with `--priority-scheduler-enabled` the
//! queue is one per priority class (`class.rs`, `queue.rs`), the highest
//! class served first.
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

pub mod class;
pub mod config;
pub mod queue;
pub mod tenants;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use parking_lot::Mutex;
use sglang_envoy_lifecycle::{LocalReply, Unrouted};
use sglang_envoy_proto::{AdmissionOutcome, Rejection};
use tokio::sync::oneshot;

pub use class::Class;
use class::ClassQueue;
use queue::Waiting;
use tenants::RateLimiter;

/// The limits (`--max-concurrent-requests` and the queue's) and smg's
/// tenant options.
#[derive(Debug, Clone)]
pub struct AdmissionOptions {
    /// Inference requests in flight at most.
    pub limit: usize,
    /// Requests waiting at most; 0: none wait (429 at once).
    pub queue_size: usize,
    /// Longest wait in the queue.
    pub queue_timeout: Duration,
    /// Tenants: their rates and priority classes.
    pub tenants: TenantOptions,
}

impl AdmissionOptions {
    /// The longest a request may wait in any queue.
    pub fn longest_wait(&self) -> Duration {
        self.tenants
            .priority
            .as_ref()
            .map_or(self.queue_timeout, |p| {
                p.queues.iter().map(|q| q.timeout).max().unwrap_or_default()
            })
    }
}

/// smg's tenant and priority options.
#[derive(Debug, Clone, Default)]
pub struct TenantOptions {
    /// `--trust-tenant-header`: the tenant header names the tenant.
    pub trust_header: bool,
    /// `--priority-scheduler-enabled`: the classes' queues, and each
    /// tenant's highest class.
    pub priority: Option<Priorities>,
    /// `--tenant-rate-limit-enabled`: the validated rates.
    pub rates: Option<config::RateLimitYaml>,
}

/// The priority scheduler's settings.
#[derive(Debug, Clone)]
pub struct Priorities {
    /// Each class's queue.
    pub queues: [ClassQueue; 4],
    /// `--priority-scheduler-default-max-class`: the highest class of a
    /// tenant not listed.
    pub default_max: Class,
    /// Listed tenants' highest class.
    pub tenant_max: HashMap<String, Class>,
}

impl Priorities {
    /// The class a request of `tenant` asking for `asked` gets.
    pub fn class_for(&self, tenant: &str, asked: Class) -> Class {
        asked.min(*self.tenant_max.get(tenant).unwrap_or(&self.default_max))
    }
}

/// Who is asking to be admitted.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// The tenant key (`tenants::tenant_key`).
    pub tenant: String,
    /// The class its `x-smg-priority` asks for.
    pub asked: Class,
}

/// What `admit` decided.
#[derive(Debug)]
pub enum Admit {
    /// The request holds a slot: route it.
    Now,
    /// The request waits, at most so long; the receiver fires when it
    /// holds a slot.
    Queued(oneshot::Receiver<()>, Duration),
    /// The queue (of its class) is full.
    Full,
}

/// Why a queued request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotAdmitted {
    /// It waited its class's timeout.
    #[error("the request waited {0:?} in the router's queue without a free slot")]
    TimedOut(Duration),
    /// It ended while waiting (client gone).
    #[error("the request ended while it waited")]
    Gone,
}

struct State {
    /// Tickets holding a slot, since when.
    holding: HashMap<u64, Instant>,
    /// Tickets waiting for one.
    waiting: Waiting,
}

/// The admission state of the control plane (all front doors, all Envoys).
pub struct Admission {
    limit: usize,
    state: Mutex<State>,
}

impl Admission {
    /// Admission for `limit` slots with these queues.
    pub fn new(limit: usize, queues: [ClassQueue; 4]) -> Self {
        Admission {
            limit,
            state: Mutex::new(State {
                holding: HashMap::new(),
                waiting: Waiting::new(queues),
            }),
        }
    }

    /// Takes a slot for `ticket` if one is free (or it holds one already),
    /// else queues it in `class`, or says that queue is full.
    pub fn admit(&self, ticket: u64, class: Class) -> Admit {
        let mut state = self.state.lock();
        if state.holding.contains_key(&ticket) {
            return Admit::Now;
        }
        if state.holding.len() < self.limit && state.waiting.is_empty() {
            state.holding.insert(ticket, Instant::now());
            return Admit::Now;
        }
        let (tx, rx) = oneshot::channel();
        if !state.waiting.push(class, ticket, tx) {
            return Admit::Full;
        }
        Admit::Queued(rx, state.waiting.config(class).timeout)
    }

    /// Whether `ticket` holds a slot.
    pub fn holds(&self, ticket: u64) -> bool {
        self.state.lock().holding.contains_key(&ticket)
    }

    /// Waits for `ticket`'s slot (after `Admit::Queued`), at most
    /// `timeout`. On a timeout the ticket leaves the queue.
    pub async fn wait(
        &self,
        ticket: u64,
        slot: oneshot::Receiver<()>,
        timeout: Duration,
    ) -> Result<(), NotAdmitted> {
        // Whoever waits can go away (the filter's call is cancelled when its
        // client leaves): the place in the queue goes with it, at once.
        struct Leave<'a>(&'a Admission, u64, bool);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                if !self.2 {
                    self.0.state.lock().waiting.remove(self.1);
                }
            }
        }
        let mut leave = Leave(self, ticket, false);
        let waited = tokio::time::timeout(timeout, slot).await;
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
                state.waiting.remove(ticket);
                Err(NotAdmitted::TimedOut(timeout))
            }
        }
    }

    /// `ticket` ended: its slot goes to the next waiting request still
    /// there; a ticket that was waiting leaves the queue.
    pub fn release(&self, ticket: u64) {
        let mut state = self.state.lock();
        if state.holding.remove(&ticket).is_none() {
            state.waiting.remove(ticket);
            return;
        }
        Self::pass_on(&mut state);
    }

    /// Gives a free slot to the next waiting request still there.
    fn pass_on(state: &mut State) {
        while let Some((next, tx)) = state.waiting.pop() {
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
            if state.holding.len() < self.limit {
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

/// How refusals read: sglang-router's words, or smg's scheduler's when
/// the priority scheduler is on.
struct Refusals {
    full: (&'static str, &'static str),
    timeout: &'static str,
}

const PLAIN: Refusals = Refusals {
    full: (
        "rate_limit_exceeded",
        "too many requests: the router's queue is full; retry later",
    ),
    timeout: "timeout",
};

const SCHEDULER: Refusals = Refusals {
    full: (
        "scheduler_queue_full",
        "request queue is full for this priority class",
    ),
    timeout: "scheduler_queue_timeout",
};

/// Admission control in front of the engine: refuses tenants over their
/// rate, queues requests over the limit, and keeps each queued request's
/// wait until its front door asks for it (the wasm filter does so with a
/// second call, `AwaitAdmission`).
pub struct Gate {
    admission: Admission,
    priorities: Option<Priorities>,
    rates: Option<RateLimiter>,
    refusals: &'static Refusals,
    /// Queued tickets: since when, their longest wait, their slot's receiver.
    queued: DashMap<u64, (Instant, Duration, oneshot::Receiver<()>)>,
}

impl Gate {
    /// A gate with `options`.
    pub fn new(options: AdmissionOptions) -> Self {
        let plain = ClassQueue {
            size: options.queue_size,
            timeout: options.queue_timeout,
            starvation: Duration::MAX,
        };
        let queues = options
            .tenants
            .priority
            .as_ref()
            .map_or([plain; 4], |p| p.queues);
        Gate {
            admission: Admission::new(options.limit, queues),
            refusals: if options.tenants.priority.is_some() {
                &SCHEDULER
            } else {
                &PLAIN
            },
            priorities: options.tenants.priority,
            rates: options.tenants.rates.as_ref().map(RateLimiter::new),
            queued: DashMap::new(),
        }
    }

    /// `None` when `ticket` may be routed now; else the answer: queued
    /// (ask `AwaitAdmission`, then `Route` again), a 429 when the queue is
    /// full, or smg's 429 for a tenant over its rate.
    pub fn check(&self, ticket: u64, caller: &Caller) -> Option<Unrouted> {
        // The filter asks again once admitted: that is not a new request.
        let known = self.admission.holds(ticket) || self.queued.contains_key(&ticket);
        if let (false, Some(rates)) = (known, &self.rates) {
            if let Err(over) = rates.take(&caller.tenant) {
                return Some(Unrouted::Rejected(LocalReply::new(
                    429,
                    tenants::TENANT_OVER_RATE,
                    format!(
                        "{over}; retry after {} s (tenant {})",
                        over.retry_after_secs, caller.tenant
                    ),
                )));
            }
        }
        let class = self.priorities.as_ref().map_or(Class::Default, |p| {
            p.class_for(&caller.tenant, caller.asked)
        });
        match self.admission.admit(ticket, class) {
            Admit::Now => None,
            Admit::Queued(slot, wait) => {
                self.queued.insert(ticket, (Instant::now(), wait, slot));
                Some(Unrouted::Queued {
                    wait_ms: wait.as_millis() as u64,
                })
            }
            Admit::Full => Some(Unrouted::Rejected(LocalReply::new(
                429,
                self.refusals.full.0,
                self.refusals.full.1,
            ))),
        }
    }

    /// Waits until queued `ticket` holds a slot, or gives up.
    pub async fn wait(&self, ticket: u64) -> AdmissionOutcome {
        let Some((_, (_, wait, slot))) = self.queued.remove(&ticket) else {
            // Admitted already (asked twice), or never queued here.
            return if self.admission.holds(ticket) {
                admitted()
            } else {
                rejected(
                    503,
                    "service_unavailable",
                    "no queued request has this ticket",
                )
            };
        };
        match self.admission.wait(ticket, slot, wait).await {
            Ok(()) => admitted(),
            Err(e @ NotAdmitted::TimedOut(_)) => {
                rejected(408, self.refusals.timeout, &e.to_string())
            }
            Err(e @ NotAdmitted::Gone) => rejected(499, "client_cancelled", &e.to_string()),
        }
    }

    /// `ticket` ended (or will not be routed): frees its slot or its place.
    pub fn release(&self, ticket: u64) {
        self.queued.remove(&ticket);
        self.admission.release(ticket);
    }

    /// Forgets queued requests nobody waited for within their queue
    /// timeout (their front door went away), frees slots held past
    /// `timeout`, and forgets idle tenants' full buckets.
    pub fn reap(&self, timeout: Duration) -> usize {
        let stale: Vec<u64> = self
            .queued
            .iter()
            .filter(|e| e.value().0.elapsed() > e.value().1 + Duration::from_secs(5))
            .map(|e| *e.key())
            .collect();
        for ticket in &stale {
            self.release(*ticket);
        }
        if let Some(rates) = &self.rates {
            rates.reap();
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
mod tests;
