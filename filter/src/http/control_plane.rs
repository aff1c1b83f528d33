//! What a request asks the control plane, and what the answers become:
//! events of the lifecycle.

use std::time::Duration;

use log::{debug, warn};
use prost::Message;
use proxy_wasm::traits::{Context, HttpContext};
use sglang_envoy_lifecycle::{wire, FollowPrefill, LocalReply, Question, Step, Unrouted};
use sglang_envoy_proto::session_up::Kind;
use sglang_envoy_proto::{
    AdmissionOutcome, AdmissionWait, CompleteRequest, Completion, PrefillOutcome, PrefillWait,
    RouteRequest, RouteResponse, SessionUp, SERVICE_NAME,
};

use super::calls::Call;
use super::{Flow, Request};
use crate::holds::Hold;
use crate::reach::UNAVAILABLE;
use crate::session::Wait;

/// How many replicas may refuse a question before the request is routed
/// without the control plane. More than one: Envoy's round robin may give
/// a call of this VM's made in between the turn of a live replica, and the
/// question's next try the refusing one again.
const MAX_REFUSALS: u8 = 2;

/// The longest a failed answer waits for its report to be taken.
const REPORT_WAIT: Duration = Duration::from_millis(250);

impl Request {
    /// Takes the answer to call `token` that reached the root context
    /// (the call went out while the root acted for this request).
    pub fn call_answered(&mut self, token: u32, grpc_status: Option<u32>, size: usize) {
        if let Some(call) = self.calls.take(token) {
            self.answered(call, grpc_status, size);
        }
    }

    /// The answer to the routing question sent on the session stream;
    /// `None` when none will come (the stream broke, or it came too late).
    pub fn session_answer(&mut self, response: Option<RouteResponse>) {
        self.route_answered(response.map(Ok));
    }

    /// A wait on the session stream is over without its message (the
    /// stream broke, or the deadline passed).
    pub fn wait_over(&mut self, wait: Wait) {
        match wait {
            Wait::Answer => self.session_answer(None),
            Wait::Prefill => self.prefill_answered(None),
        }
    }

    /// The control plane counted the end: the answer's last bytes go on.
    pub fn end_counted(&mut self) {
        self.unhold();
        self.resume_http_response();
    }

    /// Reports the request's end: on the session stream at once, or, while
    /// there is none, in the root context's next batch.
    ///
    /// An end on the session is not waited for: it goes up before the
    /// answer's last bytes leave, and the control plane settles every
    /// session before it shows loads (`control-plane/src/sessions.rs`), so
    /// a client that has its answer never finds it in `/get_loads`. A VM's
    /// first requests end before its session is up (it opens on the next
    /// tick): with `hold`, their ends take a `Complete` call of their own,
    /// and the answer's last bytes wait (held) until it is answered:
    /// `Flow::Wait` then (the caller pauses them).
    pub(super) fn report_end(&mut self, completion: Completion, hold: bool) -> Flow {
        // While the control plane does not answer, its count is not
        // waited for: the end is sent (or queued) and the answer goes on.
        let hold = hold && !self.shared.reach_session.is_refused();
        let Err(completion) = self.shared.session.report_end(self.context_id, completion) else {
            return Flow::Go;
        };
        if hold && self.may_call() {
            let report = CompleteRequest {
                completions: vec![completion.clone()],
            }
            .encode_to_vec();
            if self.call("Complete", &report, REPORT_WAIT, Call::End) {
                self.end_on_call = Some(completion);
                self.hold(Hold::AnswerEnd, REPORT_WAIT);
                return Flow::Wait;
            }
        }
        self.shared.queue.push(completion);
        Flow::Go
    }

    /// True when a unary call may go out now: the control plane has not
    /// stopped taking them lately, or this is the probe (`reach.rs`).
    /// Questions and reports ask first; a prefill or admission wait
    /// follows an answer, so it is always tried.
    fn may_call(&self) -> bool {
        self.shared.reach_calls.allows(self.get_current_time())
    }

    /// Calls `method` of the control plane with `message`; false when it
    /// cannot be sent.
    fn call(&mut self, method: &str, message: &[u8], timeout: Duration, call: Call) -> bool {
        let sent = self.dispatch_grpc_call(
            &self.shared.config.control_plane_cluster,
            SERVICE_NAME,
            method,
            vec![],
            Some(message),
            timeout,
        );
        match sent {
            Ok(token) => {
                self.calls.track(token, call);
                true
            }
            Err(status) => {
                warn!("cannot call {method} on the control plane: {status:?}");
                self.shared.call_ended(None, self.get_current_time());
                false
            }
        }
    }

    /// Sends the routing question; its answer arrives in [`Self::answered`].
    pub(super) fn ask(&mut self, question: Question) -> Flow {
        self.ask_as(question, 0)
    }

    /// Sends the routing question, `refusals` times refused so far.
    fn ask_as(&mut self, question: Question, refusals: u8) -> Flow {
        // The question may be as large as the body: it is gone (moved into
        // the message, dropped with it) before we wait.
        let mut request = RouteRequest::from(question);
        let now = self.get_current_time();
        // While the session's gate is closed (its last stream went
        // unanswered) and no stream is up, a question does not wait on the
        // next one's opening, which probes for itself; it goes as a call.
        let session = &self.shared.session;
        let on_session = session.takes_questions(now)
            && (session.is_up() || !self.shared.reach_session.is_refused())
            && request.body.len() <= self.shared.config.session_question_max_bytes;
        // A control plane that stopped answering is not asked, on the
        // session or with a call, but by its probe. A question a replica
        // refused is asked again whatever the gate says: that refusal
        // closed it, and another replica may well answer.
        let gate = if on_session {
            Some(&self.shared.reach_session)
        } else {
            (refusals == 0).then_some(&self.shared.reach_calls)
        };
        if gate.is_some_and(|gate| !gate.allows(now)) {
            return self.run_no_answer();
        }
        if on_session {
            let ticket = request.ticket;
            // A PD prefill's outcome then comes unasked after the answer.
            request.prefill_follows = true;
            let up = SessionUp {
                kind: Some(Kind::Route(request)),
                ack_end: false,
                ends: Vec::new(),
            };
            let deadline = now + self.route_timeout();
            let session = &self.shared.session;
            // Kept by the session until answered, to send again if the
            // stream breaks first.
            if session.ask(self.context_id, ticket, up.encode_to_vec(), now, deadline) {
                crate::session::keep_tick(session, Some(self.context_id));
                self.hold(Hold::Request, self.route_timeout());
                return Flow::Wait;
            }
            let Some(Kind::Route(r)) = up.kind else {
                return self.run_no_answer();
            };
            request = r;
            request.prefill_follows = false;
        }
        let encoded = request.encode_to_vec();
        let timeout = self.route_timeout();
        let call = Call::Route {
            refusals,
            refused_before: now + timeout / 2,
        };
        if self.call("Route", &encoded, timeout, call) {
            self.hold(Hold::Request, timeout);
            return Flow::Wait;
        }
        self.run_no_answer()
    }

    /// Admission control queued the request: wait (still paused) until it
    /// holds a slot, a little longer than the control plane will.
    pub(super) fn await_admission(&mut self, wait_ms: u64) -> Flow {
        let wait = AdmissionWait {
            ticket: self.lc.ticket(),
        }
        .encode_to_vec();
        let timeout = Duration::from_millis(wait_ms.saturating_add(2_000));
        if self.call("AwaitAdmission", &wait, timeout, Call::Admission) {
            self.hold(Hold::Request, timeout);
            return Flow::Wait;
        }
        self.run_no_answer()
    }

    /// No answer will come: the lifecycle decides (the outage fallback).
    fn run_no_answer(&mut self) -> Flow {
        let step = self.lc.on_no_answer();
        self.run(step)
    }

    /// Follows the prefill half the control plane sent: the request may go
    /// on. When that cannot be asked, the client is answered instead and
    /// the request waits for nothing more (`Flow::Wait`: kept paused).
    pub(super) fn await_prefill(&mut self, follow: FollowPrefill) -> Flow {
        let timeout = Duration::from_millis(self.shared.config.prefill_timeout_ms);
        // Promised on the session (`prefill_follows`): waited for unasked,
        // unless that session is gone since.
        let deadline = self.get_current_time() + timeout;
        let session = &self.shared.session;
        let waits = (follow.outcome_follows
            && session.expect_prefill(self.context_id, self.lc.ticket(), deadline))
            || self.ask_prefill(timeout, Call::Prefill);
        if waits {
            self.prefill_sent();
            return Flow::Go;
        }
        self.reply(LocalReply::unreachable());
        Flow::Wait
    }

    /// Asks for the prefill's outcome once more, giving up after `grace`
    /// (a decode error waits no longer for it). False when it cannot be asked.
    pub(super) fn await_prefill_for(&mut self, grace: Duration) -> bool {
        self.ask_prefill(grace, Call::Grace)
    }

    /// Asks for the prefill's outcome, to come within `timeout`: on the
    /// session when it is up, else with a call (`call`). False when it
    /// cannot be asked.
    fn ask_prefill(&mut self, timeout: Duration, call: Call) -> bool {
        let wait = PrefillWait {
            ticket: self.lc.ticket(),
        };
        if self.shared.session.is_up() {
            let up = SessionUp {
                kind: Some(Kind::Prefill(wait)),
                ack_end: false,
                ends: Vec::new(),
            };
            let deadline = self.get_current_time() + timeout;
            let message = up.encode_to_vec();
            let session = &self.shared.session;
            if session.await_prefill(self.context_id, wait.ticket, &message, deadline) {
                return true;
            }
        }
        self.call("AwaitPrefill", &wait.encode_to_vec(), timeout, call)
    }

    /// The prefill's outcome: `None` when there is none (lost, or the
    /// grace ran out: whether the prefill finished is unknown), an error
    /// when it cannot be read.
    pub fn prefill_answered(&mut self, outcome: Option<Result<PrefillOutcome, LocalReply>>) {
        let step = match outcome {
            Some(Ok(outcome)) => self.lc.on_prefill(outcome),
            Some(Err(reply)) => self.lc.on_prefill(PrefillOutcome {
                http_status: u32::from(reply.status),
                error_type: reply.kind,
                message: reply.message,
                ..Default::default()
            }),
            None => self.lc.on_prefill_unknown(),
        };
        self.prefill_step(step);
    }

    /// Reports an answer that starts with a worker's failure before the
    /// client sees it, so the circuit breakers have counted it before the
    /// client's next request: the answer waits (held) for that, unless
    /// the report cannot be sent.
    pub(super) fn report_failure(&mut self, failure: Completion) -> Flow {
        if !self.may_call() {
            return Flow::Go;
        }
        let report = CompleteRequest {
            completions: vec![failure],
        }
        .encode_to_vec();
        if self.call("Complete", &report, REPORT_WAIT, Call::Outcome) {
            self.hold(Hold::AnswerHead, REPORT_WAIT);
            return Flow::Wait;
        }
        Flow::Go
    }

    /// A call answered: `grpc_status` of a gRPC call (`None` for the HTTP
    /// call of the outage prefill), its answer `size` bytes long.
    pub(super) fn answered(&mut self, call: Call, grpc_status: Option<u32>, size: usize) {
        if grpc_status.is_some() {
            let now = self.get_current_time();
            self.shared.call_ended(grpc_status, now);
        }
        match call {
            Call::LocalPrefill => {
                let outcome = self.local_prefill_outcome(size);
                let step = self.lc.on_prefill(outcome);
                self.prefill_step(step);
            }
            // Counted (or not: the answer goes on either way).
            Call::Outcome => {
                self.unhold();
                self.resume_http_response();
            }
            Call::End => {
                let end = self.end_on_call.take();
                if grpc_status != Some(0) {
                    debug!(
                        "reporting the end of {} failed; it goes in the next batch",
                        self.lc.path()
                    );
                    if let Some(completion) = end {
                        self.shared.queue.push(completion);
                    }
                }
                // Unless the hold ran out first (the answer went on then).
                if self.shared.holds.held(self.context_id) == Some(Hold::AnswerEnd) {
                    self.end_counted();
                }
            }
            Call::Prefill | Call::Grace => {
                let outcome = self.answer::<PrefillOutcome>(grpc_status, size);
                self.prefill_answered(outcome);
            }
            Call::Route {
                refusals,
                refused_before,
            } if grpc_status == Some(UNAVAILABLE)
                && refusals < MAX_REFUSALS
                && self.get_current_time() < refused_before =>
            {
                self.ask_again(refusals + 1)
            }
            Call::Route { .. } => {
                let response = self.answer::<RouteResponse>(grpc_status, size);
                self.route_answered(response);
            }
            Call::Admission => {
                // Whatever follows holds the request again if it must.
                self.unhold();
                let step = match self.answer::<AdmissionOutcome>(grpc_status, size) {
                    Some(Ok(outcome)) => {
                        let attach = self.shared.send_body.get();
                        self.lc.on_admission(outcome, &self.source(), attach)
                    }
                    Some(Err(reply)) => Step::Reply(reply),
                    None => self.lc.on_no_answer(),
                };
                self.run_resuming(step);
            }
        }
    }

    /// A replica refused the question as a call (`refusals` times now):
    /// gone (Envoy ejects it on that failure) or draining. The question is
    /// asked again, of the replica Envoy picks now, before the request is
    /// routed without the control plane. A session's questions need none
    /// of this: the session keeps them, and asks them again on its next
    /// stream.
    fn ask_again(&mut self, refusals: u8) {
        debug!(
            "a control plane refused the question about {}: asking again",
            self.lc.path()
        );
        // Whatever follows holds the request again if it must.
        self.unhold();
        let flow = match self.lc.on_refused(&self.source()) {
            Step::Ask(question) => self.ask_as(*question, refusals),
            step => self.run(step),
        };
        if flow == Flow::Go {
            self.resume_http_request();
        }
    }

    /// The routing question's answer: `None` when there is none (the call
    /// or the stream failed, or it came too late), an error when it cannot
    /// be read.
    fn route_answered(&mut self, response: Option<Result<RouteResponse, LocalReply>>) {
        // Whatever follows holds the request again if it must.
        self.unhold();
        let step = match response {
            Some(Ok(response)) => {
                let answer = wire::answer_of(response);
                if let Err(Unrouted::NeedBody) = answer {
                    // From now on every question of this VM carries it.
                    self.shared.send_body.set(true);
                }
                self.lc.on_answer(answer, &self.source())
            }
            Some(Err(reply)) => Step::Reply(reply),
            None => self.lc.on_no_answer(),
        };
        self.run_resuming(step);
    }

    /// The control plane's answer: `None` when there is none (the call
    /// failed or timed out), an error when it cannot be read.
    fn answer<M: Message + Default>(
        &self,
        grpc_status: Option<u32>,
        size: usize,
    ) -> Option<Result<M, LocalReply>> {
        if grpc_status != Some(0) {
            log::log!(
                self.shared.outage_level(),
                "control plane call for {} ended with grpc status {grpc_status:?}",
                self.lc.path()
            );
            return None;
        }
        let bytes = self
            .get_grpc_call_response_body(0, size)
            .unwrap_or_default();
        Some(M::decode(bytes.as_slice()).map_err(|_| LocalReply::unreadable()))
    }

    /// How long the control plane may take to answer: `route_timeout_ms`,
    /// once more for every 4 MiB of body the question is about (a large
    /// question takes a while to cross and to read; a slow answer to it
    /// is not an outage).
    fn route_timeout(&self) -> Duration {
        let base = self.shared.config.route_timeout_ms;
        let extra = base.saturating_mul(self.lc.body_bytes() as u64) / (4 << 20);
        Duration::from_millis(base.saturating_add(extra))
    }
}
