use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use log::{debug, warn};
use prost::Message;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use sglang_envoy_body::{
    over_budget, too_large, BodyError, Endpoint, Head, Refusal, RequestBody, Route,
};
use sglang_envoy_proto::{
    route_response, Decision, Header, RouteRequest, RouteResponse, ROUTING_KEY_HEADER, SERVICE_NAME,
};

mod admission;
mod local;
mod outcome;
mod prefill;

use prefill::Prefill;

use crate::body_wait::BodyWaits;
use crate::budget::{Budget, Reservation};
use crate::completions::CompletionQueue;
use crate::config::FilterConfig;
use crate::fallback::Fallback;
use crate::reply::{send_error, send_refusal};

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
}

/// One HTTP stream passing through the filter.
///
/// It keeps nothing of the request's size: the body and its routing text
/// are read from Envoy's buffer when a question is built and dropped once
/// it is sent, so memory per request waiting on the control plane is a few
/// hundred bytes.
pub struct Request {
    config: Rc<FilterConfig>,
    queue: CompletionQueue,
    /// Set (for the whole VM) once the control plane asked for bodies.
    send_body: Rc<Cell<bool>>,
    /// Healthy workers to fall back on when the control plane is down.
    fallback: Fallback,
    /// Requests waiting for their body; this one is `context_id`.
    body_waits: BodyWaits,
    context_id: u32,
    /// This request's share of the VM's body budget.
    reservation: Reservation,
    ticket: u64,
    /// The inference route, for POSTs whose body we route on.
    route: Option<Route>,
    path: String,
    method: String,
    started: Option<SystemTime>,
    /// Set once a `Route` call was dispatched: from then on the control plane
    /// may have counted load under our ticket, so `on_log` must report it.
    asked: bool,
    /// The request went on towards its worker (the decision is applied).
    resumed: bool,
    /// The response reached its end (as opposed to a hang-up or reset).
    response_done: bool,
    /// Size of the body the question was about, to build it again with the
    /// body itself (`NeedBody`) or to route locally.
    body_bytes: usize,
    /// The last question sent carried the body.
    sent_body: bool,
    /// The outstanding `AwaitPrefill` call.
    prefill_call: Option<u32>,
    /// The outstanding `AwaitAdmission` call (admission control queued us).
    admission_call: Option<u32>,
    /// The outstanding early report of a failed answer (`outcome.rs`).
    outcome_call: Option<u32>,
    /// Outage fallback in PD mode: the prefill request the filter sent itself.
    prefill_http: Option<u32>,
    prefill: Prefill,
    /// Merge the prefill's input logprobs into the answer.
    merge_logprobs: bool,
    /// The response's headers wait for the prefill's outcome.
    response_paused: bool,
    /// The answer is an SSE stream.
    response_is_sse: bool,
    /// Bytes of the answer held while waiting, and whether they are all.
    buffered: usize,
    body_ended: bool,
}

impl Request {
    /// HTTP context `context_id` with its `ticket`, sharing `shared`.
    pub fn new(shared: &Shared, context_id: u32, ticket: u64) -> Self {
        Request {
            config: shared.config.clone(),
            queue: shared.queue.clone(),
            send_body: shared.send_body.clone(),
            fallback: shared.fallback.clone(),
            body_waits: shared.body_waits.clone(),
            context_id,
            reservation: shared.budget.reservation(),
            ticket,
            route: None,
            path: String::new(),
            method: String::new(),
            started: None,
            asked: false,
            resumed: false,
            response_done: false,
            body_bytes: 0,
            sent_body: false,
            prefill_call: None,
            admission_call: None,
            outcome_call: None,
            prefill_http: None,
            prefill: Prefill::None,
            merge_logprobs: false,
            response_paused: false,
            response_is_sse: false,
            buffered: 0,
            body_ended: false,
        }
    }

    /// The routing question for this request, built from the body in
    /// Envoy's buffer (`body_bytes` of it): its routing text, and the body
    /// and headers themselves when the control plane wants them.
    fn question(&self, with_body: bool) -> Result<RouteRequest, BodyError> {
        let mut question = RouteRequest {
            path: self.path.clone(),
            method: self.method.clone(),
            request_id: self
                .get_http_request_header("x-request-id")
                .unwrap_or_default(),
            routing_key: self
                .get_http_request_header(ROUTING_KEY_HEADER)
                .unwrap_or_default(),
            body_bytes: self.body_bytes as u64,
            ticket: self.ticket,
            ..Default::default()
        };
        let Some(route) = self.route else {
            return Ok(question); // info GETs have no body
        };
        let body = self
            .get_http_request_body(0, self.body_bytes)
            .unwrap_or_default();
        let parsed = RequestBody::parse(&body)?;
        question.routing_text = parsed.routing_text(route).into_bytes();
        question.stream = parsed.is_stream();
        if with_body {
            question.headers = self
                .get_http_request_headers()
                .into_iter()
                .filter(|(name, _)| !name.starts_with(':'))
                .map(|(name, value)| Header { name, value })
                .collect();
            drop(parsed);
            question.body = body;
        }
        Ok(question)
    }

    /// Sends the routing question (with the body once the control plane
    /// asked for bodies); the answer arrives in `on_grpc_call_response`.
    fn ask(&mut self) -> Action {
        let with_body = self.send_body.get() && self.body_bytes > 0;
        let question = match self.question(with_body) {
            Ok(q) => q,
            Err(e) => {
                send_error(self, 400, "invalid_request_error", &e.to_string());
                return Action::Pause;
            }
        };
        let encoded = question.encode_to_vec();
        // The question may be as large as the body: gone before we wait.
        drop(question);
        let sent = self.dispatch_grpc_call(
            &self.config.control_plane_cluster,
            SERVICE_NAME,
            "Route",
            vec![],
            Some(&encoded),
            self.route_timeout(),
        );
        drop(encoded);
        match sent {
            Ok(_) => {
                self.asked = true;
                self.sent_body = with_body;
                Action::Pause
            }
            Err(status) => {
                warn!("cannot reach the control plane: {status:?}");
                if self.route_locally() {
                    self.resumed = true;
                    return Action::Continue;
                }
                send_error(
                    self,
                    503,
                    "service_unavailable",
                    "the router's control plane cannot be reached",
                );
                Action::Pause
            }
        }
    }

    /// Applies a decision: injected body fields, then the worker endpoints.
    fn apply(&mut self, decision: Decision) {
        if decision.endpoints.is_empty() {
            send_error(self, 503, "service_unavailable", "no worker was chosen");
            return;
        }
        if !decision.inject.is_empty() {
            if let Err(message) = self.inject(&decision) {
                send_error(self, 500, "internal_error", &message);
                return;
            }
        }
        if decision.await_prefill && !self.await_prefill(decision.merge_input_logprobs) {
            return;
        }
        let endpoints = decision.endpoints.join(",");
        self.set_http_request_header(&self.config.endpoint_header, Some(&endpoints));
        // How many of them Envoy tries, and how long a stream may take to
        // start (Envoy drops clients' own x-envoy-* headers; ours count).
        for h in &decision.request_headers {
            self.set_http_request_header(&h.name, Some(&h.value));
        }
        debug!("{} -> {} ({endpoints})", self.path, decision.worker_url);
        self.resume();
    }

    /// Lets the paused request go on to the worker it names.
    fn resume(&mut self) {
        self.resumed = true;
        self.resume_http_request();
    }

    /// The control plane did not answer: route locally, or 503.
    fn unanswered(&mut self) {
        if self.route_locally() {
            self.resume();
        } else {
            send_error(
                self,
                503,
                "service_unavailable",
                "the router's control plane cannot be reached",
            );
        }
    }

    /// Splices the decision's fields into the buffered body.
    fn inject(&mut self, decision: &Decision) -> Result<(), String> {
        let body = self
            .get_http_request_body(0, self.body_bytes)
            .unwrap_or_default();
        let parsed = RequestBody::parse(&body).map_err(|e| e.to_string())?;
        let new_body = parsed
            .with_fields(&decision.inject_pairs())
            .map_err(|e| e.to_string())?;
        self.set_http_request_body(0, body.len(), &new_body);
        self.set_http_request_header("content-length", Some(&new_body.len().to_string()));
        Ok(())
    }

    fn elapsed_us(&self) -> u64 {
        let now = self.get_current_time();
        self.started
            .and_then(|s| now.duration_since(s).ok())
            .map_or(0, |d| d.as_micros() as u64)
    }
}

impl Context for Request {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if self.prefill_http == Some(token) {
            self.prefill_http = None;
            self.local_prefill_answered(body_size);
        }
    }

    fn on_grpc_call_response(&mut self, token: u32, status_code: u32, size: usize) {
        if self.admission_call == Some(token) {
            self.admission_call = None;
            self.admission_ended(status_code, size);
            return;
        }
        if self.outcome_call == Some(token) {
            self.outcome_call = None;
            // Counted (or not: the answer goes on either way).
            self.resume_http_response();
            return;
        }
        if self.prefill_call == Some(token) {
            self.prefill_call = None;
            self.prefill_answered(status_code, size);
            return;
        }
        if status_code != 0 {
            warn!(
                "control plane answered grpc status {status_code} for {}",
                self.path
            );
            return self.unanswered();
        }
        let bytes = self
            .get_grpc_call_response_body(0, size)
            .unwrap_or_default();
        match RouteResponse::decode(bytes.as_slice()).map(|r| r.outcome) {
            Ok(Some(route_response::Outcome::Decision(d))) => self.apply(d),
            Ok(Some(route_response::Outcome::Rejection(r))) => {
                let status = u16::try_from(r.http_status).unwrap_or(503);
                send_error(self, status, &r.error_type, &r.message);
            }
            Ok(Some(route_response::Outcome::Queued(q))) => self.await_admission(q.wait_ms),
            Ok(Some(route_response::Outcome::NeedBody(_))) => {
                self.send_body.set(true);
                if self.sent_body || self.body_bytes == 0 {
                    // Asked again although the body was sent (or there is none).
                    send_error(
                        self,
                        502,
                        "bad_gateway",
                        "the router's control plane keeps asking for the body",
                    );
                } else if self.ask() == Action::Continue {
                    // Routed locally: the control plane went away meanwhile.
                    self.resume();
                }
            }
            Ok(None) | Err(_) => send_error(
                self,
                502,
                "bad_gateway",
                "the router's control plane sent an unreadable answer",
            ),
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        self.started = Some(self.get_current_time());
        // Only the control plane chooses the worker: a client must not.
        self.set_http_request_header(&self.config.endpoint_header, None);
        if let Some(trap) = &self.config.test_trap_header {
            if self.get_http_request_header(trap).is_some() {
                // The one deliberate panic: tests configure it to prove that
                // a crashed VM does not outlive the request that crashed it.
                panic!("test_trap_header present: trapping the VM as configured");
            }
        }
        self.path = self.get_http_request_header(":path").unwrap_or_default();
        self.method = self.get_http_request_header(":method").unwrap_or_default();
        let head = Head {
            method: &self.method,
            path: &self.path,
            end_of_stream,
            content_length: self
                .get_http_request_header("content-length")
                .and_then(|v| v.parse::<usize>().ok()),
            max_body_bytes: self.config.max_body_bytes,
        };
        match head.check() {
            Err(refusal) => {
                send_refusal(self, &refusal);
                Action::Pause
            }
            Ok(Endpoint::Info) => self.ask(),
            Ok(Endpoint::Inference(route)) => {
                self.route = Some(route);
                self.wait_for_body();
                // Wait for the body (needs `allow_on_headers_stop_iteration`).
                Action::Pause
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.route.is_none() {
            // An info GET (the only other request that gets here) with a
            // body: held with its head until the decision lets both go.
            return if self.resumed {
                Action::Continue
            } else {
                Action::Pause
            };
        }
        if body_size > self.config.max_body_bytes {
            return self.refuse_body(&too_large(self.config.max_body_bytes));
        }
        if !self.reservation.grow_to(body_size) {
            return self.refuse_body(&over_budget());
        }
        if !end_of_stream {
            self.wait_for_body();
            return Action::Pause;
        }
        self.body_waits.done(self.context_id);
        self.body_bytes = body_size;
        self.ask()
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        if self.route.is_none() {
            return Action::Continue;
        }
        // The body's end would come with the trailers, unseen by the body
        // callback: refuse rather than let an unrouted request through.
        self.refuse_body(&Refusal {
            status: 400,
            kind: "invalid_request_error",
            message: "request trailers are not supported".into(),
        })
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        self.response_done |= end_of_stream;
        // The worker has read the body: it no longer counts against the VM.
        self.reservation.release();
        self.body_waits.done(self.context_id);
        if matches!(self.prefill, Prefill::None) {
            // A failed answer is held until the control plane has counted it.
            return if self.report_failure() {
                Action::Pause
            } else {
                Action::Continue
            };
        }
        let ok = self
            .get_http_response_header(":status")
            .and_then(|s| s.parse::<u16>().ok())
            .is_some_and(|s| (200..300).contains(&s));
        self.response_is_sse = self
            .get_http_response_header("content-type")
            .is_some_and(|t| t.starts_with("text/event-stream"));
        if !ok {
            // The decode worker's own error goes to the client as it is
            // (sglang-router does the same); the prefill no longer matters.
            self.prefill = Prefill::Over;
            return Action::Continue;
        }
        if matches!(self.prefill, Prefill::Pending) {
            // Held until the prefill has succeeded: if it fails, the client
            // gets its error instead of a decode stuck waiting for KV.
            self.response_paused = true;
            return Action::Pause;
        }
        self.prepare_response_for_merge();
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        self.response_done |= end_of_stream;
        match self.prefill {
            Prefill::Pending if self.response_paused => {
                // Continuing the body now would let the held headers go too.
                self.buffered = size;
                self.body_ended = end_of_stream;
                Action::Pause
            }
            Prefill::Done(Some(_)) => {
                if self.merge_buffered(size, end_of_stream) {
                    self.response_paused = false;
                    Action::Continue
                } else {
                    self.buffered = size;
                    self.body_ended = end_of_stream;
                    Action::Pause
                }
            }
            _ => Action::Continue,
        }
    }

    fn on_log(&mut self) {
        self.body_waits.done(self.context_id);
        self.reservation.release();
        if !self.asked {
            return;
        }
        let completion = self.completion(false);
        self.queue.push(completion);
    }
}

impl Request {
    /// How long the control plane may take to answer: `route_timeout_ms`,
    /// once more for every 4 MiB of body the question is about (a large
    /// question takes a while to cross and to read; a slow answer to it
    /// is not an outage).
    fn route_timeout(&self) -> Duration {
        let base = self.config.route_timeout_ms;
        let extra = base.saturating_mul(self.body_bytes as u64) / (4 << 20);
        Duration::from_millis(base.saturating_add(extra))
    }

    /// (Re)arms the deadline for the next piece of the body.
    fn wait_for_body(&self) {
        let deadline =
            self.get_current_time() + Duration::from_millis(self.config.body_idle_timeout_ms);
        self.body_waits.wait(self.context_id, deadline);
    }

    /// Ends the request over its body, giving its budget back at once.
    fn refuse_body(&mut self, refusal: &Refusal) -> Action {
        self.body_waits.done(self.context_id);
        self.reservation.release();
        send_refusal(self, refusal);
        Action::Pause
    }
}
