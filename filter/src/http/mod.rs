//! One HTTP stream through the filter: Envoy's callbacks become events of
//! the request's [`Lifecycle`], and what the lifecycle says to do becomes
//! host calls (`steps.rs`) and calls to the control plane (`calls.rs`).
//! Everything about how a request behaves lives in the lifecycle crate.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use sglang_envoy_body::over_budget;
use sglang_envoy_lifecycle::{
    BodyStep, HeadStep, Lifecycle, LocalReply, RequestHead, ResponseHead, Settings,
};
use sglang_envoy_proto::{Completion, PRIORITY_HEADER, ROUTING_KEY_HEADER};

mod calls;
mod context;
mod control_plane;
mod hold;
mod local;
mod steps;

use calls::Calls;
pub use context::RequestContext;

use crate::body_wait::BodyWaits;
use crate::budget::{Budget, Reservation};
use crate::completions::CompletionQueue;
use crate::config::FilterConfig;
use crate::contexts::{CallOwners, Contexts};
use crate::fallback::Fallback;
use crate::holds::Holds;
use crate::host::{end_facts, EnvoyRequest};
use crate::reach::Reach;
use crate::reply::send_reply;
use crate::session::Session;
use crate::stats::Counter;

/// What one VM's requests share (built once by the root context).
#[derive(Clone)]
pub struct Shared {
    /// The plugin configuration.
    pub config: Rc<FilterConfig>,
    /// Finished requests, reported by the root context.
    pub queue: CompletionQueue,
    /// Set (for the whole VM) once the control plane asked for bodies.
    pub send_body: Rc<Cell<bool>>,
    /// Healthy workers to fall back on when the control plane is down.
    pub fallback: Fallback,
    /// Memory for the bodies this VM holds.
    pub budget: Budget,
    /// Requests waiting for their body, timed out by the root context.
    pub body_waits: BodyWaits,
    /// The stream to the control plane.
    pub session: Session,
    /// Whether the control plane takes unary calls (an outage skips them).
    pub reach_calls: Reach,
    /// Whether the control plane answers on the session (a hung one is
    /// not waited for).
    pub reach_session: Reach,
    /// Requests routed by the filter itself (Envoy's stats).
    pub local_fallbacks: Counter,
    /// The live requests, for the root context to act for.
    pub contexts: Contexts<Request>,
    /// Which request made each call in flight, for the root context to
    /// pass an answer that reached it on.
    pub call_owners: CallOwners,
    /// Requests the filter holds, and until when at most (the root context
    /// ends the holds that outlive their deadline).
    pub holds: Holds,
}

impl Shared {
    /// A unary call to the control plane ended with gRPC status `status`
    /// (`None`: not sent). An answer opens the calls' gate. A refusal
    /// closes it only while the session is not up: with the session up, a
    /// live replica answers it, and the refusal came from another (one
    /// being started, or gone).
    pub fn call_ended(&self, status: Option<u32>, now: SystemTime) {
        if status == Some(0) || !self.session.is_up() {
            self.reach_calls.call_ended(status, now);
        }
    }

    /// The level of a request's own line about the control plane's
    /// absence: debug while an outage is known (it was logged when it
    /// began, `reach.rs`), warn otherwise.
    pub fn outage_level(&self) -> log::Level {
        if self.reach_calls.is_refused() || self.reach_session.is_refused() {
            log::Level::Debug
        } else {
            log::Level::Warn
        }
    }
}

/// One HTTP stream passing through the filter.
///
/// It keeps nothing of the request's size: the body is read from Envoy's
/// buffer when the lifecycle needs it and dropped at once, so memory per
/// request waiting on the control plane is a few hundred bytes.
pub struct Request {
    shared: Shared,
    context_id: u32,
    /// This request's share of the VM's body budget.
    reservation: Reservation,
    lc: Lifecycle,
    started: Option<SystemTime>,
    /// Calls to the control plane (and the outage prefill) in flight.
    calls: Calls,
    /// Bytes of the answer's body Envoy holds because we paused it.
    response_held: usize,
    /// PD: when the prefill's outcome is due at the latest.
    prefill_until: Option<SystemTime>,
    /// The end reported with a `Complete` call of its own (`Call::End`),
    /// kept until that call answers: if it fails, or the stream ends
    /// first, the end goes into the root's batched report instead.
    end_on_call: Option<Completion>,
}

impl Request {
    /// HTTP context `context_id` with its `ticket`, sharing `shared`.
    pub fn new(shared: &Shared, context_id: u32, ticket: u64) -> Self {
        let settings = Settings {
            // The smaller of the filter's limit and the control plane's
            // --max-payload-size (once a worker list has said it).
            max_body_bytes: shared
                .fallback
                .max_body_bytes()
                .map_or(shared.config.max_body_bytes, |cp| {
                    cp.min(shared.config.max_body_bytes)
                }),
            // Envoy calls the filter with the answer's body while the
            // filter holds its head.
            body_while_head_held: true,
            // Known from the control plane's worker lists; until the first
            // arrives, the control plane's own check stands.
            client_key: shared.fallback.client_key(),
        };
        Request {
            shared: shared.clone(),
            context_id,
            reservation: shared.budget.reservation(),
            lc: Lifecycle::new(ticket, settings),
            started: None,
            calls: Calls::new(context_id, shared.call_owners.clone()),
            response_held: 0,
            prefill_until: None,
            end_on_call: None,
        }
    }

    fn config(&self) -> &FilterConfig {
        &self.shared.config
    }

    /// The request, as the lifecycle reads it from Envoy.
    fn source(&self) -> EnvoyRequest {
        EnvoyRequest {
            body_bytes: self.lc.body_bytes(),
        }
    }

    /// Ends the request with the router's own error.
    fn reply(&mut self, reply: LocalReply) {
        self.unhold();
        let reply = self.lc.refuse(reply);
        send_reply(self, &reply);
    }

    fn elapsed_us(&self) -> u64 {
        let now = self.get_current_time();
        self.started
            .and_then(|s| now.duration_since(s).ok())
            .map_or(0, |d| d.as_micros() as u64)
    }

    /// (Re)arms the deadline for the next piece of the body.
    fn wait_for_body(&self) {
        let deadline =
            self.get_current_time() + Duration::from_millis(self.config().body_idle_timeout_ms);
        self.shared.body_waits.wait(self.context_id, deadline);
    }

    /// Ends the request over its body, giving its budget back at once.
    fn refuse_body(&mut self, reply: LocalReply) -> Action {
        self.shared.body_waits.done(self.context_id);
        self.reservation.release();
        self.reply(reply);
        Action::Pause
    }
}

impl Context for Request {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if let Some(call) = self.calls.take(token) {
            self.answered(call, None, body_size);
        }
    }

    fn on_grpc_call_response(&mut self, token: u32, status_code: u32, size: usize) {
        if let Some(call) = self.calls.take(token) {
            self.answered(call, Some(status_code), size);
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        self.started = Some(self.get_current_time());
        // Only the control plane chooses the worker: a client must not.
        self.set_http_request_header(&self.shared.config.endpoint_header, None);
        // One host call for every header the lifecycle reads, rather than
        // one per header: each call crosses the wasm ABI (Envoy bounds the
        // headers' size, so the copy is bounded too).
        let headers = self.get_http_request_headers();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map_or("", |(_, v)| v.as_str())
        };
        if let Some(trap) = &self.config().test_trap_header {
            if headers.iter().any(|(n, _)| n == trap) {
                // The one deliberate panic: tests configure it to prove that
                // a crashed VM does not outlive the request that crashed it.
                panic!("test_trap_header present: trapping the VM as configured");
            }
        }
        let tenant_header = self.shared.fallback.tenant_header();
        // Envoy's own record of the peer: a client cannot forge it.
        let client_address = self
            .get_property(vec!["source", "address"])
            .and_then(|a| String::from_utf8(a).ok())
            .unwrap_or_default();
        let step = self.lc.on_request_head(RequestHead {
            method: header(":method"),
            path: header(":path"),
            end_of_stream,
            content_length: header("content-length").parse::<usize>().ok(),
            request_id: header("x-request-id"),
            routing_key: header(ROUTING_KEY_HEADER),
            authorization: header("authorization"),
            traceparent: header("traceparent"),
            tenant: tenant_header.as_deref().map_or("", header),
            priority: header(PRIORITY_HEADER),
            client_address: &client_address,
        });
        match step {
            HeadStep::Reply(r) => {
                self.reply(r);
                Action::Pause
            }
            HeadStep::ReadBody => {
                // Wait for the body (needs `allow_on_headers_stop_iteration`).
                self.wait_for_body();
                Action::Pause
            }
            HeadStep::Ask(question) => self.ask(*question).action(),
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.lc.reading_body() {
            // An info GET with a body (held with its head until the
            // decision lets both go), or the rest after a refusal.
            return if self.lc.forwarded() {
                Action::Continue
            } else {
                Action::Pause
            };
        }
        if let Some(reply) = self.lc.on_body_progress(body_size) {
            return self.refuse_body(reply);
        }
        if !self.reservation.grow_to(body_size) {
            return self.refuse_body(over_budget().into());
        }
        if !end_of_stream {
            self.wait_for_body();
            return Action::Pause;
        }
        self.shared.body_waits.done(self.context_id);
        let source = EnvoyRequest {
            body_bytes: body_size,
        };
        let step = self.lc.on_body(&source, self.shared.send_body.get());
        self.run(step).action()
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        match self.lc.on_request_trailers() {
            Some(reply) => self.refuse_body(reply),
            None => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        // The worker has read the body: it no longer counts against the VM.
        self.reservation.release();
        self.shared.body_waits.done(self.context_id);
        let head = ResponseHead {
            status: self
                .get_http_response_header(":status")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            sse: self
                .get_http_response_header("content-type")
                .is_some_and(|t| t.starts_with("text/event-stream")),
            end_of_stream,
        };
        let elapsed_us = self.elapsed_us();
        let step = self.lc.on_response_head(head, || end_facts(elapsed_us));
        let action = self.response_head_step(step);
        if end_of_stream && action == Action::Continue && self.answer_sent() == Flow::Wait {
            return Action::Pause;
        }
        action
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let fresh = size.saturating_sub(self.response_held);
        if let Some(prefilled) = self.lc.on_response_bytes(fresh) {
            // Rides up with the session's next message; lost with the
            // session, as the request's end then releases the work.
            let _ = self.shared.session.report_end(self.context_id, prefilled);
        }
        // Envoy's buffer starts with what we held back before.
        let chunk = if self.lc.needs_response_bytes() {
            self.get_http_response_body(self.response_held, fresh)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let action = match self.lc.on_response_body(&chunk, end_of_stream) {
            BodyStep::Pass => {
                self.response_held = 0;
                Action::Continue
            }
            BodyStep::Hold => {
                self.response_held = size;
                if end_of_stream {
                    self.answer_whole();
                }
                return Action::Pause;
            }
            BodyStep::Replace(body) => {
                self.set_http_response_body(0, size, &body);
                self.response_held = 0;
                Action::Continue
            }
        };
        if end_of_stream && self.answer_sent() == Flow::Wait {
            return Action::Pause;
        }
        action
    }

    fn on_http_response_trailers(&mut self, _trailers: usize) -> Action {
        self.lc.on_response_end();
        if self.answer_sent() == Flow::Wait {
            return Action::Pause;
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.shared.body_waits.done(self.context_id);
        self.unhold();
        self.shared.session.forget(self.lc.ticket());
        self.calls.forget_all();
        self.reservation.release();
        // Its call was cancelled with the stream, maybe before it arrived
        // (the control plane counts an end once, so a second report of it
        // is harmless).
        if let Some(completion) = self.end_on_call.take() {
            self.shared.queue.push(completion);
        }
        let elapsed_us = self.elapsed_us();
        if let Some(completion) = self.lc.end(|| end_facts(elapsed_us)) {
            self.report_end(completion, false);
        }
    }
}

impl Request {
    /// The answer's last bytes are about to go to the client: report the
    /// end now (`on_log` comes after the client has them). They wait
    /// (`Flow::Wait`) until the control plane has counted it
    /// (`exact_loads`).
    fn answer_sent(&mut self) -> Flow {
        let elapsed_us = self.elapsed_us();
        match self.lc.end(|| end_facts(elapsed_us)) {
            Some(completion) => {
                let hold = self.shared.config.exact_loads;
                self.report_end(completion, hold)
            }
            None => Flow::Go,
        }
    }
}

/// Whether the request (or its answer) goes on now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Let it go on.
    Go,
    /// Keep it paused (an answer, a local reply or more body is awaited).
    Wait,
}

impl Flow {
    /// The action for an Envoy callback.
    fn action(self) -> Action {
        match self {
            Flow::Go => Action::Continue,
            Flow::Wait => Action::Pause,
        }
    }
}
