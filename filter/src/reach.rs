//! Whether the control plane answers, so that an outage does not cost
//! every request a failed call, nor a hung control plane every request
//! its whole deadline.
//!
//! While the session stream is down, a request asks with a unary call and
//! its end is reported with another. With the control plane gone, each of
//! those calls fails (Envoy finds no live endpoint, or the connection is
//! refused), and each failure cost Envoy more CPU than the request itself
//! (247 us of CPU a request at 16 clients, against 161 with the control
//! plane up) and wrote three warnings to Envoy's log. Once a call is
//! refused, the next call still goes at once: with several control planes,
//! Envoy ejected the one that refused, so that call reaches another. Once
//! that one is refused too, requests here skip the control plane and take
//! the outage fallback at once; one call a while goes out as a probe
//! (after 100 ms, doubled after each refused probe up to 2 s, as the
//! session's own backoff), and the first answer opens the way again. The
//! warnings are one when the control plane is lost and one when it
//! answers again.
//!
//! A hung control plane (its process frozen, its host dropping packets)
//! keeps the session stream up but answers nothing: each question waited
//! its whole deadline (`route_timeout_ms`, 500 ms) before the fallback.
//! The session has a gate of its own: a question that outlives its
//! deadline counts as a refusal there, and an answer of any kind on the
//! session as an answer, so while it hangs only the probes wait. The two
//! gates are apart because they watch different replicas: with several
//! control planes, calls refused by one being started or gone must not
//! keep questions off a session another answers.
//!
//! Where some replicas refuse and others answer, a gate may close and open
//! again many times a second: it warns at most once in `QUIET` (10 s), and says
//! so at debug level in between.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use log::{debug, warn};

/// gRPC `UNAVAILABLE`: Envoy's answer when no endpoint of the control
/// plane's cluster takes the call.
pub const UNAVAILABLE: u32 = 14;
/// gRPC `DEADLINE_EXCEEDED`: the control plane took the call but did not
/// answer in time (a hung process).
const DEADLINE_EXCEEDED: u32 = 4;
/// The wait before the first probe.
const FIRST_PROBE: Duration = Duration::from_millis(100);
/// The longest wait between probes.
const MAX_PROBE: Duration = Duration::from_secs(2);
/// The least time between two warnings of one gate.
const QUIET: Duration = Duration::from_secs(10);

/// The gate's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calls go out.
    Open,
    /// A call was refused at `since`: requests do not call until
    /// `probe_at`, when one call goes out (and the next probe is due a
    /// `backoff` later). `probing` while that call is out: only its
    /// refusal makes the next wait longer (calls sent before the first
    /// refusal may still fail after it). `skipped` counts the calls not
    /// made meanwhile.
    Refused {
        since: SystemTime,
        probe_at: SystemTime,
        backoff: Duration,
        probing: bool,
        skipped: u64,
        /// Whether its start was a warning (its end is then an info line).
        warned: bool,
    },
}

struct Inner {
    state: State,
    /// What the gate watches, for its log lines.
    name: &'static str,
    last_warning: Option<SystemTime>,
}

/// One VM's view of whether the control plane answers, shared by the root
/// context and the requests (the VM is single-threaded).
#[derive(Clone)]
pub struct Reach(Rc<RefCell<Inner>>);

impl Reach {
    /// An open gate watching `name` (said in its log lines).
    pub fn new(name: &'static str) -> Self {
        Reach(Rc::new(RefCell::new(Inner {
            state: State::Open,
            name,
            last_warning: None,
        })))
    }

    /// True when a call may go out at `now`: the control plane has not
    /// refused one, or a probe is due (this call is it).
    pub fn allows(&self, now: SystemTime) -> bool {
        let mut inner = self.0.borrow_mut();
        match &mut inner.state {
            State::Open => true,
            State::Refused {
                probe_at,
                backoff,
                probing,
                skipped,
                ..
            } => {
                if now >= *probe_at {
                    // One probe per wait: the next is due a backoff later
                    // even before this one is answered.
                    *probe_at = now + *backoff;
                    *probing = true;
                    true
                } else {
                    *skipped += 1;
                    false
                }
            }
        }
    }

    /// A call ended with gRPC status `status` at `now` (`None`: it could
    /// not go out). Refusals close the gate (or keep it closed, longer);
    /// any answer opens it. Other failures say nothing of reachability.
    pub fn call_ended(&self, status: Option<u32>, now: SystemTime) {
        match status {
            Some(0) => self.answered(now),
            None | Some(UNAVAILABLE) | Some(DEADLINE_EXCEEDED) => self.refused(status, now),
            Some(_) => {}
        }
    }

    /// A wait on the session (a question, an end's acknowledgement) ran
    /// past its deadline at `now`: a hung control plane, as far as can be
    /// told.
    pub fn timed_out(&self, now: SystemTime) {
        self.refused(Some(DEADLINE_EXCEEDED), now);
    }

    /// The control plane answered (a call, a message on the session, or
    /// the session's opening).
    pub fn answered(&self, now: SystemTime) {
        let mut inner = self.0.borrow_mut();
        if let State::Refused {
            since,
            skipped,
            warned,
            ..
        } = inner.state
        {
            let after = now.duration_since(since).unwrap_or_default();
            let level = if warned {
                log::Level::Info
            } else {
                log::Level::Debug
            };
            log::log!(
                level,
                "{} answers again after {} ms; {skipped} questions or calls were not sent meanwhile",
                inner.name,
                after.as_millis()
            );
            inner.state = State::Open;
        }
    }

    fn refused(&self, status: Option<u32>, now: SystemTime) {
        let mut inner = self.0.borrow_mut();
        let name = inner.name;
        let quiet_since = inner
            .last_warning
            .is_some_and(|at| now.duration_since(at).unwrap_or_default() < QUIET);
        match &mut inner.state {
            State::Open => {
                let why = match status {
                    None => "a call to it could not be sent".to_string(),
                    Some(DEADLINE_EXCEEDED) => "no answer in time".to_string(),
                    Some(code) => format!("a call refused (grpc status {code})"),
                };
                let warned = !quiet_since;
                if warned {
                    warn!(
                        "{name} does not answer: {why}; after one more try, requests take the outage fallback without asking it, and one every {} ms to {} s checks whether it is back (said at most once in {} s)",
                        FIRST_PROBE.as_millis(),
                        MAX_PROBE.as_secs(),
                        QUIET.as_secs()
                    );
                } else {
                    debug!("{name} does not answer again: {why}");
                }
                // The next call goes at once (another replica may take
                // it), and the one after waits the first backoff.
                inner.state = State::Refused {
                    since: now,
                    probe_at: now,
                    backoff: FIRST_PROBE,
                    probing: false,
                    skipped: 0,
                    warned,
                };
                if warned {
                    inner.last_warning = Some(now);
                }
            }
            State::Refused {
                probe_at,
                backoff,
                probing,
                ..
            } => {
                // A refused probe: wait, and longer the next time. (Or, as
                // far as can be told, a call sent before the first refusal,
                // which says nothing new.)
                if *probing {
                    *probing = false;
                    *probe_at = (*probe_at).max(now + *backoff);
                    *backoff = (*backoff * 2).min(MAX_PROBE);
                }
            }
        }
    }

    /// True while the control plane is taken to be unreachable.
    pub fn is_refused(&self) -> bool {
        matches!(self.0.borrow().state, State::Refused { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn calls_go_out_until_one_is_refused() {
        let reach = Reach::new("the control plane");
        assert!(reach.allows(at(0)));
        reach.call_ended(Some(0), at(1));
        assert!(reach.allows(at(2)));
        // A failure of the request's own (an invalid argument, say) is
        // not an outage.
        reach.call_ended(Some(3), at(3));
        assert!(reach.allows(at(4)));
        reach.call_ended(Some(UNAVAILABLE), at(5));
        assert!(reach.is_refused());
        // One more call at once, for another replica to take...
        assert!(reach.allows(at(6)));
        // ...and no other until the first probe is due.
        assert!(!reach.allows(at(7)));
        assert!(!reach.allows(at(105)));
        assert!(reach.allows(at(106)));
    }

    #[test]
    fn one_probe_per_wait_and_the_wait_doubles_while_refused() {
        let reach = Reach::new("the control plane");
        reach.call_ended(Some(UNAVAILABLE), at(0));
        assert!(reach.allows(at(0)));
        reach.call_ended(Some(UNAVAILABLE), at(2));
        // Refused twice: the first probe is due 100 ms later; only one goes.
        assert!(!reach.allows(at(101)));
        assert!(reach.allows(at(102)));
        assert!(!reach.allows(at(103)));
        reach.call_ended(Some(UNAVAILABLE), at(104));
        // Refused again: the next is due 200 ms later.
        assert!(!reach.allows(at(250)));
        assert!(reach.allows(at(304)));
        reach.call_ended(None, at(305));
        assert!(!reach.allows(at(600)));
        assert!(reach.allows(at(705)));
        // It goes on doubling, and stops growing at 2 s.
        let (mut now, mut wait) = (705, 400);
        for _ in 0..10 {
            reach.call_ended(Some(DEADLINE_EXCEEDED), at(now));
            wait = (wait * 2).min(2_000);
            now += wait;
            assert!(!reach.allows(at(now - 1)));
            assert!(reach.allows(at(now)));
        }
        assert_eq!(wait, 2_000);
    }

    #[test]
    fn calls_refused_together_count_once() {
        let reach = Reach::new("the control plane");
        // Eight questions out when the control plane froze all time out.
        for ms in 0..8 {
            reach.call_ended(Some(DEADLINE_EXCEEDED), at(ms));
        }
        // The next goes at once; its refusal starts the first wait, not
        // a wait eight times doubled.
        assert!(reach.allows(at(10)));
        reach.call_ended(Some(DEADLINE_EXCEEDED), at(510));
        assert!(!reach.allows(at(609)));
        assert!(reach.allows(at(610)));
    }

    #[test]
    fn any_answer_opens_the_gate() {
        let reach = Reach::new("the control plane");
        reach.call_ended(Some(UNAVAILABLE), at(0));
        assert!(reach.allows(at(1)));
        assert!(!reach.allows(at(50)));
        reach.answered(at(60));
        assert!(!reach.is_refused());
        assert!(reach.allows(at(61)));
        // Refused again later: back to the first wait, not the longest.
        reach.call_ended(Some(UNAVAILABLE), at(5_000));
        assert!(reach.allows(at(5_000)));
        reach.call_ended(Some(UNAVAILABLE), at(5_001));
        assert!(!reach.allows(at(5_100)));
        assert!(reach.allows(at(5_101)));
    }
}
