//! Requests the filter holds (paused) while it waits for something, and
//! the latest each may be held: the safety net under every wait.
//!
//! Each wait has its own deadline where it is made (a question on the
//! session, a call's timeout, a report's wait), and its own way to end:
//! an answer, a failure, the stream breaking. This catches whatever slips
//! through all of them (an answer delivered to nobody, a wait registered
//! after the sweep that should have ended it): an HTTP context has no timer
//! of its own, so the root context, on its tick, takes every request whose
//! hold outlived its deadline and ends the hold for it (the outage
//! fallback, the held answer let go, or a JSON 503). A paused request is
//! never left paused.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use crate::deadlines::Deadlines;

/// How much longer than its own deadline a wait may take before the safety
/// net ends it: the wait's own end (a call's timeout, the root's tick on
/// the session's deadlines) comes first whenever it works.
pub const SLACK: Duration = Duration::from_secs(1);

/// What a request is held for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The request itself: the decision, or an admission slot.
    Request,
    /// The answer's head: the prefill's outcome, or a failure's report.
    AnswerHead,
    /// The answer's last bytes: the control plane counting its end.
    AnswerEnd,
}

/// The held requests of one VM, by HTTP context id.
#[derive(Clone, Default)]
pub struct Holds(Rc<RefCell<Deadlines<u32, Hold>>>);

impl Holds {
    /// `context` is held for `hold` until `deadline` at most.
    pub fn hold(&self, context: u32, hold: Hold, deadline: SystemTime) {
        self.0.borrow_mut().insert(context, deadline, hold);
    }

    /// What `context` is held for, if anything.
    pub fn held(&self, context: u32) -> Option<Hold> {
        self.0.borrow().get(context).copied()
    }

    /// `context` is no longer held (it went on, was answered, or ended).
    pub fn release(&self, context: u32) {
        self.0.borrow_mut().remove(context);
    }

    /// Removes and returns the holds whose deadline is before `now`.
    pub fn expired(&self, now: SystemTime) -> Vec<(u32, Hold)> {
        self.0.borrow_mut().expired(now)
    }

    /// True when no request is held.
    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn each_hold_expires_once_after_its_deadline_unless_released() {
        let holds = Holds::default();
        holds.hold(1, Hold::Request, at(100));
        holds.hold(2, Hold::AnswerHead, at(200));
        holds.hold(3, Hold::AnswerEnd, at(100));
        holds.release(3);
        assert!(holds.expired(at(100)).is_empty());
        assert_eq!(holds.expired(at(101)), [(1, Hold::Request)]);
        assert!(holds.expired(at(101)).is_empty());
        // A new hold replaces the old one, deadline included.
        holds.hold(2, Hold::AnswerEnd, at(300));
        assert_eq!(holds.held(2), Some(Hold::AnswerEnd));
        assert!(holds.expired(at(250)).is_empty());
        assert_eq!(holds.expired(at(301)), [(2, Hold::AnswerEnd)]);
        assert!(holds.is_empty());
    }
}
