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
    is_info_path, merge_first_sse_event, merge_input_logprobs, prefill_input_logprobs, RequestBody,
    Route, SseMerge,
};
use sglang_envoy_proto::{
    route_response, Completion, Decision, Header, PrefillEndpoint, PrefillOutcome, PrefillWait,
    RouteRequest, RouteResponse, SERVICE_NAME,
};

use crate::completions::CompletionQueue;
use crate::config::FilterConfig;
use crate::fallback::Fallback;
use crate::reply::send_error;

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

/// One HTTP stream passing through the filter.
pub struct Request {
    config: Rc<FilterConfig>,
    queue: CompletionQueue,
    /// Set (for the whole VM) once the control plane asked for bodies.
    send_body: Rc<Cell<bool>>,
    /// Healthy workers to fall back on when the control plane is down.
    fallback: Fallback,
    ticket: u64,
    /// The inference route, for POSTs whose body we route on.
    route: Option<Route>,
    path: String,
    method: String,
    started: Option<SystemTime>,
    /// Set once a `Route` call was dispatched: from then on the control plane
    /// may have counted load under our ticket, so `on_log` must report it.
    asked: bool,
    /// The response reached its end (as opposed to a hang-up or reset).
    response_done: bool,
    /// The question sent, kept to ask again with the body (`NeedBody`).
    question: Option<RouteRequest>,
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
    /// A stream with its `ticket`, reporting its end into `queue`.
    pub fn new(
        config: Rc<FilterConfig>,
        queue: CompletionQueue,
        send_body: Rc<Cell<bool>>,
        fallback: Fallback,
        ticket: u64,
    ) -> Self {
        Request {
            config,
            queue,
            send_body,
            fallback,
            ticket,
            route: None,
            path: String::new(),
            method: String::new(),
            started: None,
            asked: false,
            response_done: false,
            question: None,
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

    /// Sends the routing question; the answer arrives in `on_grpc_call_response`.
    fn ask(&mut self, routing_text: Vec<u8>, stream: bool, body_bytes: usize) -> Action {
        let question = RouteRequest {
            path: self.path.clone(),
            method: self.method.clone(),
            routing_text,
            stream,
            request_id: self
                .get_http_request_header("x-request-id")
                .unwrap_or_default(),
            body_bytes: body_bytes as u64,
            ticket: self.ticket,
            body: Vec::new(),
            headers: Vec::new(),
        };
        self.question = Some(question);
        self.send_question()
    }

    /// Sends (or re-sends, with the body) the kept question.
    fn send_question(&mut self) -> Action {
        let Some(mut question) = self.question.take() else {
            return Action::Continue;
        };
        if self.send_body.get() && question.body.is_empty() && question.body_bytes > 0 {
            question.body = self
                .get_http_request_body(0, question.body_bytes as usize)
                .unwrap_or_default();
            question.headers = self
                .get_http_request_headers()
                .into_iter()
                .filter(|(name, _)| !name.starts_with(':'))
                .map(|(name, value)| Header { name, value })
                .collect();
        }
        let encoded = question.encode_to_vec();
        self.question = Some(question);
        match self.dispatch_grpc_call(
            &self.config.control_plane_cluster,
            SERVICE_NAME,
            "Route",
            vec![],
            Some(&encoded),
            Duration::from_millis(self.config.route_timeout_ms),
        ) {
            Ok(_) => {
                self.asked = true;
                Action::Pause
            }
            Err(status) => {
                warn!("cannot reach the control plane: {status:?}");
                if self.route_locally() {
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
        let len = self.question.as_ref().map_or(0, |q| q.body_bytes as usize);
        let body = self.get_http_request_body(0, len).unwrap_or_default();
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
            .get_http_request_body(0, self.config.max_body_bytes)
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
                self.resume_http_request();
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
                let already = self.send_body.replace(true);
                let has_body = self.question.as_ref().is_some_and(|q| q.body_bytes > 0);
                if already && self.question.as_ref().is_some_and(|q| !q.body.is_empty())
                    || !has_body
                {
                    // Asked again although the body was sent (or there is none).
                    send_error(
                        self,
                        502,
                        "bad_gateway",
                        "the router's control plane keeps asking for the body",
                    );
                    return;
                }
                if self.question.is_none() {
                    send_error(self, 500, "internal_error", "lost the routing question");
                } else if self.send_question() == Action::Continue {
                    // Routed locally: the control plane went away meanwhile.
                    self.resume_http_request();
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
        self.path = self.get_http_request_header(":path").unwrap_or_default();
        self.method = self.get_http_request_header(":method").unwrap_or_default();

        if let Some(route) = Route::from_path(&self.path) {
            if self.method != "POST" {
                send_error(
                    self,
                    405,
                    "invalid_request_error",
                    "use POST for this route",
                );
                return Action::Pause;
            }
            if end_of_stream {
                send_error(
                    self,
                    400,
                    "invalid_request_error",
                    "request body is required",
                );
                return Action::Pause;
            }
            if let Some(len) = self
                .get_http_request_header("content-length")
                .and_then(|v| v.parse::<usize>().ok())
            {
                if len > self.config.max_body_bytes {
                    return self.too_large();
                }
            }
            self.route = Some(route);
            // Wait for the body (needs `allow_on_headers_stop_iteration`).
            return Action::Pause;
        }
        if self.method == "GET" && is_info_path(&self.path) {
            return self.ask(Vec::new(), false, 0);
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(route) = self.route else {
            return Action::Continue;
        };
        if body_size > self.config.max_body_bytes {
            return self.too_large();
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let body = self.get_http_request_body(0, body_size).unwrap_or_default();
        let parsed = match RequestBody::parse(&body) {
            Ok(p) => p,
            Err(e) => {
                send_error(self, 400, "invalid_request_error", &e.to_string());
                return Action::Pause;
            }
        };
        let text = parsed.routing_text(route).into_bytes();
        let stream = parsed.is_stream();
        self.ask(text, stream, body.len())
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        self.response_done |= end_of_stream;
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
    fn too_large(&mut self) -> Action {
        let max = self.config.max_body_bytes;
        send_error(
            self,
            413,
            "invalid_request_error",
            &format!("request body is larger than the router's limit of {max} bytes"),
        );
        Action::Pause
    }
}
