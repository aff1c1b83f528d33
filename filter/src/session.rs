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
//! here and checked on the root's tick; past it the request gets no answer
//! and takes the outage fallback, as a failed call would.
//!
//! Several control planes may stand behind the cluster (issue 28). When the
//! stream breaks (its replica died), the root opens the next one on its
//! next tick (20 ms), and the questions that were on the broken stream wait
//! for it: they are sent again, once, on the tick after a control plane
//! answers its opening, so they reach a live replica without waiting for a
//! deadline.
//! Questions asked while a stream is opening wait for it the same way
//! rather than take calls of their own: a request's question and its end
//! then travel on one stream, to the one replica that counted its load.
//!
//! A control plane that says so when the stream opens (`ENDS_RIDE_METADATA`)
//! takes ends with the stream's next message (`SessionUp.ends`): an end
//! waits here for the next question, `synced` or tick, and costs no
//! message of its own. The control plane reads them before the message
//! they ride with, so this VM's next question is routed on loads that
//! count them.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use log::warn;
use prost::Message;
use proxy_wasm::hostcalls;
use sglang_envoy_proto::session_up::Kind;
use sglang_envoy_proto::{Completion, SessionUp};

use crate::deadlines::Deadlines;
use link::Link;

mod link;

/// The default of `session_question_max_bytes`. Larger questions take a
/// call of their own rather than hold up every other request's question
/// behind them on the one stream. A question with
/// its body (PD, exact cache state) goes on the session up to this size, a
/// prompt of about a million tokens: its prefill wait and its end follow it
/// there, to the replica that counted it. A call goes to whichever replica
/// Envoy picks, and with several, its prefill wait and end may reach
/// another, which knows nothing of it (256 KiB here failed half of such
/// requests with two replicas: `tests/e2e/tests/replica_calls.rs`).
pub const DEFAULT_QUESTION_MAX_BYTES: usize = 4 << 20;
/// Ends kept for the next message at most; one more sends them at once.
const MAX_RIDING_ENDS: usize = 64;

/// What a request waits for on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Wait {
    /// The answer to its routing question.
    Answer,
    /// PD: the outcome of its prefill half.
    Prefill,
}

impl Wait {
    /// Every kind: what a request may wait for, each at most once.
    const ALL: [Wait; 2] = [Wait::Answer, Wait::Prefill];
}

/// What becomes of a question when its stream breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resend {
    /// Nothing is sent again: prefill and end waits (their replica held
    /// the state they wait on), and questions already sent twice.
    Never,
    /// Sent on the current stream; waits for the next one if it breaks.
    Once(Vec<u8>),
    /// Waits for a stream to go up, then is sent; `again` when it was sent
    /// before (it is then not kept a third time).
    Queued { message: Vec<u8>, again: bool },
}

/// A request waiting on the stream.
#[derive(Debug)]
struct Waiter {
    /// The waiting request's HTTP context.
    context: u32,
    resend: Resend,
}

/// Sends a message on stream `token` as the root context `root`, then acts
/// for request `context` again; false when it failed. The host's
/// ([`send_as_root`]) outside unit tests.
type Sender = fn(root: u32, context: u32, token: u32, message: &[u8]) -> bool;

struct Inner {
    /// The root context, which owns the stream (sends are made as it).
    root: u32,
    send: Sender,
    link: Link,
    /// Requests waiting on the stream, by ticket and what they wait for: a
    /// PD request may wait for its prefill's outcome and for its end to be
    /// counted at once, and neither wait may replace the other (the answer
    /// to the replaced one would be dropped, and its request left waiting).
    waiting: Deadlines<(u64, Wait), Waiter>,
    /// Ends waiting to ride up with the stream's next message: encoded
    /// `SessionUp.ends` entries (protobuf fields concatenate, so these
    /// bytes prepended to any encoded `SessionUp` add them to it).
    riding: Vec<u8>,
    /// How many ends `riding` holds.
    riding_count: usize,
    /// Ends that were riding when their stream broke, for the root's
    /// batched `Complete`.
    unsent: Vec<Completion>,
    /// The root's configured tick, and the period it ticks at now
    /// ([`Session::retick`]).
    tick: Duration,
    ticking: Duration,
}

/// The root's tick while questions wait for a stream that is opening: the
/// stream opens on a tick and its questions go on the tick after its
/// control plane answers, so at the configured 20 ms a VM's first request
/// waited two ticks (measured 30-50 ms against 3 ms once up).
pub const FAST_TICK: Duration = Duration::from_millis(1);

/// One VM's session, shared by its root context and its requests (the VM
/// is single-threaded: `Rc<RefCell<..>>` is enough).
#[derive(Clone)]
pub struct Session(Rc<RefCell<Inner>>);

impl Session {
    /// The session of the VM whose root context is `root`; not open yet.
    pub fn new(root: u32) -> Self {
        Self::with_sender(root, send_as_root)
    }

    /// A session that sends through `send`.
    fn with_sender(root: u32, send: Sender) -> Self {
        Session(Rc::new(RefCell::new(Inner {
            root,
            send,
            link: Link::first(true),
            waiting: Deadlines::default(),
            riding: Vec::new(),
            riding_count: 0,
            unsent: Vec::new(),
            tick: Duration::ZERO,
            ticking: Duration::ZERO,
        })))
    }

    /// The root ticks every `tick`: a VM's first questions wait for its
    /// first stream (opened on the next tick) only when that is at most
    /// [`link::FIRST_WAIT_MAX_TICK`] away; otherwise they take calls.
    pub fn set_tick(&self, tick: Duration) {
        let mut inner = self.0.borrow_mut();
        inner.tick = tick;
        inner.ticking = tick;
        if let Link::First { opening: None, .. } = inner.link {
            inner.link = Link::first(tick <= link::FIRST_WAIT_MAX_TICK);
        }
    }

    /// The period the root should tick at from now, when it differs from
    /// the one it ticks at (recorded as set): [`FAST_TICK`] while questions
    /// wait for a stream that is opening, else the configured tick. The
    /// caller sets it (`proxy_set_tick_period`).
    pub fn retick(&self) -> Option<Duration> {
        let mut inner = self.0.borrow_mut();
        let waiting = !matches!(inner.link, Link::Up { .. })
            && inner
                .waiting
                .iter()
                .any(|(_, w)| matches!(w.resend, Resend::Queued { .. }));
        let wanted = if waiting {
            FAST_TICK.min(inner.tick)
        } else {
            inner.tick
        };
        if wanted == inner.ticking || inner.tick.is_zero() {
            return None;
        }
        inner.ticking = wanted;
        Some(wanted)
    }

    /// True when questions can go on the stream.
    pub fn is_up(&self) -> bool {
        self.up_token().is_some()
    }

    /// True when a question asked at `now` goes on the stream: it is up,
    /// opening, or about to be reopened (the question waits for it).
    pub fn takes_questions(&self, now: SystemTime) -> bool {
        self.0.borrow().link.takes_questions(now)
    }

    /// Sends the question of `context` about `ticket`, to be answered
    /// before `deadline`, or queues it for the stream about to open. False
    /// when there is none to wait for (the caller asks with a call of its
    /// own).
    pub fn ask(
        &self,
        context: u32,
        ticket: u64,
        message: Vec<u8>,
        now: SystemTime,
        deadline: SystemTime,
    ) -> bool {
        if !self.takes_questions(now) {
            return false;
        }
        let resend = if self.is_up() {
            if !self.send(context, &message) {
                return false;
            }
            Resend::Once(message)
        } else {
            Resend::Queued {
                message,
                again: false,
            }
        };
        let waiter = Waiter { context, resend };
        self.0
            .borrow_mut()
            .waiting
            .insert((ticket, Wait::Answer), deadline, waiter);
        true
    }

    /// Reports a request's end from `context`: kept to ride up with the
    /// next message when the control plane takes that, else sent. Given
    /// back when it could not be sent (the caller queues it for the
    /// root's batched report).
    pub fn report_end(&self, context: u32, end: Completion) -> Result<(), Completion> {
        if !self.ends_ride() {
            let up = SessionUp {
                kind: Some(Kind::End(end)),
                ..Default::default()
            };
            if self.send(context, &up.encode_to_vec()) {
                return Ok(());
            }
            return match up.kind {
                Some(Kind::End(end)) => Err(end),
                _ => Ok(()),
            };
        }
        let full = {
            let mut inner = self.0.borrow_mut();
            let entry = SessionUp {
                ends: vec![end],
                ..Default::default()
            };
            entry.encode_raw(&mut inner.riding);
            inner.riding_count += 1;
            inner.riding_count >= MAX_RIDING_ENDS
        };
        if full {
            // Alone: an empty message carries just the ends.
            self.send(context, &[]);
        }
        Ok(())
    }

    /// True when the stream is up and its control plane takes riding ends.
    fn ends_ride(&self) -> bool {
        matches!(
            self.0.borrow().link,
            Link::Up {
                ends_ride: true,
                ..
            }
        )
    }

    /// Ends that were riding when their stream broke (or could not go up
    /// with a message): the root reports them with a `Complete` call.
    pub fn take_unsent_ends(&self) -> Vec<Completion> {
        std::mem::take(&mut self.0.borrow_mut().unsent)
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
        self.send(context, message) && self.expect_prefill(context, ticket, deadline)
    }

    /// PD: waits until `deadline` for the outcome of the prefill half sent
    /// for `ticket`, which the control plane sends unasked. False when the
    /// stream is not up (the outcome promised on it will not come).
    pub fn expect_prefill(&self, context: u32, ticket: u64, deadline: SystemTime) -> bool {
        let mut inner = self.0.borrow_mut();
        if !matches!(inner.link, Link::Up { .. }) {
            return false;
        }
        let waiter = Waiter {
            context,
            resend: Resend::Never,
        };
        inner
            .waiting
            .insert((ticket, Wait::Prefill), deadline, waiter);
        true
    }

    /// Answers the control plane's `sync` on the stream, from the root
    /// context (which owns it). Every end sent before has gone up before
    /// it: the control plane counted them once it reads this.
    pub fn answer_sync(&self, message: &[u8]) -> bool {
        let Link::Up { token, .. } = self.0.borrow().link else {
            return false;
        };
        self.with_riding(message, |out| send_on(token, out))
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
        let (root, token, send) = {
            let inner = self.0.borrow();
            match inner.link {
                Link::Up { token, .. } => (inner.root, token, inner.send),
                _ => return false,
            }
        };
        self.with_riding(message, |out| send(root, context, token, out))
    }

    /// Sends `message` through `send` with the riding ends prepended; they
    /// are gone once it is sent, and kept for the next message otherwise.
    /// (No borrow is held while sending: the host may call back.)
    fn with_riding(&self, message: &[u8], send: impl FnOnce(&[u8]) -> bool) -> bool {
        let (mut out, count) = {
            let mut inner = self.0.borrow_mut();
            let count = std::mem::take(&mut inner.riding_count);
            (std::mem::take(&mut inner.riding), count)
        };
        if count == 0 {
            return send(message);
        }
        let riding = out.len();
        out.extend_from_slice(message);
        if send(&out) {
            return true;
        }
        out.truncate(riding);
        let mut inner = self.0.borrow_mut();
        out.append(&mut inner.riding);
        inner.riding = out;
        inner.riding_count += count;
        false
    }

    // What the root context does.

    /// True while the VM's first stream is being tried, one quick try
    /// after another, and its questions wait for it: the root makes no
    /// call meanwhile, which would move Envoy's round robin between the
    /// tries ([`Link::first_tries`]).
    pub fn first_tries(&self) -> bool {
        self.0.borrow().link.first_tries()
    }

    /// True when no stream is open and the next attempt is due at `now`.
    pub fn due(&self, now: SystemTime) -> bool {
        self.0.borrow().link.due(now)
    }

    /// The root opened the stream `token` at `now`.
    pub fn opened(&self, token: u32, now: SystemTime) {
        let mut inner = self.0.borrow_mut();
        inner.link = inner.link.opened(token, now);
    }

    /// The stream that is up, if one is.
    pub fn up_token(&self) -> Option<u32> {
        match self.0.borrow().link {
            Link::Up { token, .. } => Some(token),
            _ => None,
        }
    }

    /// The stream whose opening went unanswered too long by `now`
    /// ([`link::OPENING_PATIENCE`]): the root cancels it and gives it up
    /// ([`Self::closed`]), and the next try opens.
    pub fn overdue_opening(&self, now: SystemTime) -> Option<u32> {
        self.0.borrow().link.overdue(now)
    }

    /// Opening the stream failed at once: try again after the backoff.
    /// Returns the waits that are over, as [`Session::closed`] does.
    pub fn open_failed(&self, now: SystemTime) -> Vec<(u32, Wait)> {
        self.broke(now)
    }

    /// Stream `token` got its initial metadata at `now`: it is up.
    ///
    /// Envoy hands a stream that failed (a replica refusing the
    /// connection) empty initial metadata too, then its trailers in the
    /// same call: the root confirms only metadata with entries. And
    /// nothing is sent from here: the
    /// questions waiting for a stream go on the root's next tick
    /// ([`Session::flush`]), by when a stream that failed is closed. (A
    /// send from this callback met the closing stream and Envoy called back
    /// into the SDK's dispatcher, which panicked: proxy-wasm 0.2.5.)
    /// `ends_ride`: its control plane takes ends with the next message.
    pub fn confirmed(&self, token: u32, now: SystemTime, ends_ride: bool) {
        let mut inner = self.0.borrow_mut();
        inner.link = inner.link.confirmed(token, now, ends_ride);
    }

    /// Sends the questions waiting for a stream, when one is up, through
    /// `send` (the root passes [`send_on`]; false when a message could not
    /// be sent: it stays queued, and its deadline ends its wait).
    /// Ends still riding go up alone (the tick bounds how long an end
    /// waits).
    pub fn flush(&self, mut send: impl FnMut(u32, &[u8]) -> bool) {
        let Link::Up { token, .. } = self.0.borrow().link else {
            return;
        };
        self.with_riding(&[], |out| out.is_empty() || send(token, out));
        let mut inner = self.0.borrow_mut();
        for (_, waiter) in inner.waiting.iter_mut() {
            let Resend::Queued { message, again } = &mut waiter.resend else {
                continue;
            };
            if !send(token, message) {
                continue;
            }
            waiter.resend = if *again {
                Resend::Never
            } else {
                Resend::Once(std::mem::take(message))
            };
        }
    }

    /// True when `token` is the current stream.
    pub fn owns(&self, token: u32) -> bool {
        self.0.borrow().link.owns(token)
    }

    /// `wait` about `ticket` is over (its message arrived on the stream):
    /// the context that waits for it, if one still does.
    pub fn answered(&self, ticket: u64, wait: Wait) -> Option<u32> {
        let mut inner = self.0.borrow_mut();
        inner.waiting.remove((ticket, wait)).map(|w| w.context)
    }

    /// Stream `token` ended at `now`. The waits that cannot outlive it are
    /// over (their contexts are returned); questions sent on it once wait
    /// for the next stream, as do those queued for it, while that is due at
    /// once: a stream that was up is reopened on the root's next tick, and
    /// once more if that fails. After that the backoff starts, and the
    /// questions still waiting are over too (every control plane may be
    /// down: they fall back now rather than at their deadline).
    pub fn closed(&self, token: u32, now: SystemTime) -> Vec<(u32, Wait)> {
        if !self.owns(token) {
            return Vec::new();
        }
        self.broke(now)
    }

    /// The stream broke (or could not be opened) at `now`: the next link,
    /// and the waits that are over.
    fn broke(&self, now: SystemTime) -> Vec<(u32, Wait)> {
        let mut inner = self.0.borrow_mut();
        // Their stream's control plane releases what it counted on it; the
        // batched report tells whichever answers next (a no-op for tickets
        // it does not hold).
        let riding = std::mem::take(&mut inner.riding);
        inner.riding_count = 0;
        if let Ok(up) = SessionUp::decode(riding.as_slice()) {
            inner.unsent.extend(up.ends);
        }
        inner.link = inner.link.broke(now);
        // Questions wait only for the quick tries, which are due now.
        let retry_now = inner.link.retries_now();
        let mut over = Vec::new();
        for ((ticket, wait), waiter) in inner.waiting.iter_mut() {
            match &mut waiter.resend {
                Resend::Once(message) if retry_now => {
                    waiter.resend = Resend::Queued {
                        message: std::mem::take(message),
                        again: true,
                    }
                }
                Resend::Queued { .. } if retry_now => {}
                _ => over.push((*ticket, *wait)),
            }
        }
        over.into_iter()
            .filter_map(|key| Some((inner.waiting.remove(key)?.context, key.1)))
            .collect()
    }

    /// Waits whose deadline passed before `now`; they are removed.
    pub fn expired(&self, now: SystemTime) -> Vec<(u32, Wait)> {
        let late = self.0.borrow_mut().waiting.expired(now);
        late.into_iter()
            .map(|((_, wait), waiter)| (waiter.context, wait))
            .collect()
    }

    /// How many requests wait on the stream.
    pub fn waiting(&self) -> usize {
        self.0.borrow().waiting.len()
    }
}

/// The host's [`Sender`].
fn send_as_root(root: u32, context: u32, token: u32, message: &[u8]) -> bool {
    as_root(root, Some(context), || send_on(token, message)).unwrap_or(false)
}

/// Sets the root's tick to what [`Session::retick`] wants, acting as the
/// root; then, when `context` is a request's, acts for it again.
pub fn keep_tick(session: &Session, context: Option<u32>) {
    let Some(period) = session.retick() else {
        return;
    };
    let root = session.0.borrow().root;
    as_root(root, context, || {
        if let Err(e) = hostcalls::set_tick_period(period) {
            warn!("cannot set the tick period: {e:?}");
        }
    });
}

/// Runs `f` as the root context `root` (its stream and its tick are the
/// root's), then acts for request `context` again; with no `context`, the
/// root is already the effective context. `None` when the root cannot be
/// acted as.
fn as_root<T>(root: u32, context: Option<u32>, f: impl FnOnce() -> T) -> Option<T> {
    let Some(context) = context else {
        return Some(f());
    };
    if hostcalls::set_effective_context(root).is_err() {
        return None;
    }
    let out = f();
    if let Err(e) = hostcalls::set_effective_context(context) {
        warn!("cannot act for request {context} again: {e:?}");
    }
    Some(out)
}

/// Sends `message` on stream `token`, acting as whichever context is
/// effective (the stream's owner, the root). False when it failed.
pub fn send_on(token: u32, message: &[u8]) -> bool {
    match hostcalls::send_grpc_stream_message(token, Some(message), false) {
        Ok(()) => true,
        Err(e) => {
            warn!("cannot send on the control plane session: {e:?}");
            false
        }
    }
}

#[cfg(test)]
mod tests;
