//! One request through the router: its state, and each event that moves
//! it on. On the request's side: validation, the routing question, the
//! control plane's answer (a decision, a rejection, a queue slot, a request
//! for the body) and the edits that send it on. On the answer's side, the
//! lifecycle keeps what is the request's own (its status, its load, its
//! end) and hands the rest to its [`AnswerState`] (`answer.rs`).

use sglang_envoy_body::{
    is_worker_failure, too_large, BodyError, Endpoint, Head, Layout, Refusal, RequestBody, Route,
};
use sglang_envoy_proto::{AdmissionOutcome, Completion, PrefillOutcome};

use crate::answer::AnswerState;
use crate::cached_tokens::CachedTokensWatch;
use crate::client_key::ClientKey;
use crate::completion::{EndFacts, Known};
use crate::front_door::{RequestHead, ResponseHead, Settings, Source};
use crate::mode::Mode;
use crate::prefill_end::PrefillEnd;
use crate::question::{Answer, Question, Routed, Unrouted};
use crate::reply::LocalReply;
use crate::steps::{
    BodyStep, Forward, HeadStep, Held, Overdue, PrefillStep, Release, ResponseStep, Step, Watch,
};
use crate::wire::status_of;

/// Where a request stands. One state at a time: each event either moves
/// it on or is ignored as coming too late.
#[derive(Debug)]
enum State {
    /// Nothing seen yet.
    Start,
    /// An inference request's body is arriving.
    ReadingBody,
    /// A routing question is out; `with_body` when it carried the body.
    Asking { with_body: bool },
    /// Admission control queued the request.
    Queued,
    /// The request went on to its worker(s); what its answer still needs.
    Upstream(AnswerState),
    /// The router answered the client itself.
    Replied,
}

/// Whether the control plane counts load under a request's ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    /// No question was sent: nothing to release.
    Uncounted,
    /// A question was sent: the control plane may count load from then
    /// on, so the end must be reported.
    Counted,
    /// The end was reported.
    Released,
}

/// One request through the router. See the crate documentation.
#[derive(Debug)]
pub struct Lifecycle {
    state: State,
    settings: Settings,
    mode: Mode,
    ticket: u64,
    /// Whether the control plane may count load under the ticket.
    load: Load,
    route: Option<Route>,
    path: String,
    method: String,
    request_id: String,
    routing_key: String,
    /// The client's `authorization`, kept for an inference question (the
    /// control plane checks `--api-key` too).
    authorization: String,
    /// The client's `traceparent`, for the decision's span.
    traceparent: String,
    /// The tenant header's value, the client's `x-smg-priority` and its
    /// address: who the request is for (admission).
    tenant: String,
    priority: String,
    client_address: String,
    body_bytes: usize,
    /// Status sent to the client, 0 until known.
    status: u32,
    /// The answer reached its end (as opposed to a hang-up or a reset).
    response_done: bool,
    /// Where the body's fields are, from the one parse of the body.
    layout: Option<Layout>,
    /// The decision asked for the cached tokens the worker reports.
    cached: Option<CachedTokensWatch>,
    /// Whether the end of the worker's prefill is to be reported.
    prefill_end: PrefillEnd,
}

impl Lifecycle {
    /// A request known to the control plane as `ticket`.
    pub fn new(ticket: u64, settings: Settings) -> Self {
        Lifecycle {
            state: State::Start,
            settings,
            mode: Mode::Regular,
            ticket,
            load: Load::Uncounted,
            route: None,
            path: String::new(),
            method: String::new(),
            request_id: String::new(),
            routing_key: String::new(),
            authorization: String::new(),
            traceparent: String::new(),
            tenant: String::new(),
            priority: String::new(),
            client_address: String::new(),
            body_bytes: 0,
            status: 0,
            response_done: false,
            layout: None,
            cached: None,
            prefill_end: PrefillEnd::Unwatched,
        }
    }

    /// The request's ticket.
    pub fn ticket(&self) -> u64 {
        self.ticket
    }

    /// What the front door said it can do.
    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// `:path` of the request.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The inference route, for requests routed on their body.
    pub fn route(&self) -> Option<Route> {
        self.route
    }

    /// Bytes of the body the decision was about.
    pub fn body_bytes(&self) -> usize {
        self.body_bytes
    }

    /// Regular or PD, as decided.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// A question was sent, so the end must be reported.
    pub fn asked(&self) -> bool {
        self.load != Load::Uncounted
    }

    /// The request went on towards a worker.
    pub fn forwarded(&self) -> bool {
        matches!(self.state, State::Upstream(_))
    }

    /// The router answered the client itself.
    pub fn replied(&self) -> bool {
        matches!(self.state, State::Replied)
    }

    /// The request's body is still expected.
    pub fn reading_body(&self) -> bool {
        matches!(self.state, State::ReadingBody)
    }

    /// The request head arrived.
    pub fn on_request_head(&mut self, head: RequestHead<'_>) -> HeadStep {
        self.path = head.path.to_string();
        self.method = head.method.to_string();
        self.request_id = head.request_id.to_string();
        self.routing_key = head.routing_key.to_string();
        self.traceparent = head.traceparent.to_string();
        self.tenant = head.tenant.to_string();
        self.priority = head.priority.to_string();
        self.client_address = head.client_address.to_string();
        let check = Head {
            method: head.method,
            path: head.path,
            end_of_stream: head.end_of_stream,
            content_length: head.content_length,
            max_body_bytes: self.settings.max_body_bytes,
        };
        match check.check() {
            Err(refusal) => HeadStep::Reply(self.refuse(refusal.into())),
            Ok(Endpoint::Inference(route)) => {
                if let Some(key) = self.settings.client_key {
                    if !key.admits(head.authorization) {
                        return HeadStep::Reply(self.refuse(ClientKey::refusal()));
                    }
                }
                self.authorization = head.authorization.to_string();
                self.route = Some(route);
                self.state = State::ReadingBody;
                HeadStep::ReadBody
            }
            Ok(Endpoint::Info) => {
                self.load = Load::Counted;
                self.state = State::Asking { with_body: false };
                HeadStep::Ask(Box::new(self.bare_question()))
            }
        }
    }

    /// `size` bytes of the body have arrived so far; an error when that is
    /// already too much.
    pub fn on_body_progress(&mut self, size: usize) -> Option<LocalReply> {
        (size > self.settings.max_body_bytes)
            .then(|| self.refuse(too_large(self.settings.max_body_bytes).into()))
    }

    /// The whole body (`source`) has arrived: the question about it, with
    /// the body and headers attached when `attach` (the control plane
    /// wants them).
    pub fn on_body<S: Source>(&mut self, source: &S, attach: bool) -> Step {
        if !self.reading_body() {
            return Step::Reply(self.refuse(LocalReply::new(
                500,
                "internal_error",
                "request body out of turn",
            )));
        }
        let size = source.body_len();
        if let Some(reply) = self.on_body_progress(size) {
            return Step::Reply(reply);
        }
        self.body_bytes = size;
        self.ask(source, attach)
    }

    /// Trailers arrived: an inference request's body would end with them,
    /// unseen by the body callbacks, so it is refused rather than let
    /// through unrouted. Other requests pass.
    pub fn on_request_trailers(&mut self) -> Option<LocalReply> {
        self.reading_body().then(|| {
            self.refuse(LocalReply::from(Refusal {
                status: 400,
                kind: "invalid_request_error",
                message: "request trailers are not supported".into(),
            }))
        })
    }

    /// The control plane answered the question.
    pub fn on_answer<S: Source>(&mut self, answer: Answer, source: &S) -> Step {
        let State::Asking { with_body } = self.state else {
            return Step::Reply(LocalReply::new(
                500,
                "internal_error",
                "an answer to no question",
            ));
        };
        match answer {
            Ok(routed) => self.apply(routed, source),
            Err(Unrouted::Rejected(reply)) => Step::Reply(self.refuse(reply)),
            Err(Unrouted::Queued { wait_ms }) => {
                self.state = State::Queued;
                Step::AwaitAdmission { wait_ms }
            }
            Err(Unrouted::NeedBody) => {
                if with_body || self.body_bytes == 0 {
                    Step::Reply(self.refuse(LocalReply::new(
                        502,
                        "bad_gateway",
                        "the router's control plane keeps asking for the body",
                    )))
                } else {
                    self.ask(source, true)
                }
            }
        }
    }

    /// The question reached a control plane that refused it (one replica
    /// of several gone or draining): the same question, built again, for
    /// another replica. Not asking: nothing to ask again, the reply
    /// [`Self::on_no_answer`] gives.
    pub fn on_refused<S: Source>(&mut self, source: &S) -> Step {
        match self.state {
            State::Asking { with_body } => self.ask(source, with_body),
            _ => self.on_no_answer(),
        }
    }

    /// The control plane gave no answer (unreachable, failed, timed out).
    pub fn on_no_answer(&mut self) -> Step {
        match self.state {
            State::Asking { .. } | State::Queued => Step::Fallback,
            _ => Step::Reply(self.refuse(LocalReply::unreachable())),
        }
    }

    /// The wait for admission ended: an admitted request asks again.
    pub fn on_admission<S: Source>(
        &mut self,
        outcome: AdmissionOutcome,
        source: &S,
        attach: bool,
    ) -> Step {
        if !matches!(self.state, State::Queued) {
            return Step::Reply(self.refuse(LocalReply::new(
                500,
                "internal_error",
                "admitted while not queued",
            )));
        }
        match outcome {
            AdmissionOutcome { admitted: true, .. } => self.ask(source, attach),
            AdmissionOutcome {
                rejection: Some(r), ..
            } => Step::Reply(self.refuse(LocalReply::new(
                status_of(r.http_status),
                &r.error_type,
                r.message,
            ))),
            _ => Step::Reply(self.refuse(LocalReply::unreadable())),
        }
    }

    /// The front door sent the request on without the control plane (its
    /// outage fallback); `prefill_merge` is `Some(merge logprobs)` when it
    /// sent a PD prefill half itself.
    pub fn forwarded_locally(&mut self, prefill_merge: Option<bool>) {
        self.go_upstream(prefill_merge);
    }

    /// The request went on towards its worker(s); `prefill_merge` is
    /// `Some(merge logprobs)` when a PD prefill half runs beside it.
    fn go_upstream(&mut self, prefill_merge: Option<bool>) {
        if prefill_merge.is_some() {
            self.mode = Mode::Pd;
        }
        self.state = State::Upstream(AnswerState::after_forward(prefill_merge));
    }

    /// What the front door holds for the router now, if anything (the
    /// front door may hold the answer for reasons of its own as well).
    pub fn held(&self) -> Option<Held> {
        match self.state {
            State::Asking { .. } | State::Queued => Some(Held::Request),
            State::Upstream(ref answer) if answer.holds_head() => Some(Held::AnswerHead),
            _ => None,
        }
    }

    /// What the router waits for did not come in time (lost, or later
    /// than any deadline allows): a held request takes the outage fallback
    /// as if the control plane had not answered, a held answer goes on as
    /// if the prefill's outcome were unknown. Nothing held stays held.
    pub fn on_overdue(&mut self) -> Overdue {
        match self.held() {
            Some(Held::Request) => Overdue::Request(self.on_no_answer()),
            Some(Held::AnswerHead) => Overdue::Prefill(self.on_prefill_unknown()),
            None => Overdue::Nothing,
        }
    }

    /// The router answers the client with `reply`, whatever the request's
    /// state: noted, and handed back to send.
    pub fn refuse(&mut self, reply: LocalReply) -> LocalReply {
        self.state = State::Replied;
        self.status = u32::from(reply.status);
        self.response_done = true;
        reply
    }

    /// The question without the body's parts (info requests, and the start
    /// of every question).
    fn bare_question(&self) -> Question {
        Question {
            path: self.path.clone(),
            method: self.method.clone(),
            request_id: self.request_id.clone(),
            routing_key: self.routing_key.clone(),
            authorization: self.authorization.clone(),
            traceparent: self.traceparent.clone(),
            tenant: self.tenant.clone(),
            priority: self.priority.clone(),
            client_address: self.client_address.clone(),
            body_bytes: self.body_bytes as u64,
            ticket: self.ticket,
            ..Default::default()
        }
    }

    /// Builds the question about the body and marks it sent.
    fn ask<S: Source>(&mut self, source: &S, attach: bool) -> Step {
        let mut question = self.bare_question();
        if let Some(route) = self.route {
            let body = source.body();
            let parsed = match RequestBody::parse(&body) {
                Ok(parsed) => parsed,
                Err(e) => {
                    let reply = LocalReply::new(400, "invalid_request_error", e.to_string());
                    return Step::Reply(self.refuse(reply));
                }
            };
            question.routing_text = parsed.routing_text(route).into_bytes();
            question.stream = parsed.is_stream();
            question.model = parsed.model().unwrap_or_default();
            // Kept so the decision's fields go in without a second parse.
            self.layout = Some(parsed.layout());
            drop(parsed);
            if attach {
                question.headers = source.headers();
                question.body = body.into_owned();
            }
        }
        self.load = Load::Counted;
        self.state = State::Asking {
            with_body: attach && self.route.is_some(),
        };
        Step::Ask(Box::new(question))
    }

    /// Applies a decision: the edits that send the request on.
    fn apply<S: Source>(&mut self, decision: Routed, source: &S) -> Step {
        // Whether the answer streams is known at its head.
        self.cached = decision
            .report_cached_tokens
            .then(|| CachedTokensWatch::new(false));
        self.prefill_end = PrefillEnd::asked(decision.report_prefilled);
        if decision.endpoints.is_empty() {
            return Step::Reply(self.refuse(LocalReply::new(
                503,
                "service_unavailable",
                "no worker was chosen",
            )));
        }
        let mut body = None;
        if !decision.inject.is_empty() {
            let original = source.body();
            let fields: Vec<(&str, &str)> = decision
                .inject
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let reparse = || RequestBody::parse(&original)?.with_fields(&fields);
            let edited = match &self.layout {
                Some(layout) => match layout.with_fields(&original, &fields) {
                    // Not the body the layout came from (never expected):
                    // the slow way.
                    Err(BodyError::NotItsBody) => reparse(),
                    other => other,
                },
                None => reparse(),
            };
            match edited {
                Ok(b) => body = Some(b),
                Err(e) => {
                    let reply = LocalReply::new(500, "internal_error", e.to_string());
                    return Step::Reply(self.refuse(reply));
                }
            }
        }
        self.go_upstream(decision.prefill.map(|follow| follow.merge_input_logprobs));
        Step::Forward(Forward {
            endpoints: decision.endpoints.join(","),
            headers: decision.request_headers,
            body,
            prefill: decision.prefill,
            worker: decision.worker,
        })
    }

    /// The answer's head arrived. `facts` tells what the host says about
    /// it; asked for only when a failure may need reporting (reading them
    /// costs host calls on every answer otherwise).
    pub fn on_response_head(
        &mut self,
        head: ResponseHead,
        facts: impl FnOnce() -> EndFacts,
    ) -> ResponseStep {
        self.status = head.status;
        self.response_done |= head.end_of_stream;
        let State::Upstream(answer) = &mut self.state else {
            // The router's own reply passing out.
            return ResponseStep::Continue {
                release: Release::pass(false),
                report: None,
            };
        };
        let mut step = answer.on_head(head);
        self.prefill_end = self.prefill_end.on_head(head);
        self.cached = self
            .cached
            .take()
            .filter(|_| (200..300).contains(&head.status) && !head.end_of_stream)
            .map(|_| CachedTokensWatch::new(head.sse));
        if let ResponseStep::Continue { report, release } = &mut step {
            if self.cached.is_some() && release.watch == Watch::Nothing {
                // Shown chunk by chunk to read the usage at its end.
                release.watch = Watch::Chunks;
            }
            // A failed answer counts against its workers at once; not in
            // PD mode, where a decode's failure may be its prefill's: the
            // end tells.
            *report = (self.load == Load::Counted
                && self.mode == Mode::Regular
                && is_worker_failure(head.status))
            .then(|| self.completion(&facts(), true))
            .filter(|c| !c.local_reply && is_worker_failure(c.http_status));
        }
        step
    }

    /// The prefill half's outcome arrived.
    pub fn on_prefill(&mut self, outcome: PrefillOutcome) -> PrefillStep {
        if outcome.unknown_ticket {
            // Asked of a replica that did not send it: not a failure.
            return self.on_prefill_unknown();
        }
        let State::Upstream(answer) = &mut self.state else {
            return PrefillStep::Nothing;
        };
        let body_while_head_held = self.settings.body_while_head_held;
        match answer.on_prefill(outcome, body_while_head_held, self.response_done) {
            PrefillStep::Reply(reply) => PrefillStep::Reply(self.refuse(reply)),
            step => step,
        }
    }

    /// The prefill's outcome cannot be known (the control plane went away,
    /// or a decode error's grace ran out): the decode answer goes through
    /// as it is. If the KV never came, the decode worker's own wait times
    /// out and the client gets that error rather than a hang.
    pub fn on_prefill_unknown(&mut self) -> PrefillStep {
        match &mut self.state {
            State::Upstream(answer) => answer.on_prefill_unknown(),
            _ => PrefillStep::Nothing,
        }
    }

    /// A chunk of the answer's body arrived (`end`: the last).
    pub fn on_response_body(&mut self, chunk: &[u8], end: bool) -> BodyStep {
        self.response_done |= end;
        if let Some(watch) = &mut self.cached {
            watch.feed(chunk);
        }
        match &mut self.state {
            State::Upstream(answer) => answer.on_body(chunk, end),
            _ => BodyStep::Pass,
        }
    }

    /// `size` bytes of the answer's body arrived (before
    /// [`Lifecycle::on_response_body`] is shown them, if it is). The first
    /// bytes of a 2xx stream whose decision asked for it return the report
    /// that the worker's prefill of the request is done: a worker streams
    /// nothing before its first token. Once.
    pub fn on_response_bytes(&mut self, size: usize) -> Option<Completion> {
        if self.load != Load::Counted {
            return None;
        }
        self.prefill_end.on_bytes(size, self.ticket)
    }

    /// The lifecycle must be shown the answer's bytes (to merge into them);
    /// otherwise `on_response_body` needs only each chunk's end flag.
    pub fn needs_response_bytes(&self) -> bool {
        matches!(&self.state, State::Upstream(answer) if answer.needs_bytes())
            || self.cached.is_some()
    }

    /// The answer has been seen to end.
    pub fn response_ended(&self) -> bool {
        self.response_done
    }

    /// The answer is known to have ended (its trailers came, or ext_proc
    /// stops watching a JSON answer whose head went).
    pub fn on_response_end(&mut self) {
        self.response_done = true;
    }

    /// The request as it stands: its end, or (`outcome_only`) what its
    /// answer, just started, says about the workers tried.
    pub fn completion(&self, facts: &EndFacts, outcome_only: bool) -> Completion {
        let known = Known {
            ticket: self.ticket,
            status: self.status,
            response_done: self.response_done,
            replied: self.replied(),
            cached_tokens: self
                .cached
                .as_ref()
                .filter(|_| self.response_done && !outcome_only)
                .and_then(CachedTokensWatch::read),
        };
        facts.completion(known, outcome_only)
    }

    /// The request ended: its completion, to report when the control plane
    /// may have counted it and it was not reported yet (a host may report
    /// as the answer's last byte leaves, before the client can ask for the
    /// loads, and again when the stream is gone). `facts` are read only
    /// then: a host pays for each (the filter's are host calls).
    pub fn end(&mut self, facts: impl FnOnce() -> EndFacts) -> Option<Completion> {
        if self.load != Load::Counted {
            return None;
        }
        self.load = Load::Released;
        Some(self.completion(&facts(), false))
    }
}
