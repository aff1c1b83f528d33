//! Envoy's ext_proc messages as lifecycle events, and the lifecycle's steps
//! as ext_proc replies.

use std::borrow::Cow;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_request, processing_response, BodyMutation, BodyResponse,
    CommonResponse, HeaderMutation, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
    TrailersResponse,
};
use sglang_envoy_body::over_budget;
use sglang_envoy_lifecycle::names::ENDPOINT_HEADER;
use sglang_envoy_lifecycle::{
    BodyStep, Forward, HeadStep, LocalReply, Mode, PrefillStep, Release, RequestHead, ResponseHead,
    ResponseStep, Source, Step, Watch,
};
use sglang_envoy_proto::ROUTING_KEY_HEADER;
use tracing::{debug, warn};

use super::messages::{
    self, body_reply, header_list, headers_response, immediate, nothing_more, reply, routed,
    set_header, Attributes,
};
use super::Exchange;

/// What to do after a message from Envoy (or a wait that ended).
pub(super) enum Next {
    /// Send this reply.
    Reply(Box<ProcessingResponse>),
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
        let a = Attributes::of(&message.attributes);
        if let Some(host) = a.upstream_host {
            self.facts.upstream_host = host;
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
            Some(In::RequestTrailers(_)) => match self.lc.on_request_trailers() {
                Some(r) => self.reply(r),
                None => send(reply(Out::RequestTrailers(TrailersResponse::default()))),
            },
            Some(In::ResponseHeaders(h)) => self.on_response_headers(h),
            Some(In::ResponseBody(b)) => send(self.on_response_body(b)),
            Some(In::ResponseTrailers(_)) => {
                self.lc.on_response_end();
                send(reply(Out::ResponseTrailers(TrailersResponse::default())))
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
        let head = RequestHead {
            method: &method,
            path: &path,
            end_of_stream: h.end_of_stream,
            content_length: self.declared_body,
            request_id: header("x-request-id"),
            routing_key: header(ROUTING_KEY_HEADER),
        };
        match self.lc.on_request_head(head) {
            HeadStep::Reply(r) => self.reply(r),
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
            return send(reply(processing_response::Response::RequestBody(
                BodyResponse::default(),
            )));
        }
        if let Some(r) = self.lc.on_body_progress(b.body.len()) {
            return self.reply(r);
        }
        self.body_hold = self.budget.hold(b.body.len());
        if self.body_hold.is_none() {
            return self.reply(over_budget().into());
        }
        self.request.body = b.body;
        let step = self.lc.on_body(&self.request, self.attach_body());
        self.step(step)
    }

    /// Carries out a step of the request's way to its worker; questions
    /// go to the engine at once.
    pub(super) fn step(&mut self, mut step: Step) -> Next {
        loop {
            step = match step {
                Step::Ask(question) => {
                    let answer = self.engine.route(&question);
                    self.lc.on_answer(answer, &self.request)
                }
                Step::AwaitAdmission { .. } => return Next::AwaitAdmission,
                Step::Forward(f) => {
                    // Decided: the body is Envoy's alone again.
                    self.request.body = Vec::new();
                    return send(self.forward(f));
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
    /// reads them (it builds the prefill half); regular decisions need the
    /// routing text alone, and copying a large body for nothing costs.
    pub(super) fn attach_body(&self) -> bool {
        self.engine.options().mode == Mode::Pd
    }

    /// The reply sending the request on, edited as the decision says.
    fn forward(&mut self, f: Forward) -> ProcessingResponse {
        self.follow_prefill = f.await_prefill;
        let mut mutation = HeaderMutation {
            set_headers: vec![set_header(ENDPOINT_HEADER, &f.endpoints)],
            ..Default::default()
        };
        mutation
            .set_headers
            .extend(f.headers.iter().map(|(n, v)| set_header(n, v)));
        debug!(path = %self.lc.path(), worker = %f.worker, endpoints = %f.endpoints, "routed");
        if self.lc.route().is_none() {
            // An info GET, routed at its head; nothing more of it is ours.
            return ProcessingResponse {
                response: Some(processing_response::Response::RequestHeaders(
                    headers_response(mutation),
                )),
                mode_override: Some(nothing_more()),
                ..Default::default()
            };
        }
        let body_mutation = f.body.map(|body| {
            mutation
                .set_headers
                .push(set_header("content-length", &body.len().to_string()));
            BodyMutation {
                mutation: Some(body_mutation::Mutation::Body(body)),
            }
        });
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
                    self.engine.record_outcome(&failure);
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
            PrefillStep::Release { release, replace } => {
                if replace.is_some() {
                    // Nothing of the body is shown while the head is held.
                    warn!(path = %self.lc.path(), "a merge with no body held; ignored");
                }
                send(self.release(release))
            }
        }
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
