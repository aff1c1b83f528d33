//! Envoy's ext_proc messages as lifecycle events, and the lifecycle's steps
//! as ext_proc replies.

use std::borrow::Cow;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_request, processing_response, BodyMutation, BodyResponse,
    CommonResponse, HeaderMutation, HeadersResponse, HttpBody, HttpHeaders, ProcessingRequest,
    ProcessingResponse, TrailersResponse,
};
use sglang_envoy_body::over_budget;
use sglang_envoy_lifecycle::names::ENDPOINT_HEADER;
use sglang_envoy_lifecycle::{
    BodyStep, Forward, HeadStep, LocalReply, PrefillStep, Release, RequestHead, ResponseHead,
    ResponseStep, Source, Step, Watch,
};
use sglang_envoy_proto::{PRIORITY_HEADER, ROUTING_KEY_HEADER};
use tracing::{debug, warn};

use super::duplex::{self, Duplex, Way};
use super::messages::{
    self, body_reply, header_list, headers_response, immediate, nothing_more, reply, routed,
    set_header, Attributes,
};
use super::Exchange;

/// What to do after a message from Envoy (or a wait that ended).
pub(super) enum Next {
    /// Send this reply.
    Reply(Box<ProcessingResponse>),
    /// Send these, in order (full duplex: a held head, then the body).
    Replies(Vec<ProcessingResponse>),
    /// The answer's head is held for the prefill's outcome: no reply yet
    /// with a `grace`, else one that extends Envoy's message timeout.
    Hold { grace: Option<Duration> },
    /// Admission control queued the request: wait for a slot (keeping
    /// Envoy waiting too), then route it.
    AwaitAdmission,
    /// Nothing to answer.
    Nothing,
}

/// The client's request as this front door keeps it.
#[derive(Default)]
pub(super) struct Received {
    /// Headers without pseudo-headers (and without the endpoint header).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Source for Received {
    fn body_len(&self) -> usize {
        self.body.len()
    }

    fn body(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.body)
    }

    fn headers(&self) -> Vec<(String, String)> {
        self.headers.clone()
    }
}

fn send(response: ProcessingResponse) -> Next {
    Next::Reply(Box::new(response))
}

impl Exchange {
    pub(super) fn on_message(&mut self, message: ProcessingRequest) -> Next {
        if self.lc.replied() {
            // Envoy ignores anything after a local reply; so do we (a
            // message may cross an unsolicited prefill error).
            return Next::Nothing;
        }
        if let Some(config) = &message.protocol_config {
            // Only the stream's first message says how Envoy sends bodies.
            self.duplex = Duplex::of(config);
        }
        let a = Attributes::of(&message.attributes);
        if let Some(address) = a.client_address {
            self.client_address = address;
        }
        if let Some(host) = a.upstream_host {
            self.facts.upstream_host = host;
        }
        // What the gateway says served the request outranks the attribute:
        // the picker protocol's way to credit the right worker.
        if let Some(host) = messages::served(message.metadata_context.as_ref()) {
            self.facts.upstream_host = host;
        }
        if let Some(subset) = messages::subset_hint(message.metadata_context.as_ref()) {
            self.subset = Some(subset);
        }
        if let Some(n) = a.attempts {
            self.facts.attempts = n;
        }
        if a.code_details.is_some() {
            self.facts.code_details = a.code_details;
        }
        use processing_request::Request as In;
        use processing_response::Response as Out;
        match message.request {
            Some(In::RequestHeaders(h)) => self.on_request_headers(h),
            Some(In::RequestBody(b)) => self.on_request_body(b),
            // A body ended by trailers is refused while it is read, as the
            // wasm filter refuses it. In full duplex, routing it was tried:
            // the worker got a corrupted body from Envoy 1.40.
            Some(In::RequestTrailers(_)) => match self.lc.on_request_trailers() {
                Some(r) => self.reply(r),
                None => send(reply(Out::RequestTrailers(TrailersResponse::default()))),
            },
            Some(In::ResponseHeaders(h)) => self.on_response_headers(h),
            Some(In::ResponseBody(b)) => {
                if let Some(prefilled) = self.lc.on_response_bytes(b.body.len()) {
                    self.engine.report(&prefilled);
                }
                if self.duplex.response {
                    self.on_duplex_response_body(b)
                } else {
                    send(self.on_response_body(b))
                }
            }
            Some(In::ResponseTrailers(_)) => {
                self.lc.on_response_end();
                let mut replies = Vec::new();
                if self.duplex.holding() {
                    // The body ends here: what is held goes before them.
                    let step = self.lc.on_response_body(&[], true);
                    replies = self.duplex.answer_chunk(step, Vec::new(), false);
                    replies.extend(self.duplex.release_held(None));
                }
                replies.push(reply(Out::ResponseTrailers(TrailersResponse::default())));
                Next::Replies(replies)
            }
            None => Next::Nothing,
        }
    }

    fn on_request_headers(&mut self, h: HttpHeaders) -> Next {
        let (mut path, mut method) = (String::new(), String::new());
        for (name, value) in header_list(h.headers.as_ref()) {
            match name.as_str() {
                ":path" => path = value,
                ":method" => method = value,
                n if n.starts_with(':') => {}
                // Only the control plane chooses the worker: a client must not.
                ENDPOINT_HEADER => {}
                _ => self.request.headers.push((name, value)),
            }
        }
        let header = |name: &str| {
            self.request
                .headers
                .iter()
                .find(|(n, _)| n == name)
                .map_or("", |(_, v)| v.as_str())
        };
        self.declared_body = header("content-length").parse().ok();
        let tenant_header = self.engine.options().tenant_header.as_deref();
        let head = RequestHead {
            method: &method,
            path: &path,
            end_of_stream: h.end_of_stream,
            content_length: self.declared_body,
            request_id: header("x-request-id"),
            routing_key: header(ROUTING_KEY_HEADER),
            authorization: header("authorization"),
            traceparent: header("traceparent"),
            tenant: tenant_header.map_or("", header),
            priority: header(PRIORITY_HEADER),
            client_address: &self.client_address,
        };
        let step = self.lc.on_request_head(head);
        // A body that will be read holds its declared size at once: in
        // BUFFERED mode Envoy would gather all of it before we see a byte,
        // so one that cannot fit is refused now, not after its upload.
        if matches!(step, HeadStep::ReadBody) {
            if let Some(declared) = self.declared_body {
                if !self.hold_body(declared) {
                    return self.reply(over_budget().into());
                }
            }
        }
        match step {
            HeadStep::Reply(r) => self.reply(r),
            // Full duplex: the head's reply waits for the decision, which
            // waits for the whole body.
            HeadStep::ReadBody if self.duplex.request => Next::Nothing,
            // The whole body comes next (request body mode BUFFERED), and
            // the response headers are ours to see.
            HeadStep::ReadBody => send(ProcessingResponse {
                response: Some(processing_response::Response::RequestHeaders(
                    headers_response(HeaderMutation {
                        remove_headers: vec![ENDPOINT_HEADER.to_string()],
                        ..Default::default()
                    }),
                )),
                mode_override: Some(routed()),
                ..Default::default()
            }),
            HeadStep::Ask(question) => self.step(Step::Ask(question)),
        }
    }

    fn on_request_body(&mut self, b: HttpBody) -> Next {
        if !self.lc.reading_body() {
            if self.duplex.request {
                // A body not read (a request routed at its head): ours to pass.
                return Next::Replies(duplex::streamed(Way::Request, &b.body, b.end_of_stream));
            }
            return send(reply(processing_response::Response::RequestBody(
                BodyResponse::default(),
            )));
        }
        let total = self.request.body.len() + b.body.len();
        if let Some(r) = self.lc.on_body_progress(total) {
            return self.reply(r);
        }
        if !self.hold_body(total) {
            return self.reply(over_budget().into());
        }
        if self.request.body.is_empty() {
            self.request.body = b.body;
        } else {
            self.request.body.extend_from_slice(&b.body);
        }
        if self.duplex.request && !b.end_of_stream {
            // Gathered until the end: the decision reads the whole body.
            return Next::Nothing;
        }
        let step = self.lc.on_body(&self.request, self.attach_body());
        self.step(step)
    }

    /// Makes this request's one hold on the budget cover `bytes` (a hold
    /// that already does is kept; a smaller one is let go first); false
    /// when the budget cannot hold them.
    fn hold_body(&mut self, bytes: usize) -> bool {
        if self.body_hold.as_ref().is_some_and(|h| h.bytes() >= bytes) {
            return true;
        }
        self.body_hold = None;
        self.body_hold = self.budget.hold(bytes);
        self.body_hold.is_some()
    }

    /// Carries out a step of the request's way to its worker; questions
    /// go to the engine at once.
    pub(super) fn step(&mut self, mut step: Step) -> Next {
        loop {
            step = match step {
                Step::Ask(mut question) => {
                    question.subset = self.subset.clone();
                    question.destination = self.destination;
                    let answer = self.engine.route_owned(*question);
                    self.lc.on_answer(answer, &self.request)
                }
                Step::AwaitAdmission { .. } => return Next::AwaitAdmission,
                Step::Forward(f) => {
                    // Decided: the body is Envoy's alone again (or, in full
                    // duplex, goes back to it now).
                    let body = std::mem::take(&mut self.request.body);
                    return self.forward(f, body);
                }
                Step::Reply(r) => return self.reply(r),
                // The engine always answers.
                Step::Fallback => {
                    warn!(path = %self.lc.path(), "the engine gave no usable answer");
                    let r = LocalReply::new(502, "bad_gateway", "the router could not decide");
                    return self.reply(r);
                }
            }
        }
    }

    /// Whether questions carry the body and headers: only the PD engine
    /// (it builds the prefill half) and exact cache matching (it tokenizes
    /// the prompt) read them; other decisions need the routing text alone,
    /// and copying a large body for nothing costs.
    pub(super) fn attach_body(&self) -> bool {
        self.engine.wants_bodies()
    }

    /// The replies sending the request on, edited as the decision says.
    /// The destination goes in the header and, identical, in the dynamic
    /// metadata (`envoy.lb`), as the picker protocol asks. `original` is
    /// the body as received (sent back in full duplex when not edited).
    fn forward(&mut self, f: Forward, original: Vec<u8>) -> Next {
        self.follow_prefill = f.prefill.is_some();
        let mut mutation = HeaderMutation {
            set_headers: vec![set_header(ENDPOINT_HEADER, &f.endpoints)],
            ..Default::default()
        };
        mutation
            .set_headers
            .extend(f.headers.iter().map(|(n, v)| set_header(n, v)));
        let metadata = Some(messages::destination(&f.endpoints));
        debug!(path = %self.lc.path(), worker = %f.worker, endpoints = %f.endpoints, "routed");
        if self.lc.route().is_none() {
            // An info GET, routed at its head; nothing more of it is ours.
            return send(ProcessingResponse {
                response: Some(processing_response::Response::RequestHeaders(
                    headers_response(mutation),
                )),
                mode_override: Some(nothing_more()),
                dynamic_metadata: metadata,
                ..Default::default()
            });
        }
        if self.duplex.request {
            let edited = f.body.is_some();
            let body = f.body.unwrap_or(original);
            if edited {
                mutation
                    .set_headers
                    .push(set_header("content-length", &body.len().to_string()));
            }
            let head = ProcessingResponse {
                response: Some(processing_response::Response::RequestHeaders(
                    HeadersResponse {
                        response: Some(CommonResponse {
                            header_mutation: Some(mutation),
                            // As a picker does: routes may match on the
                            // destination header.
                            clear_route_cache: true,
                            ..Default::default()
                        }),
                    },
                )),
                dynamic_metadata: metadata,
                ..Default::default()
            };
            let mut replies = vec![head];
            replies.extend(duplex::streamed(Way::Request, &body, true));
            return Next::Replies(replies);
        }
        let body_mutation = f.body.map(|body| {
            mutation
                .set_headers
                .push(set_header("content-length", &body.len().to_string()));
            BodyMutation {
                mutation: Some(body_mutation::Mutation::Body(body)),
            }
        });
        send(ProcessingResponse {
            dynamic_metadata: metadata,
            ..reply(processing_response::Response::RequestBody(BodyResponse {
                response: Some(CommonResponse {
                    header_mutation: Some(mutation),
                    body_mutation,
                    ..Default::default()
                }),
            }))
        })
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
        let head = ResponseHead {
            status: get(":status").and_then(|s| s.parse().ok()).unwrap_or(0),
            sse: get("content-type").is_some_and(|t| t.starts_with("text/event-stream")),
            end_of_stream: h.end_of_stream,
        };
        let facts = self.facts();
        match self.lc.on_response_head(head, || facts) {
            ResponseStep::Continue { release, report } => {
                if let Some(failure) = report {
                    // Counted before the client sees the answer.
                    self.engine.report(&failure);
                }
                send(self.release(release))
            }
            ResponseStep::Hold { grace } => Next::Hold { grace },
        }
    }

    /// Lets the answer's head go; a JSON answer not watched further is
    /// complete at the worker once its head comes (SGLang writes it in one
    /// go, and Envoy holds it by then).
    fn release(&mut self, release: Release) -> ProcessingResponse {
        let ended = self.lc.response_ended();
        if ended || release.watch == Watch::Nothing {
            self.lc.on_response_end();
        }
        messages::release(release, ended)
    }

    /// Carries out what the lifecycle says after the prefill's outcome.
    pub(super) fn prefill_step(&mut self, step: PrefillStep) -> Next {
        match step {
            PrefillStep::Nothing | PrefillStep::KeepHolding => Next::Nothing,
            PrefillStep::Reply(r) => self.reply(r),
            PrefillStep::Release { release, replace } if self.duplex.response => {
                let mut replies = vec![self.release(release)];
                if replace.is_none() && self.duplex.response_end && self.lc.needs_response_bytes() {
                    // The whole answer came while its head was held: the
                    // merge it waits for is due now.
                    let step = self.lc.on_response_body(&[], true);
                    replies.extend(self.duplex.answer_chunk(step, Vec::new(), true));
                }
                replies.extend(self.duplex.release_held(replace));
                Next::Replies(replies)
            }
            PrefillStep::Release { release, replace } => {
                if replace.is_some() {
                    // Nothing of the body is shown while the head is held.
                    warn!(path = %self.lc.path(), "a merge with no body held; ignored");
                }
                send(self.release(release))
            }
        }
    }

    /// Full duplex: the chunk goes back now, or is kept while held.
    fn on_duplex_response_body(&mut self, b: HttpBody) -> Next {
        let step = self.lc.on_response_body(&b.body, b.end_of_stream);
        Next::Replies(self.duplex.answer_chunk(step, b.body, b.end_of_stream))
    }

    fn on_response_body(&mut self, b: HttpBody) -> ProcessingResponse {
        match self.lc.on_response_body(&b.body, b.end_of_stream) {
            BodyStep::Pass => reply(processing_response::Response::ResponseBody(
                BodyResponse::default(),
            )),
            // Held here until the merge can be made; Envoy drops it.
            BodyStep::Hold => body_reply(body_mutation::Mutation::ClearBody(true)),
            BodyStep::Replace(out) => body_reply(body_mutation::Mutation::Body(out)),
        }
    }

    /// Ends the request with the router's own error.
    pub(super) fn reply(&mut self, r: LocalReply) -> Next {
        self.request.body = Vec::new();
        let r = self.lc.refuse(r);
        debug!(path = %self.lc.path(), status = r.status, kind = %r.kind, message = %r.message, "local reply");
        send(immediate(&r))
    }
}
