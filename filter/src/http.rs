use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use log::{debug, warn};
use prost::Message;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use sglang_envoy_body::pd::{
    as_pairs, pd_fields, prefill_error_status, wants_input_logprobs, Bootstrap,
};
use sglang_envoy_body::{
    merge_first_sse_event, merge_input_logprobs, over_budget, prefill_input_logprobs, too_large,
    BodyError, Endpoint, Head, Refusal, RequestBody, Route, SseMerge,
};
use sglang_envoy_proto::{
    route_response, Completion, Decision, Header, PrefillEndpoint, PrefillOutcome, PrefillWait,
    RouteRequest, RouteResponse, ROUTING_KEY_HEADER, SERVICE_NAME,
};

use crate::body_wait::BodyWaits;
use crate::budget::{Budget, Reservation};
use crate::completions::CompletionQueue;
use crate::config::FilterConfig;
use crate::fallback::Fallback;
use crate::reply::{send_error, send_refusal};

/// Where the prefill half of a PD request stands, as far as this stream knows.
#[derive(Debug)]
enum Prefill {
    /// Not a PD request.
    None,
    /// Sent by the control plane; `AwaitPrefill` has not answered.
    Pending,
    /// Succeeded; the prefill's input logprobs to merge, if asked for.
    Done(Option<String>),
    /// Failed, or no longer matters (the decode answer was an error).
    Over,
}

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

    /// The control plane did not answer: sends the request to a recently
    /// healthy worker in turn. The completion is still reported (the
    /// control plane may have counted the request before it went silent).
    /// Returns false when there is nothing to fall back on.
    fn route_locally(&mut self) -> bool {
        let now = self.get_current_time();
        let max_age = Duration::from_millis(self.config.fallback_max_age_ms);
        let Some(choice) = self
            .fallback
            .choose(now, max_age, self.config.fallback_retries)
        else {
            return false;
        };
        if let Some(prefill) = &choice.prefill {
            if let Err(e) = self.send_prefill_locally(prefill) {
                warn!("local PD fallback impossible: {e}");
                return false;
            }
        }
        let endpoints = choice.endpoints.join(",");
        warn!(
            "control plane unavailable; {} -> {endpoints} (local fallback)",
            self.path
        );
        self.set_http_request_header(&self.config.endpoint_header, Some(&endpoints));
        true
    }

    /// PD mode without the control plane: writes the bootstrap fields into
    /// both halves itself, sends the prefill half to `prefill` through
    /// Envoy's prefill cluster, and leaves the decode half in the request.
    fn send_prefill_locally(&mut self, prefill: &PrefillEndpoint) -> Result<(), String> {
        let Some(route) = self.route else {
            return Ok(()); // info GETs need no prefill
        };
        let body = self
            .get_http_request_body(0, self.body_bytes)
            .unwrap_or_default();
        let parsed = RequestBody::parse(&body).map_err(|e| e.to_string())?;
        let bootstrap = Bootstrap {
            host: &prefill.host,
            port: u16::try_from(prefill.bootstrap_port)
                .ok()
                .filter(|p| *p > 0),
            prefill_rank: None,
            decode_rank: None,
        };
        let fields = pd_fields(route, &parsed, &bootstrap, || local_rid(route), random_u64);
        let prefill_body = parsed
            .with_fields(&as_pairs(&fields.prefill))
            .map_err(|e| e.to_string())?;
        let decode_body = parsed
            .with_fields(&as_pairs(&fields.decode))
            .map_err(|e| e.to_string())?;
        let client_headers = self.get_http_request_headers();
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", &self.path),
            (":authority", &prefill.endpoint),
            ("content-type", "application/json"),
            (&self.config.endpoint_header, &prefill.endpoint),
        ];
        headers.extend(
            client_headers
                .iter()
                .filter(|(name, _)| forwardable(name, &self.config.endpoint_header))
                .map(|(n, v)| (n.as_str(), v.as_str())),
        );
        let token = self
            .dispatch_http_call(
                &self.config.prefill_cluster,
                headers,
                Some(&prefill_body),
                vec![],
                Duration::from_millis(self.config.prefill_timeout_ms),
            )
            .map_err(|s| format!("cannot send the prefill: {s:?}"))?;
        self.prefill_http = Some(token);
        self.prefill = Prefill::Pending;
        self.merge_logprobs = wants_input_logprobs(route, &parsed);
        self.set_http_request_body(0, body.len(), &decode_body);
        self.set_http_request_header("content-length", Some(&decode_body.len().to_string()));
        Ok(())
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
        if decision.await_prefill {
            let wait = PrefillWait {
                ticket: self.ticket,
            }
            .encode_to_vec();
            match self.dispatch_grpc_call(
                &self.config.control_plane_cluster,
                SERVICE_NAME,
                "AwaitPrefill",
                vec![],
                Some(&wait),
                Duration::from_millis(self.config.prefill_timeout_ms),
            ) {
                Ok(token) => {
                    self.prefill_call = Some(token);
                    self.prefill = Prefill::Pending;
                    self.merge_logprobs = decision.merge_input_logprobs;
                }
                Err(status) => {
                    warn!("cannot wait for the prefill: {status:?}");
                    send_error(
                        self,
                        503,
                        "service_unavailable",
                        "the router's control plane cannot be reached",
                    );
                    return;
                }
            }
        }
        let endpoints = decision.endpoints.join(",");
        self.set_http_request_header(&self.config.endpoint_header, Some(&endpoints));
        debug!("{} -> {} ({endpoints})", self.path, decision.worker_url);
        self.resume();
    }

    /// Lets the paused request go on to the worker it names.
    fn resume(&mut self) {
        self.resumed = true;
        self.resume_http_request();
    }

    /// The prefill's outcome arrived.
    fn prefill_ended(&mut self, outcome: PrefillOutcome) {
        if !matches!(self.prefill, Prefill::Pending) {
            return;
        }
        if !outcome.ok {
            self.prefill = Prefill::Over;
            let status = prefill_error_status(outcome.http_status);
            // The decode answer has not gone out (its headers wait for this),
            // so the client gets the prefill's error; Envoy resets the decode.
            send_error(self, status, &outcome.error_type, &outcome.message);
            return;
        }
        let logprobs = (self.merge_logprobs && !outcome.input_token_logprobs.is_empty())
            .then_some(outcome.input_token_logprobs);
        let merging = logprobs.is_some();
        self.prefill = Prefill::Done(logprobs);
        if !self.response_paused {
            return;
        }
        self.prepare_response_for_merge();
        // Without a merge, or once what arrived so far could be merged, the
        // answer goes on; else it stays held until the body callbacks can.
        if !merging || (self.buffered > 0 && self.merge_buffered(self.buffered, self.body_ended)) {
            self.response_paused = false;
            self.resume_http_response();
        }
    }

    /// Tries to merge the prefill's logprobs into the `size` bytes of answer
    /// held so far. True when done (merged, or nothing to merge into): the
    /// answer may go on.
    fn merge_buffered(&mut self, size: usize, end_of_stream: bool) -> bool {
        let Prefill::Done(Some(logprobs)) = &self.prefill else {
            return true;
        };
        let logprobs = logprobs.clone();
        let Some(held) = self.get_http_response_body(0, size) else {
            warn!("cannot read the held answer to merge prefill logprobs");
            self.prefill = Prefill::Over;
            return true;
        };
        let merged = if self.response_is_sse {
            match merge_first_sse_event(&held, &logprobs, end_of_stream) {
                SseMerge::NeedMore => return false,
                SseMerge::Done(out) => Some(out),
            }
        } else if end_of_stream {
            merge_input_logprobs(&held, &logprobs)
        } else {
            return false;
        };
        if let Some(out) = merged {
            self.set_http_response_body(0, size, &out);
        }
        self.prefill = Prefill::Over;
        true
    }

    /// A merged body has another length.
    fn prepare_response_for_merge(&mut self) {
        if matches!(self.prefill, Prefill::Done(Some(_))) {
            self.set_http_response_header("content-length", None);
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
        if self.prefill_http != Some(token) {
            return;
        }
        self.prefill_http = None;
        let status = self
            .get_http_call_response_header(":status")
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(0);
        let outcome = if (200..300).contains(&status) {
            let logprobs = if self.merge_logprobs {
                self.get_http_call_response_body(0, body_size)
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|v| prefill_input_logprobs(&v))
                    .unwrap_or_default()
            } else {
                String::new()
            };
            PrefillOutcome {
                ok: true,
                http_status: status,
                input_token_logprobs: logprobs,
                ..Default::default()
            }
        } else {
            PrefillOutcome {
                http_status: if status == 0 { 502 } else { status },
                message: format!("prefill worker failed (status {status}) while the control plane was unavailable"),
                error_type: "prefill_failed".into(),
                ..Default::default()
            }
        };
        self.prefill_ended(outcome);
    }

    fn on_grpc_call_response(&mut self, token: u32, status_code: u32, size: usize) {
        if self.prefill_call == Some(token) {
            self.prefill_call = None;
            let outcome = if status_code == 0 {
                let bytes = self
                    .get_grpc_call_response_body(0, size)
                    .unwrap_or_default();
                PrefillOutcome::decode(bytes.as_slice()).unwrap_or_else(|_| PrefillOutcome {
                    http_status: 502,
                    message: "the router's control plane sent an unreadable answer".into(),
                    error_type: "bad_gateway".into(),
                    ..Default::default()
                })
            } else {
                // The control plane went away mid-request: whether its
                // prefill finished is unknown. Let the decode answer through;
                // if the KV never came, the decode worker's own wait times
                // out and the client gets that error instead of a hang.
                warn!("prefill outcome lost (grpc status {status_code}); passing the decode answer on");
                PrefillOutcome {
                    ok: true,
                    ..Default::default()
                }
            };
            self.prefill_ended(outcome);
            return;
        }
        if status_code != 0 {
            warn!(
                "control plane answered grpc status {status_code} for {}",
                self.path
            );
            if self.route_locally() {
                self.resume();
                return;
            }
            send_error(
                self,
                503,
                "service_unavailable",
                &format!("the router's control plane did not answer (grpc status {status_code})"),
            );
            return;
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
            return Action::Continue;
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
        let http_status = self
            .get_property(vec!["response", "code"])
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map_or(0, |b| u64::from_le_bytes(b) as u32);
        let details = self
            .get_property(vec!["response", "code_details"])
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        let upstream_host = self
            .get_property(vec!["upstream", "address"])
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        self.queue.push(Completion {
            ticket: self.ticket,
            http_status,
            // Unfinished and not reset by the worker: the client hung up.
            client_cancelled: !self.response_done && !details.starts_with("upstream"),
            upstream_host,
            duration_us: self.elapsed_us(),
        });
    }
}

/// Client headers worth passing to the prefill worker (not hop-by-hop,
/// pseudo, length or routing headers).
fn forwardable(name: &str, endpoint_header: &str) -> bool {
    !(name.starts_with(':')
        || name.starts_with("x-envoy-")
        || name == endpoint_header
        || matches!(
            name,
            "host"
                | "content-length"
                | "content-type"
                | "transfer-encoding"
                | "connection"
                | "keep-alive"
                | "te"
                | "upgrade"
                | "expect"
        ))
}

/// A request id in sglang-router's format, with `envoy` where the router's
/// address would be (the filter does not know it).
fn local_rid(route: Route) -> String {
    const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 24];
    fill_random(&mut bytes);
    let random: String = bytes
        .iter()
        .map(|b| ALPHANUMERIC[usize::from(*b) % ALPHANUMERIC.len()] as char)
        .collect();
    format!("{}{random}-envoy", route.rid_prefix())
}

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    fill_random(&mut bytes);
    u64::from_le_bytes(bytes)
}

fn fill_random(bytes: &mut [u8]) {
    if getrandom::fill(bytes).is_err() {
        // No entropy source: the clock still makes collisions unlikely.
        let nanos = proxy_wasm::hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (nanos.rotate_left(i as u32 * 7) >> (i % 8)) as u8;
        }
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
