//! Requests waiting for their body, and how long each may wait.
//!
//! A client that announces a body and stops sending it (a `content-length`
//! larger than what follows, a stalled upload) would otherwise hold its
//! stream, and its share of the body budget, until Envoy's idle timeout. An
//! HTTP context has no timer of its own, so each waiting request registers
//! here and the root context, on its tick, answers 408 for every request
//! whose body made no progress within `body_idle_timeout_ms`.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::SystemTime;

use crate::deadlines::Deadlines;

/// The waiting requests of one VM, by HTTP context id.
#[derive(Clone, Default)]
pub struct BodyWaits(Rc<RefCell<Deadlines<u32, ()>>>);

impl BodyWaits {
    /// `context` may wait until `deadline` for more of its body.
    pub fn wait(&self, context: u32, deadline: SystemTime) {
        self.0.borrow_mut().insert(context, deadline, ());
    }

    /// `context` no longer waits (its body is complete, or it ended).
    pub fn done(&self, context: u32) {
        self.0.borrow_mut().remove(context);
    }

    /// Removes and returns the contexts whose deadline is before `now`.
    pub fn expired(&self, now: SystemTime) -> Vec<u32> {
        let expired = self.0.borrow_mut().expired(now);
        expired.into_iter().map(|(context, ())| context).collect()
    }

    /// How many requests wait.
    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }

    /// True when no request waits.
    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn only_passed_deadlines_expire_once() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let waits = BodyWaits::default();
        waits.wait(1, t0);
        waits.wait(2, t0 + Duration::from_secs(5));
        waits.wait(3, t0);
        waits.done(3);
        assert_eq!(waits.expired(t0), Vec::<u32>::new());
        assert_eq!(waits.expired(t0 + Duration::from_millis(1)), vec![1]);
        assert_eq!(
            waits.expired(t0 + Duration::from_millis(1)),
            Vec::<u32>::new()
        );
        // Progress moves the deadline.
        waits.wait(2, t0 + Duration::from_secs(10));
        assert!(waits.expired(t0 + Duration::from_secs(6)).is_empty());
        assert_eq!(waits.len(), 1);
    }
}
