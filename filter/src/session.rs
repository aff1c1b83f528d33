//! The VM's session with the control plane: one long-lived gRPC stream
//! (`Session` in `proto/router.proto`), opened by the root context and
//! reopened with backoff when it breaks.
//!
//! A request's routing question goes up on it and the answer comes down,
//! matched by ticket; the request's end goes up the moment it ends. That
//! costs one HTTP/2 DATA frame each way instead of a new gRPC call (a new
//! stream through Envoy's gRPC client, headers and trailers) per request.
//!
//! Answers arrive at the root context, which owns the stream; it acts for
//! the waiting request (see `root.rs`). Every question has a deadline, kept
//! here and checked on the root's tick; when the stream breaks, every
//! question on it is over at once. Either way the request gets no answer
//! and takes the outage fallback, as a failed call would.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use log::warn;
use proxy_wasm::hostcalls;

use crate::deadlines::Deadlines;

/// First wait before reopening a broken stream; doubled on each failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait before reopening.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Larger questions (PD bodies) take a call of their own rather than hold
/// up every other request's question behind them on the one stream.
pub const MAX_QUESTION_BYTES: usize = 256 << 10;

/// The state of the VM's stream to the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// No stream. The next attempt is due at `retry_at`.
    Down {
        retry_at: SystemTime,
        backoff: Duration,
    },
    /// Opened; the control plane has not answered its opening yet, so
    /// questions still take calls of their own.
    Opening { token: u32, backoff: Duration },
    /// The control plane answered: questions and ends go on it.
    Up { token: u32 },
}

/// What a request waits for on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Wait {
    /// The answer to its routing question.
    Answer,
    /// PD: the outcome of its prefill half.
    Prefill,
    /// The control plane to have counted its end (its answer's last bytes
    /// are held until then).
    Counted,
}

impl Wait {
    /// Every kind: what a request may wait for, each at most once.
    const ALL: [Wait; 3] = [Wait::Answer, Wait::Prefill, Wait::Counted];
}

struct Inner {
    /// The root context, which owns the stream (sends are made as it).
    root: u32,
    link: Link,
    /// Requests waiting on the stream, by ticket and what they wait for: a
    /// PD request may wait for its prefill's outcome and for its end to be
    /// counted at once, and neither wait may replace the other (the answer
    /// to the replaced one would be dropped, and its request left waiting).
    /// The value is the waiting request's HTTP context.
    waiting: Deadlines<(u64, Wait), u32>,
}

/// One VM's session, shared by its root context and its requests (the VM
/// is single-threaded: `Rc<RefCell<..>>` is enough).
#[derive(Clone)]
pub struct Session(Rc<RefCell<Inner>>);

impl Session {
    /// The session of the VM whose root context is `root`; not open yet.
    pub fn new(root: u32) -> Self {
        Session(Rc::new(RefCell::new(Inner {
            root,
            link: Link::Down {
                retry_at: SystemTime::UNIX_EPOCH,
                backoff: FIRST_BACKOFF,
            },
            waiting: Deadlines::default(),
        })))
    }

    /// True when questions can go on the stream.
    pub fn is_up(&self) -> bool {
        matches!(self.0.borrow().link, Link::Up { .. })
    }

    /// Sends the question of `context` about `ticket`, to be answered
    /// before `deadline`. False when it could not be sent (the caller asks
    /// with a call of its own).
    pub fn ask(&self, context: u32, ticket: u64, message: &[u8], deadline: SystemTime) -> bool {
        self.send_and_wait(context, ticket, message, Wait::Answer, deadline)
    }

    /// Reports a request's end from `context`. False when it could not be
    /// sent (the caller queues it for the root's batched report).
    pub fn report(&self, context: u32, message: &[u8]) -> bool {
        self.send(context, message)
    }

    /// Reports the end of `ticket` from `context` and waits, until
    /// `deadline` at most, for the control plane to say it counted it.
    /// False when it could not be sent.
    pub fn report_and_wait(
        &self,
        context: u32,
        ticket: u64,
        message: &[u8],
        deadline: SystemTime,
    ) -> bool {
        self.send_and_wait(context, ticket, message, Wait::Counted, deadline)
    }

    /// PD: asks for the outcome of the prefill half sent for `ticket` and
    /// waits for it until `deadline`. False when it could not be sent.
    pub fn await_prefill(
        &self,
        context: u32,
        ticket: u64,
        message: &[u8],
        deadline: SystemTime,
    ) -> bool {
        self.send_and_wait(context, ticket, message, Wait::Prefill, deadline)
    }

    fn send_and_wait(
        &self,
        context: u32,
        ticket: u64,
        message: &[u8],
        wait: Wait,
        deadline: SystemTime,
    ) -> bool {
        if !self.send(context, message) {
            return false;
        }
        self.0
            .borrow_mut()
            .waiting
            .insert((ticket, wait), deadline, context);
        true
    }

    /// The request with `ticket` no longer waits (it ended).
    pub fn forget(&self, ticket: u64) {
        let mut inner = self.0.borrow_mut();
        for wait in Wait::ALL {
            inner.waiting.remove((ticket, wait));
        }
    }

    /// The request with `ticket` no longer waits for `wait` (it gave up).
    pub fn forget_wait(&self, ticket: u64, wait: Wait) {
        self.0.borrow_mut().waiting.remove((ticket, wait));
    }

    /// Sends `message` on the stream as the root context, then acts for
    /// `context` again.
    fn send(&self, context: u32, message: &[u8]) -> bool {
        let (root, token) = {
            let inner = self.0.borrow();
            match inner.link {
                Link::Up { token } => (inner.root, token),
                _ => return false,
            }
        };
        if hostcalls::set_effective_context(root).is_err() {
            return false;
        }
        let sent = hostcalls::send_grpc_stream_message(token, Some(message), false);
        if let Err(e) = hostcalls::set_effective_context(context) {
            warn!("cannot act for request {context} again: {e:?}");
        }
        match sent {
            Ok(()) => true,
            Err(e) => {
                warn!("cannot send on the control plane session: {e:?}");
                false
            }
        }
    }

    // What the root context does.

    /// True when no stream is open and the next attempt is due at `now`.
    pub fn due(&self, now: SystemTime) -> bool {
        matches!(self.0.borrow().link, Link::Down { retry_at, .. } if retry_at <= now)
    }

    /// The root opened the stream `token`.
    pub fn opened(&self, token: u32) {
        let mut inner = self.0.borrow_mut();
        let backoff = match inner.link {
            Link::Down { backoff, .. } => backoff,
            _ => FIRST_BACKOFF,
        };
        inner.link = Link::Opening { token, backoff };
    }

    /// Opening the stream failed at once: try again after the backoff.
    pub fn open_failed(&self, now: SystemTime) {
        let mut inner = self.0.borrow_mut();
        let backoff = match inner.link {
            Link::Down { backoff, .. } | Link::Opening { backoff, .. } => backoff,
            Link::Up { .. } => FIRST_BACKOFF,
        };
        inner.link = Link::Down {
            retry_at: now + backoff,
            backoff: (backoff * 2).min(MAX_BACKOFF),
        };
    }

    /// The control plane answered the opening of stream `token`.
    pub fn confirmed(&self, token: u32) {
        let mut inner = self.0.borrow_mut();
        if matches!(inner.link, Link::Opening { token: t, .. } if t == token) {
            inner.link = Link::Up { token };
        }
    }

    /// True when `token` is the current stream.
    pub fn owns(&self, token: u32) -> bool {
        match self.0.borrow().link {
            Link::Opening { token: t, .. } | Link::Up { token: t } => t == token,
            Link::Down { .. } => false,
        }
    }

    /// `wait` about `ticket` is over (its message arrived on the stream):
    /// the context that waits for it, if one still does.
    pub fn answered(&self, ticket: u64, wait: Wait) -> Option<u32> {
        let mut inner = self.0.borrow_mut();
        inner.waiting.remove((ticket, wait))
    }

    /// Stream `token` ended at `now`: every wait on it is over (the
    /// contexts are returned) and the next attempt waits for the backoff.
    pub fn closed(&self, token: u32, now: SystemTime) -> Vec<(u32, Wait)> {
        if !self.owns(token) {
            return Vec::new();
        }
        let mut inner = self.0.borrow_mut();
        let backoff = match inner.link {
            // It had worked: start again from the shortest wait.
            Link::Up { .. } => FIRST_BACKOFF,
            Link::Opening { backoff, .. } | Link::Down { backoff, .. } => backoff,
        };
        inner.link = Link::Down {
            retry_at: now + backoff,
            backoff: (backoff * 2).min(MAX_BACKOFF),
        };
        inner
            .waiting
            .drain()
            .into_iter()
            .map(|((_, wait), context)| (context, wait))
            .collect()
    }

    /// Waits whose deadline passed before `now`; they are removed.
    pub fn expired(&self, now: SystemTime) -> Vec<(u32, Wait)> {
        let late = self.0.borrow_mut().waiting.expired(now);
        late.into_iter()
            .map(|((_, wait), context)| (context, wait))
            .collect()
    }

    /// How many requests wait on the stream.
    pub fn waiting(&self) -> usize {
        self.0.borrow().waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn up(s: &Session, token: u32) {
        s.opened(token);
        s.confirmed(token);
    }

    /// `context` waits on `s` for the answer to `ticket`'s question.
    fn wait(s: &Session, ticket: u64, context: u32, deadline: SystemTime) {
        wait_for(s, ticket, Wait::Answer, context, deadline);
    }

    /// `context` waits on `s` for `kind` of `ticket`.
    fn wait_for(s: &Session, ticket: u64, kind: Wait, context: u32, deadline: SystemTime) {
        s.0.borrow_mut()
            .waiting
            .insert((ticket, kind), deadline, context);
    }

    #[test]
    fn questions_wait_only_on_a_confirmed_stream() {
        let s = Session::new(1);
        assert!(s.due(at(0)));
        s.opened(7);
        assert!(!s.is_up() && !s.due(at(0)));
        s.confirmed(8); // another stream's answer
        assert!(!s.is_up());
        s.confirmed(7);
        assert!(s.is_up());
    }

    #[test]
    fn each_answer_goes_to_the_context_that_asked_once() {
        let s = Session::new(1);
        up(&s, 7);
        wait(&s, 100, 11, at(50));
        wait(&s, 200, 12, at(50));
        assert_eq!(
            s.answered(200, Wait::Counted),
            None,
            "not what it waits for"
        );
        assert_eq!(s.answered(200, Wait::Answer), Some(12));
        assert_eq!(s.answered(200, Wait::Answer), None);
        assert_eq!(s.answered(100, Wait::Answer), Some(11));
        assert_eq!(s.waiting(), 0);
    }

    #[test]
    fn a_prefill_wait_and_an_end_wait_of_one_request_both_get_their_answer() {
        let s = Session::new(1);
        up(&s, 7);
        for kind in [Wait::Prefill, Wait::Counted] {
            wait_for(&s, 100, kind, 11, at(50));
        }
        // The end's acknowledgement first, then the prefill's outcome: the
        // second wait was not lost to the first.
        assert_eq!(s.answered(100, Wait::Counted), Some(11));
        assert_eq!(s.answered(100, Wait::Prefill), Some(11));
        assert_eq!(s.waiting(), 0);
        // A finished request forgets all its waits.
        for kind in Wait::ALL {
            wait_for(&s, 200, kind, 12, at(50));
        }
        s.forget(200);
        assert_eq!(s.waiting(), 0);
        // A request that gives up one wait keeps the other.
        for kind in [Wait::Answer, Wait::Counted] {
            wait_for(&s, 300, kind, 13, at(50));
        }
        s.forget_wait(300, Wait::Answer);
        assert_eq!(s.answered(300, Wait::Answer), None);
        assert_eq!(s.answered(300, Wait::Counted), Some(13));
    }

    #[test]
    fn a_broken_stream_ends_every_question_and_backs_off() {
        let s = Session::new(1);
        up(&s, 7);
        wait(&s, 100, 11, at(500));
        wait(&s, 200, 12, at(500));
        assert!(s.closed(3, at(10)).is_empty(), "not our stream");
        let mut ended = s.closed(7, at(10));
        ended.sort();
        assert_eq!(ended, [(11, Wait::Answer), (12, Wait::Answer)]);
        assert!(!s.due(at(10 + 99)));
        assert!(s.due(at(10 + 100)));
        // Failing again waits longer, up to the cap.
        s.opened(8);
        s.closed(8, at(200));
        assert!(!s.due(at(200 + 199)) && s.due(at(200 + 200)));
        for t in 9..20 {
            s.opened(t);
            s.closed(t, at(10_000));
        }
        assert!(s.due(at(10_000) + MAX_BACKOFF));
    }

    #[test]
    fn late_questions_expire_and_are_forgotten() {
        let s = Session::new(1);
        up(&s, 7);
        wait(&s, 100, 11, at(50));
        wait(&s, 200, 12, at(80));
        assert_eq!(s.expired(at(60)), [(11, Wait::Answer)]);
        assert_eq!(
            s.answered(100, Wait::Answer),
            None,
            "an expired question gets no answer"
        );
        s.forget(200);
        assert!(s.expired(at(1_000)).is_empty());
    }
}
