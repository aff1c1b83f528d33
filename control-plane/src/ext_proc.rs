//! The `ext_proc` front door: Envoy's built-in `envoy.filters.http.ext_proc`
//! filter streams each HTTP request to this gRPC service
//! (`envoy.service.ext_proc.v3.ExternalProcessor`), which answers from the
//! same [`Engine`] as the wasm filter's `Route`/`Complete`/`AwaitPrefill`
//! calls. Operators who cannot load wasm get the same routing.
//!
//! One gRPC stream is one HTTP request. With the processing modes of
//! `envoy/envoy-ext-proc.yaml` (request headers SEND, request body BUFFERED,
//! response headers SKIP unless an inference request asks for them, response
//! body NONE, no trailers) it goes:
//!
//! 1. request headers: remember path, method and headers; drop a client's
//!    endpoint header; 405/400/413 for unusable inference requests; route
//!    `GET` info requests at once; requests we do not route skip the rest
//!    (`mode_override`);
//! 2. request body (whole): validate it, ask the engine with the body and
//!    headers filled in, set `x-gateway-destination-endpoint`, splice in the
//!    decision's fields and fix `content-length`; rejections become
//!    OpenAI-shaped local replies;
//! 3. response headers: in PD mode, held until the prefill half has
//!    answered (a failed prefill replaces the answer with its error; a
//!    decode error waits [`DECODE_ERROR_GRACE`] for it at most). A prefill
//!    that fails before the decode answers ends the request at once: an
//!    `ImmediateResponse` sent unprompted, which Envoy honours while the
//!    request is upstream (it resets the decode request). An SSE answer
//!    switches to STREAMED response body mode, a JSON answer that needs the
//!    prefill's input logprobs to BUFFERED (`mode_override`); other answers
//!    are not seen further;
//! 4. response body: SSE chunks pass unchanged (the first event gets the
//!    logprobs merged in when asked for), and the one with `end_of_stream`
//!    says the stream finished; a buffered JSON body gets its merge.
//!
//! Envoy ends the gRPC stream after the last message it expects, or when the
//! HTTP request is destroyed (client gone, reset). Whenever it ends, the
//! request's load is released (`Engine::complete`, from `Drop`), so loads
//! return to zero on every path. `client_cancelled` is reported when the
//! response was not seen to finish: no response headers, or an SSE stream
//! without its last chunk. A JSON answer counts as finished once its headers
//! arrive: SGLang writes it in one go and Envoy holds it by then.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderMap, HeaderValue, HeaderValueOption,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::{
    processing_mode::{BodySendMode, HeaderSendMode},
    ProcessingMode,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, external_processor_server::ExternalProcessor, processing_request,
    processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation,
    HeadersResponse, HttpBody, HttpHeaders, ImmediateResponse, ProcessingRequest,
    ProcessingResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value, Duration as ProtoDuration, Struct};
use futures::{Stream, StreamExt};
use sglang_envoy_body::{
    is_worker_failure, merge_first_sse_event, merge_input_logprobs, openai_error_json, over_budget,
    pd::prefill_error_status, too_large, Endpoint, Head, RequestBody, Route, SseMerge,
};
use sglang_envoy_proto::{
    route_response, AdmissionOutcome, Completion, Decision, Header, PrefillOutcome, RouteRequest,
    ROUTING_KEY_HEADER,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, warn};

use crate::body_budget::{BodyBudget, BodyHold};
use crate::engine::Engine;
use crate::workers::HealthChecker;

/// Header read by the worker cluster's `override_host` policy.
pub const ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";

/// gRPC metadata (set with `initial_metadata` in the Envoy config) carrying
/// the largest request body accepted; larger bodies get 413.
pub const MAX_BODY_METADATA: &str = "x-sglang-max-body-bytes";

/// Longest wait for a PD prefill that Envoy is asked to allow
/// (`override_message_timeout`). Must not exceed `max_message_timeout` in
/// `envoy/envoy-ext-proc.yaml`.
pub const MAX_PREFILL_WAIT: Duration = Duration::from_secs(1800);

/// PD: how long a decode worker's error waits for a prefill still running:
/// when the prefill fails too (a dead prefill makes its decode fail at
/// once), the client gets the prefill's error, the cause, rather than the
/// decode's. Past this the decode's error goes out as it is.
pub const DECODE_ERROR_GRACE: Duration = Duration::from_millis(250);

/// How long the whole body of an inference request may take to arrive
/// once its head has: this, plus a second per MiB it declares (a minimum
/// upload rate). Envoy buffers the body before sending it here, so progress
/// is invisible; a client that announces a body and stalls gets 408 when
/// this runs out, not when Envoy's request timeout does.
pub const BODY_WAIT_BASE: Duration = Duration::from_secs(4);

/// The slowest upload accepted, in bytes per second (see [`BODY_WAIT_BASE`]).
pub const BODY_MIN_RATE: u64 = 1 << 20;

/// The attribute map key Envoy files `response_attributes` under.
const ATTRIBUTES_KEY: &str = "envoy.filters.http.ext_proc";

/// The attribute holding the worker Envoy finally used.
const UPSTREAM_ADDRESS: &str = "upstream.address";

/// The attribute holding how many attempts Envoy made.
const ATTEMPT_COUNT: &str = "upstream.request_attempt_count";

/// The attribute saying where the response came from (`via_upstream`, or
/// why Envoy made it).
const CODE_DETAILS: &str = "response.code_details";

/// Request tickets: a random 64-bit base plus a counter, so tickets of this
/// front door and of wasm filters sharing the control plane do not collide.
struct TicketSource {
    base: u64,
    next: AtomicU64,
}

impl TicketSource {
    fn new() -> Self {
        TicketSource {
            base: rand::random(),
            next: AtomicU64::new(1),
        }
    }

    /// A fresh non-zero ticket.
    fn next(&self) -> u64 {
        loop {
            let ticket = self
                .base
                .wrapping_add(self.next.fetch_add(1, Ordering::Relaxed));
            if ticket != 0 {
                return ticket;
            }
        }
    }
}

/// Adapts the [`Engine`] to Envoy's `ext_proc` protocol.
pub struct ExtProcService {
    engine: Arc<Engine>,
    health: Arc<HealthChecker>,
    tickets: Arc<TicketSource>,
    max_body_bytes: usize,
    budget: Arc<BodyBudget>,
}

impl ExtProcService {
    /// A front door over `engine` (`health` checks workers Envoy failed
    /// over from), holding at most `budget` of request bodies at once;
    /// bodies over `max_body_bytes`
    /// (`--max-payload-size`) get 413 unless Envoy sends its own limit in
    /// [`MAX_BODY_METADATA`].
    pub fn new(
        engine: Arc<Engine>,
        health: Arc<HealthChecker>,
        max_body_bytes: usize,
        budget: Arc<BodyBudget>,
    ) -> Self {
        ExtProcService {
            engine,
            health,
            tickets: Arc::new(TicketSource::new()),
            max_body_bytes,
            budget,
        }
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for ExtProcService {
    type ProcessStream = ReplyStream;

    async fn process(
        &self,
        request: Request<tonic::Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let max_body_bytes = request
            .metadata()
            .get(MAX_BODY_METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(self.max_body_bytes);
        let exchange = Exchange::new(
            self.engine.clone(),
            Some(self.health.clone()),
            self.tickets.clone(),
            max_body_bytes,
            self.budget.clone(),
        );
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(exchange.run(request.into_inner(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Where the prefill half of a PD request stands.
#[derive(Debug)]
enum Prefill {
    /// Not a PD request, or it no longer matters.
    None,
    /// Sent by the engine; its outcome is not known yet.
    Pending,
    /// Succeeded; the input logprobs to merge into the answer, if any.
    Done(Option<String>),
}

/// What to do after a message from Envoy.
enum Next {
    /// Send this answer.
    Reply(Box<ProcessingResponse>),
    /// PD response headers: held until the prefill has answered (a decode
    /// error: at most [`DECODE_ERROR_GRACE`]).
    HoldForPrefill,
    /// Admission control queued the request: wait for a slot (keeping
    /// Envoy waiting too), then route it.
    AwaitAdmission,
    /// Nothing to answer.
    Nothing,
}

type PrefillWait = Pin<Box<dyn Future<Output = PrefillOutcome> + Send>>;

type AdmissionWaitFuture = Pin<Box<dyn Future<Output = AdmissionOutcome> + Send>>;

/// One HTTP request passing through Envoy: the state of one ext_proc stream.
/// Dropping it reports the request's end to the engine.
struct Exchange {
    engine: Arc<Engine>,
    health: Option<Arc<HealthChecker>>,
    tickets: Arc<TicketSource>,
    max_body_bytes: usize,
    /// Bodies Envoy holds for requests through this front door.
    budget: Arc<BodyBudget>,
    /// This request's body in the budget, until its worker answers.
    body_hold: Option<BodyHold>,
    /// The question of a request admission control queued, to ask again.
    queued: Option<RouteRequest>,
    started: Instant,
    path: String,
    method: String,
    request_id: String,
    /// The client's `X-SMG-Routing-Key`, empty when absent.
    routing_key: String,
    /// The client's headers (no pseudo-headers), forwarded with a PD prefill.
    headers: Vec<Header>,
    /// The inference route, for POSTs whose body we route on.
    route: Option<Route>,
    /// An inference request's body is awaited, of this declared length
    /// (`content-length`) if any.
    awaiting_body: Option<Option<usize>>,
    /// Set once the engine counted load under this ticket.
    ticket: Option<u64>,
    prefill: Prefill,
    /// Merge the prefill's input logprobs into the answer.
    merge_wanted: bool,
    /// The response headers wait for the prefill's outcome.
    holding_headers: bool,
    /// The decode worker answered an error status.
    decode_failed: bool,
    /// We ended the request with a local reply.
    replied_locally: bool,
    /// The answer is an SSE stream.
    sse: bool,
    /// SSE bytes held until the first event is complete (logprob merge).
    held: Vec<u8>,
    /// Status sent to the client, 0 until known.
    status: u32,
    /// The response reached its end (as opposed to a hang-up or reset).
    response_done: bool,
    /// `ip:port` Envoy finally sent the request to, when Envoy says.
    upstream_host: String,
    /// Attempts Envoy made, when Envoy says (0: unknown).
    attempts: u32,
    /// Why the response is what it is, when Envoy says.
    code_details: Option<String>,
}

impl Exchange {
    fn new(
        engine: Arc<Engine>,
        health: Option<Arc<HealthChecker>>,
        tickets: Arc<TicketSource>,
        max_body_bytes: usize,
        budget: Arc<BodyBudget>,
    ) -> Self {
        Exchange {
            engine,
            health,
            tickets,
            max_body_bytes,
            budget,
            body_hold: None,
            queued: None,
            started: Instant::now(),
            path: String::new(),
            method: String::new(),
            request_id: String::new(),
            routing_key: String::new(),
            headers: Vec::new(),
            route: None,
            awaiting_body: None,
            ticket: None,
            prefill: Prefill::None,
            merge_wanted: false,
            holding_headers: false,
            decode_failed: false,
            replied_locally: false,
            sse: false,
            held: Vec::new(),
            status: 0,
            response_done: false,
            upstream_host: String::new(),
            attempts: 0,
            code_details: None,
        }
    }

    /// Answers Envoy's messages until the stream ends; then `self` is
    /// dropped, which releases the request's load.
    async fn run<S>(mut self, mut inbound: S, tx: mpsc::Sender<Result<ProcessingResponse, Status>>)
    where
        S: Stream<Item = Result<ProcessingRequest, Status>> + Unpin,
    {
        let mut waiting: Option<PrefillWait> = None;
        let mut grace: Option<Pin<Box<tokio::time::Sleep>>> = None;
        let mut body_due: Option<Pin<Box<tokio::time::Sleep>>> = None;
        let mut admission: Option<AdmissionWaitFuture> = None;
        loop {
            let reply = tokio::select! {
                message = inbound.next() => match message {
                    Some(Ok(message)) => {
                        let next = self.on_message(message);
                        body_due = self
                            .body_wait()
                            .map(|wait| Box::pin(tokio::time::sleep(wait)));
                        if let (Prefill::Pending, Some(ticket), None) =
                            (&self.prefill, self.ticket, &waiting)
                        {
                            // PD: follow the prefill from the decision on.
                            let engine = self.engine.clone();
                            waiting = Some(Box::pin(async move { engine.await_prefill(ticket).await }));
                        }
                        match next {
                            Next::Reply(reply) => *reply,
                            Next::AwaitAdmission => {
                                let (engine, ticket) = (self.engine.clone(), self.ticket.unwrap_or(0));
                                admission = Some(Box::pin(async move { engine.await_admission(ticket).await }));
                                // The wait may outlast Envoy's per-message timeout.
                                extend_timeout(self.engine.options().admission.map_or(
                                    Duration::from_secs(1),
                                    |a| a.queue_timeout + Duration::from_secs(1),
                                ))
                            }
                            Next::Nothing => continue,
                            Next::HoldForPrefill if self.decode_failed => {
                                grace = Some(Box::pin(tokio::time::sleep(DECODE_ERROR_GRACE)));
                                continue;
                            }
                            // The wait may outlast Envoy's per-message timeout.
                            Next::HoldForPrefill => extend_timeout(self.engine.options().request_timeout),
                        }
                    }
                    // Envoy resets the stream when it is done with it.
                    Some(Err(status)) => {
                        debug!(path = %self.path, code = ?status.code(), "ext_proc stream reset");
                        break;
                    }
                    None => break,
                },
                outcome = wait_for(&mut waiting) => {
                    waiting = None;
                    grace = None;
                    match self.prefill_ended(outcome) {
                        Some(reply) => reply,
                        None => continue,
                    }
                }
                outcome = wait_for(&mut admission) => {
                    admission = None;
                    self.admitted(outcome)
                }
                () = sleep_for(&mut body_due) => {
                    body_due = None;
                    let wait = self.body_wait().unwrap_or_default();
                    warn!(path = %self.path, "request body did not arrive in {wait:?}");
                    match self.local_reply(
                        408,
                        "timeout",
                        &format!("the request body did not arrive within {} s", wait.as_secs()),
                    ) {
                        Next::Reply(reply) => *reply,
                        _ => continue,
                    }
                }
                () = sleep_for(&mut grace) => {
                    grace = None;
                    // The prefill is still running: the decode's error goes out.
                    self.holding_headers = false;
                    self.prefill = Prefill::None;
                    self.release_response_headers()
                }
            };
            if tx.send(Ok(reply)).await.is_err() {
                break;
            }
        }
    }

    /// While an inference request's body is awaited: how long it may take.
    fn body_wait(&self) -> Option<Duration> {
        let declared = self.awaiting_body.filter(|_| !self.replied_locally)?;
        let declared = declared.unwrap_or(self.max_body_bytes) as u64;
        Some(BODY_WAIT_BASE + Duration::from_secs(declared / BODY_MIN_RATE))
    }

    fn on_message(&mut self, message: ProcessingRequest) -> Next {
        if self.replied_locally {
            // Envoy ignores anything after a local reply; so do we (a
            // message may cross an unsolicited prefill error).
            return Next::Nothing;
        }
        if let Some(host) = upstream_address(&message.attributes) {
            self.upstream_host = host;
        }
        if let Some(n) = attempt_count(&message.attributes) {
            self.attempts = n;
        }
        if let Some(d) = string_attribute(&message.attributes, CODE_DETAILS) {
            self.code_details = Some(d);
        }
        use processing_request::Request as In;
        match message.request {
            Some(In::RequestHeaders(h)) => self.on_request_headers(h),
            Some(In::RequestBody(b)) => self.on_request_body(b),
            Some(In::RequestTrailers(_)) => reply(processing_response::Response::RequestTrailers(
                TrailersResponse::default(),
            )),
            Some(In::ResponseHeaders(h)) => self.on_response_headers(h),
            Some(In::ResponseBody(b)) => self.on_response_body(b),
            Some(In::ResponseTrailers(_)) => {
                self.response_done = true;
                reply(processing_response::Response::ResponseTrailers(
                    TrailersResponse::default(),
                ))
            }
            None => Next::Nothing,
        }
    }

    fn on_request_headers(&mut self, h: HttpHeaders) -> Next {
        let all = header_list(h.headers.as_ref());
        for (name, value) in all {
            match name.as_str() {
                ":path" => self.path = value,
                ":method" => self.method = value,
                n if n.starts_with(':') => {}
                // Only the control plane chooses the worker: a client must not.
                ENDPOINT_HEADER => {}
                n => {
                    if n == "x-request-id" {
                        self.request_id = value.clone();
                    } else if n == ROUTING_KEY_HEADER {
                        self.routing_key = value.clone();
                    }
                    self.headers.push(Header { name, value });
                }
            }
        }
        let strip = HeaderMutation {
            remove_headers: vec![ENDPOINT_HEADER.to_string()],
            ..Default::default()
        };

        let head = Head {
            method: &self.method,
            path: &self.path,
            end_of_stream: h.end_of_stream,
            content_length: self
                .header("content-length")
                .and_then(|v| v.parse::<usize>().ok()),
            max_body_bytes: self.max_body_bytes,
        };
        let endpoint = match head.check() {
            Ok(endpoint) => endpoint,
            Err(r) => return self.local_reply(r.status, r.kind, &r.message),
        };
        if let Endpoint::Inference(route) = endpoint {
            self.awaiting_body = Some(head.content_length);
            self.route = Some(route);
            // The whole body comes next (request body mode BUFFERED), and
            // the response headers are ours to see.
            return send(ProcessingResponse {
                response: Some(processing_response::Response::RequestHeaders(
                    headers_response(strip),
                )),
                mode_override: Some(routed()),
                ..Default::default()
            });
        }

        // An info GET: any healthy worker.
        let question = RouteRequest {
            path: self.path.clone(),
            method: self.method.clone(),
            request_id: self.request_id.clone(),
            ..Default::default()
        };
        match self.engine.route(&question).outcome {
            Some(route_response::Outcome::Decision(d)) if !d.endpoints.is_empty() => {
                // No load is counted for info requests (ticket 0).
                let mut mutation = strip;
                mutation.remove_headers.clear();
                mutation
                    .set_headers
                    .push(set_header(ENDPOINT_HEADER, &d.endpoints.join(",")));
                mutation.set_headers.extend(
                    d.request_headers
                        .iter()
                        .map(|h| set_header(&h.name, &h.value)),
                );
                debug!(path = %self.path, worker = %d.worker_url, "info request routed");
                send(ProcessingResponse {
                    response: Some(processing_response::Response::RequestHeaders(
                        headers_response(mutation),
                    )),
                    mode_override: Some(nothing_more()),
                    ..Default::default()
                })
            }
            other => self.refuse(other),
        }
    }

    fn on_request_body(&mut self, b: HttpBody) -> Next {
        self.awaiting_body = None;
        let Some(route) = self.route else {
            return reply(processing_response::Response::RequestBody(
                BodyResponse::default(),
            ));
        };
        if b.body.len() > self.max_body_bytes {
            return self.too_large();
        }
        self.body_hold = self.budget.hold(b.body.len());
        if self.body_hold.is_none() {
            let r = over_budget();
            return self.local_reply(r.status, r.kind, &r.message);
        }
        let (routing_text, stream) = match RequestBody::parse(&b.body) {
            Ok(parsed) => (parsed.routing_text(route).into_bytes(), parsed.is_stream()),
            Err(e) => return self.local_reply(400, "invalid_request_error", &e.to_string()),
        };
        let question = RouteRequest {
            path: self.path.clone(),
            method: self.method.clone(),
            routing_text,
            stream,
            request_id: self.request_id.clone(),
            routing_key: self.routing_key.clone(),
            body_bytes: b.body.len() as u64,
            ticket: self.tickets.next(),
            // The control plane has the body already: it never needs to ask.
            body: b.body,
            headers: self.headers.clone(),
        };
        self.ask(question)
    }

    /// Asks the engine about the request and applies its answer.
    fn ask(&mut self, question: RouteRequest) -> Next {
        match self.engine.route(&question).outcome {
            Some(route_response::Outcome::Decision(d)) => self.apply(d, &question.body),
            Some(route_response::Outcome::Queued(_)) => {
                // Ended while queued, the request's ticket must still be
                // released: count it from now on.
                self.ticket = Some(question.ticket);
                self.queued = Some(question);
                Next::AwaitAdmission
            }
            other => self.refuse(other),
        }
    }

    /// Admission control answered a queued request.
    fn admitted(&mut self, outcome: AdmissionOutcome) -> ProcessingResponse {
        let Some(question) = self.queued.take() else {
            return self.immediate(500, "internal_error", "lost the queued request");
        };
        if !outcome.admitted {
            let r = outcome.rejection.unwrap_or_default();
            let status = u16::try_from(r.http_status).unwrap_or(503);
            return self.immediate(status, &r.error_type, &r.message);
        }
        match self.ask(question) {
            Next::Reply(reply) => *reply,
            // Admitted tickets are never queued again; anything else is a bug.
            _ => self.immediate(
                500,
                "internal_error",
                "the admitted request was queued again",
            ),
        }
    }

    /// Applies a decision: the worker endpoints, then injected body fields.
    fn apply(&mut self, decision: Decision, body: &[u8]) -> Next {
        if decision.ticket != 0 {
            // From here on the engine counts load that the end must release.
            self.ticket = Some(decision.ticket);
        }
        if decision.endpoints.is_empty() {
            return self.local_reply(503, "service_unavailable", "no worker was chosen");
        }
        let endpoints = decision.endpoints.join(",");
        let mut set_headers = vec![set_header(ENDPOINT_HEADER, &endpoints)];
        set_headers.extend(
            decision
                .request_headers
                .iter()
                .map(|h| set_header(&h.name, &h.value)),
        );
        let mut mutation = HeaderMutation {
            set_headers,
            ..Default::default()
        };
        let mut body_mutation = None;
        if !decision.inject.is_empty() {
            let fields = decision.inject_pairs();
            let new_body = match RequestBody::parse(body).and_then(|p| p.with_fields(&fields)) {
                Ok(b) => b,
                Err(e) => return self.local_reply(500, "internal_error", &e.to_string()),
            };
            mutation
                .set_headers
                .push(set_header("content-length", &new_body.len().to_string()));
            body_mutation = Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::Body(new_body)),
            });
        }
        if decision.await_prefill {
            self.prefill = Prefill::Pending;
        }
        self.merge_wanted = decision.merge_input_logprobs;
        debug!(path = %self.path, worker = %decision.worker_url, %endpoints, "routed");
        reply(processing_response::Response::RequestBody(BodyResponse {
            response: Some(CommonResponse {
                header_mutation: Some(mutation),
                body_mutation,
                ..Default::default()
            }),
        }))
    }

    fn on_response_headers(&mut self, h: HttpHeaders) -> Next {
        // The worker has read the body: Envoy no longer holds it.
        self.body_hold = None;
        let headers = header_list(h.headers.as_ref());
        let get = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        self.status = get(":status").and_then(|s| s.parse().ok()).unwrap_or(0);
        self.sse = get("content-type").is_some_and(|t| t.starts_with("text/event-stream"));
        self.response_done |= h.end_of_stream;
        self.decode_failed = !(200..300).contains(&self.status);
        // A failed answer counts against its workers before the client
        // sees it (and sends its next request). Not in PD mode, where a
        // decode's failure may be its prefill's: the end tells.
        let pd = !matches!(self.prefill, Prefill::None);
        if let (Some(ticket), true, false) = (self.ticket, is_worker_failure(self.status), pd) {
            self.engine.record_outcome(&self.completion(ticket, true));
        }
        if self.decode_failed && !matches!(self.prefill, Prefill::Pending) {
            // The worker's own error goes to the client as it is
            // (sglang-router does the same); a prefill no longer matters.
            self.prefill = Prefill::None;
        }
        if matches!(self.prefill, Prefill::Pending) {
            // Held until the prefill has succeeded: if it fails, the client
            // gets its error instead of a decode stuck waiting for KV.
            self.holding_headers = true;
            return Next::HoldForPrefill;
        }
        send(self.release_response_headers())
    }

    /// The prefill's outcome arrived. Held response headers go on, or give
    /// way to the prefill's error. Before the response headers came, a
    /// failure ends the request at once (Envoy resets the decode request
    /// still waiting for its KV), a success is kept for them.
    fn prefill_ended(&mut self, outcome: PrefillOutcome) -> Option<ProcessingResponse> {
        if !matches!(self.prefill, Prefill::Pending) {
            return None;
        }
        if !outcome.ok {
            self.prefill = Prefill::None;
            let status = prefill_error_status(outcome.http_status);
            // The decode answer has not gone out (its headers are held or
            // have not come), so the client gets the prefill's error.
            return Some(self.immediate(status, &outcome.error_type, &outcome.message));
        }
        let logprobs =
            (self.merge_wanted && !self.decode_failed && !outcome.input_token_logprobs.is_empty())
                .then_some(outcome.input_token_logprobs);
        self.prefill = Prefill::Done(logprobs);
        if !self.holding_headers {
            return None;
        }
        self.holding_headers = false;
        Some(self.release_response_headers())
    }

    /// Lets the response headers go, choosing how much of the body we see:
    /// an SSE stream chunk by chunk (to learn whether it finished, and to
    /// merge into its first event), a JSON body whole when logprobs are to
    /// be merged into it, else none of it.
    fn release_response_headers(&mut self) -> ProcessingResponse {
        let merging = matches!(self.prefill, Prefill::Done(Some(_))) && !self.response_done;
        if !merging {
            self.prefill = Prefill::None;
        }
        let body_mode = if self.response_done {
            BodySendMode::None
        } else if self.sse {
            BodySendMode::Streamed
        } else if merging {
            BodySendMode::Buffered
        } else {
            BodySendMode::None
        };
        if body_mode == BodySendMode::None {
            // A JSON answer is complete at the worker once its headers come
            // (SGLang writes it in one go); Envoy already holds the body.
            self.response_done = true;
        }
        let mut mutation = HeaderMutation::default();
        if merging {
            // A merged body has another length.
            mutation.remove_headers.push("content-length".to_string());
        }
        ProcessingResponse {
            response: Some(processing_response::Response::ResponseHeaders(
                headers_response(mutation),
            )),
            mode_override: (body_mode != BodySendMode::None).then(|| ProcessingMode {
                response_body_mode: body_mode as i32,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn on_response_body(&mut self, b: HttpBody) -> Next {
        // SSE streams come chunk by chunk: the last one says it finished.
        self.response_done |= b.end_of_stream;
        let Prefill::Done(Some(logprobs)) = &self.prefill else {
            return reply(processing_response::Response::ResponseBody(
                BodyResponse::default(),
            ));
        };
        let merged = if self.sse {
            self.held.extend_from_slice(&b.body);
            match merge_first_sse_event(&self.held, logprobs, b.end_of_stream) {
                SseMerge::NeedMore => {
                    // Hold this chunk until the first event is complete.
                    return body_reply(body_mutation::Mutation::ClearBody(true));
                }
                SseMerge::Done(out) => {
                    self.held = Vec::new();
                    Some(out)
                }
            }
        } else {
            // BUFFERED: this is the whole body.
            merge_input_logprobs(&b.body, logprobs)
        };
        self.prefill = Prefill::None;
        match merged {
            Some(out) => body_reply(body_mutation::Mutation::Body(out)),
            None => reply(processing_response::Response::ResponseBody(
                BodyResponse::default(),
            )),
        }
    }

    /// Answers a rejection (or an unusable answer) of the engine.
    fn refuse(&mut self, outcome: Option<route_response::Outcome>) -> Next {
        match outcome {
            Some(route_response::Outcome::Rejection(r)) => {
                let status = u16::try_from(r.http_status).unwrap_or(503);
                self.local_reply(status, &r.error_type, &r.message)
            }
            Some(route_response::Outcome::Decision(_)) => {
                self.local_reply(503, "service_unavailable", "no worker was chosen")
            }
            Some(route_response::Outcome::NeedBody(_))
            | Some(route_response::Outcome::Queued(_))
            | None => {
                warn!(path = %self.path, "the engine gave no usable answer");
                self.local_reply(502, "bad_gateway", "the router could not decide")
            }
        }
    }

    fn too_large(&mut self) -> Next {
        let r = too_large(self.max_body_bytes);
        self.local_reply(r.status, r.kind, &r.message)
    }

    fn local_reply(&mut self, status: u16, kind: &str, message: &str) -> Next {
        send(self.immediate(status, kind, message))
    }

    /// Ends the request with an OpenAI-shaped JSON error.
    fn immediate(&mut self, status: u16, kind: &str, message: &str) -> ProcessingResponse {
        self.status = u32::from(status);
        self.response_done = true;
        self.replied_locally = true;
        debug!(path = %self.path, status, kind, message, "local reply");
        ProcessingResponse {
            response: Some(processing_response::Response::ImmediateResponse(
                ImmediateResponse {
                    status: Some(HttpStatus {
                        code: i32::from(status),
                    }),
                    headers: Some(HeaderMutation {
                        set_headers: vec![
                            set_header("content-type", "application/json"),
                            set_header("x-sglang-envoy-error", kind),
                        ],
                        ..Default::default()
                    }),
                    body: openai_error_json(status, kind, message).into_bytes(),
                    details: format!("sglang_router_{}", status),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.name == name)
            .map(|h| h.value.as_str())
    }
}

impl Exchange {
    /// What the engine learns of `ticket` now: its end, or (`outcome_only`)
    /// what its answer, just started, says about the workers tried.
    fn completion(&self, ticket: u64, outcome_only: bool) -> Completion {
        Completion {
            ticket,
            http_status: self.status,
            client_cancelled: !self.response_done,
            upstream_host: self.upstream_host.clone(),
            attempts: self.attempts,
            // Ours (a prefill's error, a rejection), or Envoy's about
            // something other than the worker.
            local_reply: self.replied_locally
                || self
                    .code_details
                    .as_deref()
                    .is_some_and(|d| d != "via_upstream" && !d.starts_with("upstream")),
            duration_us: self.started.elapsed().as_micros() as u64,
            outcome_only,
        }
    }
}

impl Drop for Exchange {
    /// Reports the request's end, so its load is released however the
    /// stream ended (response done, client gone, Envoy reset, our error).
    fn drop(&mut self) {
        let Some(ticket) = self.ticket else {
            return;
        };
        let completion = self.completion(ticket, false);
        debug!(
            ticket,
            status = completion.http_status,
            cancelled = completion.client_cancelled,
            upstream = %completion.upstream_host,
            "request ended"
        );
        if let Some(worker) = self.engine.complete(&completion) {
            if let (Some(health), Ok(runtime)) =
                (self.health.clone(), tokio::runtime::Handle::try_current())
            {
                runtime.spawn(async move { health.suspect(&worker).await });
            }
        }
    }
}

/// Resolves with the prefill's outcome, or never when nothing is awaited.
async fn wait_for<T>(waiting: &mut Option<Pin<Box<dyn Future<Output = T> + Send>>>) -> T {
    match waiting.as_mut() {
        Some(wait) => wait.await,
        None => std::future::pending().await,
    }
}

/// Resolves when `sleep` does, or never when there is none.
async fn sleep_for(sleep: &mut Option<Pin<Box<tokio::time::Sleep>>>) {
    match sleep.as_mut() {
        Some(sleep) => sleep.await,
        None => std::future::pending().await,
    }
}

/// Asks Envoy to wait up to `limit` (at most [`MAX_PREFILL_WAIT`]) for the
/// answer to the message in flight.
fn extend_timeout(limit: Duration) -> ProcessingResponse {
    let wait = limit.min(MAX_PREFILL_WAIT).max(Duration::from_secs(1));
    ProcessingResponse {
        override_message_timeout: Some(ProtoDuration {
            seconds: wait.as_secs() as i64,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// An inference request: its whole body, then its response headers. The
/// Envoy config skips response headers by default, so that replies Envoy
/// makes to requests never shown to us (a malformed request, HTTP/1.0) go
/// out at once instead of waiting on a processor that knows nothing of them.
fn routed() -> ProcessingMode {
    ProcessingMode {
        request_header_mode: HeaderSendMode::Send as i32,
        request_body_mode: BodySendMode::Buffered as i32,
        request_trailer_mode: HeaderSendMode::Skip as i32,
        response_header_mode: HeaderSendMode::Send as i32,
        response_body_mode: BodySendMode::None as i32,
        response_trailer_mode: HeaderSendMode::Skip as i32,
    }
}

/// Nothing else of this request is sent to us: no body, no response.
fn nothing_more() -> ProcessingMode {
    ProcessingMode {
        request_body_mode: BodySendMode::None as i32,
        response_header_mode: HeaderSendMode::Skip as i32,
        response_body_mode: BodySendMode::None as i32,
        response_trailer_mode: HeaderSendMode::Skip as i32,
        ..Default::default()
    }
}

fn send(response: ProcessingResponse) -> Next {
    Next::Reply(Box::new(response))
}

fn reply(response: processing_response::Response) -> Next {
    send(ProcessingResponse {
        response: Some(response),
        ..Default::default()
    })
}

fn body_reply(mutation: body_mutation::Mutation) -> Next {
    reply(processing_response::Response::ResponseBody(BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(mutation),
            }),
            ..Default::default()
        }),
    }))
}

fn headers_response(mutation: HeaderMutation) -> HeadersResponse {
    HeadersResponse {
        response: Some(CommonResponse {
            header_mutation: Some(mutation),
            ..Default::default()
        }),
    }
}

fn set_header(name: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: name.to_string(),
            raw_value: value.as_bytes().to_vec(),
            ..Default::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

/// `(name, value)` of each header; Envoy sends values in `raw_value`
/// (older versions in `value`).
fn header_list(map: Option<&HeaderMap>) -> Vec<(String, String)> {
    map.map(|m| {
        m.headers
            .iter()
            .map(|h| {
                let value = if h.raw_value.is_empty() {
                    h.value.clone()
                } else {
                    String::from_utf8_lossy(&h.raw_value).into_owned()
                };
                (h.key.to_ascii_lowercase(), value)
            })
            .collect()
    })
    .unwrap_or_default()
}

/// The `upstream.address` response attribute, when Envoy sent it.
/// The attempt count Envoy sends with the response (`response_attributes`).
fn attempt_count(attributes: &std::collections::HashMap<String, Struct>) -> Option<u32> {
    let value = attributes.get(ATTRIBUTES_KEY)?.fields.get(ATTEMPT_COUNT)?;
    match &value.kind {
        Some(value::Kind::NumberValue(n)) if *n >= 0.0 => Some(*n as u32),
        Some(value::Kind::StringValue(s)) => s.trim().parse().ok(),
        _ => None,
    }
}

fn upstream_address(attributes: &std::collections::HashMap<String, Struct>) -> Option<String> {
    string_attribute(attributes, UPSTREAM_ADDRESS)
}

/// A non-empty string attribute Envoy sends with the response.
fn string_attribute(
    attributes: &std::collections::HashMap<String, Struct>,
    name: &str,
) -> Option<String> {
    let value = attributes.get(ATTRIBUTES_KEY)?.fields.get(name)?;
    match &value.kind {
        Some(value::Kind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::engine_with;
    use crate::engine::EngineOptions;
    use crate::workers::WorkerSpec;
    use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Out;
    use processing_request::Request as In;

    /// `workers` healthy loopback servers of two DP ranks each.
    fn engine(workers: u16) -> Arc<Engine> {
        let servers: Vec<_> = (1..=workers)
            .map(|port| (port, WorkerSpec::REGULAR, Some(2)))
            .collect();
        Arc::new(engine_with(EngineOptions::default(), &servers))
    }

    /// One ext_proc stream against `engine`: send Envoy's messages, read
    /// the answers.
    struct Stream {
        to: Option<mpsc::Sender<Result<ProcessingRequest, Status>>>,
        from: mpsc::Receiver<Result<ProcessingResponse, Status>>,
        done: tokio::task::JoinHandle<()>,
    }

    impl Stream {
        fn open(engine: &Arc<Engine>, max_body_bytes: usize) -> Stream {
            let exchange = Exchange::new(
                engine.clone(),
                None,
                Arc::new(TicketSource::new()),
                max_body_bytes,
                BodyBudget::new(usize::MAX),
            );
            let (to, inbound) = mpsc::channel(4);
            let (tx, from) = mpsc::channel(4);
            let done = tokio::spawn(exchange.run(ReceiverStream::new(inbound), tx));
            Stream {
                to: Some(to),
                from,
                done,
            }
        }

        async fn ask(&mut self, request: In) -> ProcessingResponse {
            self.send(request).await;
            self.from.recv().await.unwrap().unwrap()
        }

        async fn send(&mut self, request: In) {
            let message = ProcessingRequest {
                request: Some(request),
                ..Default::default()
            };
            self.to.as_ref().unwrap().send(Ok(message)).await.unwrap();
        }

        /// Envoy ends the stream (cleanly or with a reset).
        async fn end(mut self, reset: bool) {
            if reset {
                let _ = self
                    .to
                    .as_ref()
                    .unwrap()
                    .send(Err(Status::internal("reset")))
                    .await;
            }
            self.to = None;
            self.done.await.unwrap();
        }
    }

    fn headers(list: &[(&str, &str)], end_of_stream: bool) -> HttpHeaders {
        HttpHeaders {
            headers: Some(HeaderMap {
                headers: list
                    .iter()
                    .map(|(k, v)| HeaderValue {
                        key: k.to_string(),
                        raw_value: v.as_bytes().to_vec(),
                        ..Default::default()
                    })
                    .collect(),
            }),
            end_of_stream,
            ..Default::default()
        }
    }

    fn post(path: &str) -> In {
        In::RequestHeaders(headers(
            &[
                (":method", "POST"),
                (":path", path),
                ("x-request-id", "r1"),
                (ENDPOINT_HEADER, "10.0.0.1:1"),
            ],
            false,
        ))
    }

    fn body(text: &str) -> In {
        In::RequestBody(HttpBody {
            body: text.as_bytes().to_vec(),
            end_of_stream: true,
            ..Default::default()
        })
    }

    fn common(r: &ProcessingResponse) -> &CommonResponse {
        match &r.response {
            Some(Out::RequestHeaders(h)) | Some(Out::ResponseHeaders(h)) => {
                h.response.as_ref().unwrap()
            }
            Some(Out::RequestBody(b)) | Some(Out::ResponseBody(b)) => b.response.as_ref().unwrap(),
            other => panic!("not a common response: {other:?}"),
        }
    }

    fn set(r: &ProcessingResponse, name: &str) -> Option<String> {
        common(r)
            .header_mutation
            .as_ref()?
            .set_headers
            .iter()
            .filter_map(|o| o.header.as_ref())
            .find(|h| h.key == name)
            .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
    }

    fn immediate(r: &ProcessingResponse) -> (i32, serde_json::Value) {
        match &r.response {
            Some(Out::ImmediateResponse(i)) => (
                i.status.as_ref().unwrap().code,
                serde_json::from_slice(&i.body).unwrap(),
            ),
            other => panic!("not an immediate response: {other:?}"),
        }
    }

    fn total_load(e: &Engine) -> u64 {
        e.registry().all().iter().map(|w| w.load() as u64).sum()
    }

    fn metrics(e: &Engine) -> String {
        e.metrics().render(&e.registry().all(), None)
    }

    #[tokio::test]
    async fn routes_on_the_body_injects_the_rank_and_releases_the_load() {
        let e = engine(2);
        let mut s = Stream::open(&e, 1 << 20);
        let r = s.ask(post("/generate?x=1")).await;
        assert_eq!(
            common(&r).header_mutation.as_ref().unwrap().remove_headers,
            [ENDPOINT_HEADER],
            "a client's endpoint header is dropped"
        );
        let client_body = r#"{"text":"hello", "temperature": 0.70}"#;
        let r = s.ask(body(client_body)).await;
        let endpoints = set(&r, ENDPOINT_HEADER).unwrap();
        assert_eq!(
            endpoints,
            "127.0.0.1:1,127.0.0.1:2,127.0.0.1:1,127.0.0.1:2,127.0.0.1:1"
        );
        assert_eq!(set(&r, "x-envoy-max-retries").as_deref(), Some("4"));
        let Some(body_mutation::Mutation::Body(new_body)) = common(&r)
            .body_mutation
            .as_ref()
            .and_then(|m| m.mutation.clone())
        else {
            panic!("the rank is injected: {r:?}");
        };
        let text = String::from_utf8(new_body).unwrap();
        assert!(text.contains(r#""temperature": 0.70"#), "{text}");
        assert!(text.contains(r#""routed_dp_rank":0"#), "{text}");
        assert_eq!(set(&r, "content-length"), Some(text.len().to_string()));
        assert_eq!(total_load(&e), 1);

        let r = s
            .ask(In::ResponseHeaders(headers(
                &[(":status", "200"), ("content-type", "application/json")],
                false,
            )))
            .await;
        assert!(r.mode_override.is_none(), "JSON bodies are not sent to us");
        s.end(true).await;
        assert_eq!(total_load(&e), 0);
        assert_eq!(e.in_flight(), 0);
        assert!(!metrics(&e).contains("client_cancelled"));
    }

    #[tokio::test]
    async fn sse_is_followed_to_its_last_chunk_and_a_hang_up_counts_as_cancelled() {
        let e = engine(1);
        for finish in [true, false] {
            let mut s = Stream::open(&e, 1 << 20);
            s.ask(post("/v1/completions")).await;
            s.ask(body(r#"{"prompt":"p","stream":true}"#)).await;
            let r = s
                .ask(In::ResponseHeaders(headers(
                    &[(":status", "200"), ("content-type", "text/event-stream")],
                    false,
                )))
                .await;
            assert_eq!(
                r.mode_override.as_ref().map(|m| m.response_body_mode),
                Some(BodySendMode::Streamed as i32)
            );
            let chunk = |end| {
                In::ResponseBody(HttpBody {
                    body: b"data: {}\n\n".to_vec(),
                    end_of_stream: end,
                    ..Default::default()
                })
            };
            let r = s.ask(chunk(false)).await;
            assert_eq!(
                r.response,
                Some(Out::ResponseBody(BodyResponse::default())),
                "chunks pass unchanged"
            );
            if finish {
                s.ask(chunk(true)).await;
            }
            assert_eq!(total_load(&e), 1);
            s.end(false).await;
            assert_eq!(total_load(&e), 0);
            assert_eq!(metrics(&e).contains("client_cancelled"), !finish);
        }
    }

    #[tokio::test]
    async fn unusable_requests_get_openai_errors_and_count_nothing() {
        let e = engine(1);
        let cases: Vec<(Vec<In>, i32, &str)> = vec![
            (
                vec![In::RequestHeaders(headers(
                    &[(":method", "GET"), (":path", "/generate")],
                    true,
                ))],
                405,
                "POST",
            ),
            (
                vec![In::RequestHeaders(headers(
                    &[(":method", "POST"), (":path", "/generate")],
                    true,
                ))],
                400,
                "body is required",
            ),
            (
                vec![In::RequestHeaders(headers(
                    &[
                        (":method", "POST"),
                        (":path", "/generate"),
                        ("content-length", "101"),
                    ],
                    false,
                ))],
                413,
                "limit of 100 bytes",
            ),
            (
                vec![post("/generate"), body(&"x".repeat(101))],
                413,
                "limit of 100 bytes",
            ),
            (
                vec![post("/v1/chat/completions"), body("{\"messages\": [")],
                400,
                "not valid JSON",
            ),
        ];
        for (messages, status, part) in cases {
            let mut s = Stream::open(&e, 100);
            let mut last = None;
            for m in messages {
                last = Some(s.ask(m).await);
            }
            let (code, error) = immediate(&last.unwrap());
            assert_eq!(code, status);
            assert_eq!(error["error"]["code"], status);
            let message = error["error"]["message"].as_str().unwrap();
            assert!(message.contains(part), "{message}");
            s.end(true).await;
        }
        assert_eq!(total_load(&e), 0);
        assert_eq!(e.in_flight(), 0);
    }

    #[tokio::test]
    async fn no_worker_is_a_503_and_info_routes_are_routed_at_the_headers() {
        let e = engine(0);
        let mut s = Stream::open(&e, 100);
        s.ask(post("/generate")).await;
        let (code, _) = immediate(&s.ask(body(r#"{"text":"x"}"#)).await);
        assert_eq!(code, 503);
        s.end(true).await;

        let e = engine(1);
        let mut s = Stream::open(&e, 100);
        let r = s
            .ask(In::RequestHeaders(headers(
                &[(":method", "GET"), (":path", "/v1/models")],
                true,
            )))
            .await;
        assert_eq!(
            set(&r, ENDPOINT_HEADER).as_deref(),
            Some("127.0.0.1:1,127.0.0.1:1,127.0.0.1:1,127.0.0.1:1,127.0.0.1:1")
        );
        assert_eq!(r.mode_override, Some(nothing_more()));
        s.end(false).await;
        assert_eq!(e.in_flight(), 0);

        // Paths the router does not serve never reach a worker.
        for (method, path) in [("POST", "/flush_cache"), ("GET", "/_sim/requests")] {
            let mut s = Stream::open(&e, 100);
            let r = s
                .ask(In::RequestHeaders(headers(
                    &[(":method", method), (":path", path)],
                    false,
                )))
                .await;
            assert_eq!(immediate(&r).0, 404, "{path}");
            s.end(false).await;
        }
        assert_eq!(e.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_stream_cut_before_the_response_releases_the_load() {
        let e = engine(2);
        let mut s = Stream::open(&e, 1 << 20);
        s.ask(post("/generate")).await;
        s.ask(body(r#"{"text":"x"}"#)).await;
        assert_eq!(total_load(&e), 1);
        s.end(true).await;
        assert_eq!(total_load(&e), 0);
        assert!(metrics(&e).contains("client_cancelled"));
    }

    #[test]
    fn upstream_address_comes_from_the_response_attributes() {
        let mut fields = std::collections::HashMap::new();
        fields.insert(
            UPSTREAM_ADDRESS.to_string(),
            envoy_types::pb::google::protobuf::Value {
                kind: Some(value::Kind::StringValue("10.0.0.2:30000".into())),
            },
        );
        let mut attributes = std::collections::HashMap::new();
        attributes.insert(ATTRIBUTES_KEY.to_string(), Struct { fields });
        assert_eq!(
            upstream_address(&attributes).as_deref(),
            Some("10.0.0.2:30000")
        );
        assert_eq!(upstream_address(&Default::default()), None);
    }

    #[test]
    fn tickets_are_distinct_and_never_zero() {
        let t = TicketSource {
            base: u64::MAX - 1,
            next: AtomicU64::new(1),
        };
        let got: Vec<u64> = (0..3).map(|_| t.next()).collect();
        assert_eq!(got, [u64::MAX, 1, 2]);
    }
}
