use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use log::{error, warn};
use prost::Message;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};
use sglang_envoy_lifecycle::{random, LocalReply, TicketSource};
use sglang_envoy_proto::{
    session_up::Kind, CompleteRequest, Completion, SessionDown, SessionUp, WorkersRequest,
    WorkersSnapshot, BATCHES, BATCHES_METADATA, ENDS_RIDE, ENDS_RIDE_METADATA, SERVICE_NAME,
};

use crate::body_wait::BodyWaits;
use crate::budget::Budget;
use crate::completions::CompletionQueue;
use crate::config::FilterConfig;
use crate::contexts::{CallOwners, Contexts};
use crate::fallback::Fallback;
use crate::holds::Holds;
use crate::host;
use crate::http::{Request, RequestContext, Shared};
use crate::reach::Reach;
use crate::reply::send_reply_for;
use crate::session::{self, Session, Wait};
use crate::stats::{Counter, LOCAL_FALLBACKS};

/// Completions sent in one `Complete` call.
const REPORT_BATCH: usize = 1024;
const REPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The per-VM root context: holds the configuration, creates one [`Request`]
/// per HTTP stream, keeps the session stream to the control plane open and
/// hands each answer that comes on it to the request that asked.
///
/// Ends that cannot go on the session are reported from here, batched on a
/// timer, rather than from the request's own context because Envoy cancels
/// a context's outstanding calls when the stream is destroyed, which
/// happens right after `on_log`.
pub struct Root {
    /// This context's id, to act as it again after acting for a request.
    context_id: u32,
    /// What every request of this VM shares.
    shared: Shared,
    tickets: TicketSource,
    /// The batch of the report in flight, to requeue if it fails.
    in_flight: Option<(u32, Vec<Completion>)>,
    /// The outstanding `Workers` call, and when the last one went out.
    workers_call: Option<u32>,
    workers_asked_at: Option<std::time::SystemTime>,
    /// Set once this VM made a request context. Envoy's main thread runs a
    /// VM of the plugin too, which never serves a request: it opens no
    /// session, so the control plane sees one per worker thread.
    serving: Cell<bool>,
}

impl Root {
    /// The root context `context_id` of a new VM.
    pub fn new(context_id: u32) -> Self {
        let config = FilterConfig::default();
        Root {
            context_id,
            shared: Shared {
                budget: Budget::new(config.max_buffered_bytes),
                config: Rc::new(config),
                queue: CompletionQueue::default(),
                send_body: Rc::new(Cell::new(false)),
                fallback: Fallback::default(),
                body_waits: BodyWaits::default(),
                session: Session::new(context_id),
                reach_calls: Reach::new("calls to the control plane"),
                reach_session: Reach::new("the control plane session"),
                local_fallbacks: Counter::default(),
                contexts: Contexts::default(),
                call_owners: CallOwners::default(),
                holds: Holds::default(),
            },
            tickets: TicketSource::new(random::u64(host::nanos)),
            in_flight: None,
            workers_call: None,
            workers_asked_at: None,
            serving: Cell::new(false),
        }
    }
}

impl Context for Root {
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, size: usize) {
        if let Some(context) = self.shared.call_owners.disown(token_id) {
            self.act_for(context, |r| {
                r.call_answered(token_id, Some(status_code), size)
            });
            return;
        }
        if self.workers_call == Some(token_id) {
            self.workers_call = None;
            // The worker list's polls only open the calls' gate: refused,
            // they say nothing of the replica a question would reach (one
            // being started refuses them before the others are asked).
            if status_code == 0 {
                let now = self.get_current_time();
                self.shared.call_ended(Some(0), now);
                let bytes = self
                    .get_grpc_call_response_body(0, size)
                    .unwrap_or_default();
                match WorkersSnapshot::decode(bytes.as_slice()) {
                    Ok(s) => {
                        if s.pd {
                            // The control plane sends the prefill half
                            // itself, so it needs every body: send them
                            // from the first question on (no `NeedBody`
                            // round trip).
                            self.shared.send_body.set(true);
                        }
                        self.shared.fallback.update(self.get_current_time(), s)
                    }
                    Err(e) => warn!("unreadable worker list from the control plane: {e}"),
                }
            }
            return;
        }
        match self.in_flight.take() {
            Some((token, batch)) if token == token_id => {
                self.shared
                    .call_ended(Some(status_code), self.get_current_time());
                if status_code != 0 {
                    if !self.shared.reach_calls.is_refused() {
                        warn!(
                            "reporting completions failed (grpc status {status_code}); will retry"
                        );
                    }
                    self.shared.queue.requeue(batch);
                }
            }
            other => self.in_flight = other,
        }
    }

    fn on_http_call_response(&mut self, token_id: u32, _: usize, body_size: usize, _: usize) {
        if let Some(context) = self.shared.call_owners.disown(token_id) {
            self.act_for(context, |r| r.call_answered(token_id, None, body_size));
        }
    }

    fn on_grpc_stream_initial_metadata(&mut self, token_id: u32, entries: u32) {
        // Empty: Envoy's own failure of the stream, whose trailers follow.
        if entries > 0 {
            let now = self.get_current_time();
            let ends_ride = self
                .get_grpc_stream_initial_metadata_value(ENDS_RIDE_METADATA)
                .is_some_and(|v| v == ENDS_RIDE.as_bytes());
            self.shared.session.confirmed(token_id, now, ends_ride);
            self.shared.reach_session.answered(now);
            // A replica answers: the calls refused before came from another
            // (gone, draining or not started), and stop counting, as
            // refusals do while the session is up (`Shared::call_ended`).
            self.shared.reach_calls.answered(now);
        }
    }

    fn on_grpc_stream_message(&mut self, token_id: u32, size: usize) {
        if !self.shared.session.owns(token_id) {
            return;
        }
        self.shared.reach_session.answered(self.get_current_time());
        let bytes = hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, size)
            .ok()
            .flatten()
            .unwrap_or_default();
        let mut down = match SessionDown::decode(bytes.as_slice()) {
            Ok(down) => down,
            Err(e) => {
                warn!("unreadable answer on the control plane session: {e}");
                return;
            }
        };
        // Answers ready together come in one message (`BATCHES_METADATA`),
        // in the order the questions were read.
        let more = std::mem::take(&mut down.more);
        self.session_down(down);
        for down in more {
            self.session_down(down);
        }
    }

    fn on_grpc_stream_close(&mut self, token_id: u32, status_code: u32) {
        let now = self.get_current_time();
        let stranded = self.shared.session.closed(token_id, now);
        if status_code != 0 || !stranded.is_empty() {
            warn!(
                "control plane session ended (grpc status {status_code}, {} questions wait for the next one); {} questions fall back",
                self.shared.session.waiting(),
                stranded.len()
            );
        }
        self.end_waits(stranded);
        // The next tick opens the next stream (due at once): not from
        // here, as Envoy may fail a new stream inside the call that opens
        // it, calling back into the SDK's dispatcher, which is in the
        // middle of this callback and panics (proxy-wasm 0.2.5).
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let raw = self.get_plugin_configuration().unwrap_or_default();
        match FilterConfig::parse(&raw) {
            Ok(config) => {
                let tick = Duration::from_millis(config.report_interval_ms.max(1));
                self.shared.budget = Budget::new(config.max_buffered_bytes);
                self.shared.config = Rc::new(config);
                self.set_tick_period(tick);
                self.shared.session.set_tick(tick);
                self.shared.local_fallbacks.define(LOCAL_FALLBACKS);
                true
            }
            Err(e) => {
                error!("invalid sglang-envoy filter configuration: {e}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        self.keep_session();
        // Acting as the root, which owns the stream.
        self.shared.session.flush(session::send_on);
        // Ends that were riding up a stream that broke.
        for end in self.shared.session.take_unsent_ends() {
            self.shared.queue.push(end);
        }
        self.refresh_workers();
        self.report();
        self.time_out_questions();
        self.time_out_bodies();
        self.time_out_holds();
        session::keep_tick(&self.shared.session, None);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        self.serving.set(true);
        Some(Box::new(RequestContext::open(
            &self.shared,
            context_id,
            self.tickets.next(),
        )))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

impl Root {
    /// One answer of the session: a sync, a prefill's outcome or a
    /// decision.
    fn session_down(&mut self, down: SessionDown) {
        let session = &self.shared.session;
        if down.sync != 0 {
            let synced = SessionUp {
                kind: Some(Kind::Synced(down.sync)),
                ack_end: false,
                ends: Vec::new(),
            };
            session.answer_sync(&synced.encode_to_vec());
        } else if let Some(outcome) = down.prefill {
            if let Some(context) = session.answered(down.ticket, Wait::Prefill) {
                self.act_for(context, |r| r.prefill_answered(Some(Ok(outcome))));
            }
        } else if let Some(context) = session.answered(down.ticket, Wait::Answer) {
            self.act_for(context, |r| r.session_answer(down.route));
        }
    }

    /// Runs `f` on request `context` with host calls made for it, then acts
    /// as the root again. Nothing happens when the request is gone.
    fn act_for(&self, context: u32, f: impl FnOnce(&mut Request)) {
        let Some(request) = self.shared.contexts.get(context) else {
            return;
        };
        if hostcalls::set_effective_context(context).is_ok() {
            match request.try_borrow_mut() {
                Ok(mut request) => f(&mut request),
                Err(_) => error!("request {context} is busy; its answer is dropped"),
            }
        }
        if let Err(e) = hostcalls::set_effective_context(self.context_id) {
            error!("cannot act as the root context again: {e:?}");
        }
    }

    /// Opens the session stream when there is none and the backoff allows.
    fn keep_session(&mut self) {
        let now = self.get_current_time();
        if let Some(token) = self.shared.session.overdue_opening(now) {
            // Its replica does not answer (its address gone, or hung): give
            // it up now, not at its questions' deadline, and try the next.
            self.give_up_stream(token, now);
        }
        if !self.serving.get() || !self.shared.session.due(now) {
            return;
        }
        match self.open_grpc_stream(
            &self.shared.config.control_plane_cluster,
            SERVICE_NAME,
            "Session",
            // It reads answers batched in `SessionDown.more`.
            vec![(BATCHES_METADATA, BATCHES.as_bytes())],
        ) {
            Ok(token) => self.shared.session.opened(token, now),
            Err(status) => {
                warn!("cannot open the control plane session: {status:?}");
                let waits = self.shared.session.open_failed(now);
                self.end_waits(waits);
            }
        }
    }

    /// Questions on the session whose answer is late take the fallback.
    fn time_out_questions(&mut self) {
        if self.shared.session.waiting() == 0 {
            return;
        }
        let now = self.get_current_time();
        let expired = self.shared.session.expired(now);
        // A question went unanswered on a stream that is up: its replica
        // froze (or its address vanished under an open connection). Give
        // the stream up, as an unanswered opening is: the next one may
        // reach another replica. Calls go to the same cluster, so their
        // gate learns it too: until a replica answers, questions take one
        // gate's probes (`reach.rs`), not both gates' in turn.
        if expired.iter().any(|(_, wait)| *wait == Wait::Answer) {
            if let Some(token) = self.shared.session.up_token() {
                self.shared.reach_calls.timed_out(now);
                self.give_up_stream(token, now);
            }
        }
        for (context, wait) in expired {
            let reach = &self.shared.reach_session;
            let was_refused = reach.is_refused();
            if wait != Wait::Prefill {
                reach.timed_out(now);
            }
            // A hung control plane is logged once, when it stops answering.
            if !was_refused {
                warn!("no answer on the control plane session in time for request {context}");
            }
            self.act_for(context, |r| r.wait_over(wait));
        }
    }

    /// Cancels stream `token`, which its control plane does not answer
    /// (Envoy calls nothing back for a cancelled stream), and gives it up
    /// at `now`: its questions wait for the next one or fall back.
    fn give_up_stream(&mut self, token: u32, now: SystemTime) {
        if let Err(status) = hostcalls::cancel_grpc_stream(token) {
            warn!("cannot cancel an unanswering control plane session: {status:?}");
        }
        let waits = self.shared.session.closed(token, now);
        self.end_waits(waits);
    }

    /// Each of these requests' waits on the session is over, unanswered.
    fn end_waits(&self, waits: Vec<(u32, Wait)>) {
        for (context, wait) in waits {
            self.act_for(context, |r| r.wait_over(wait));
        }
    }

    /// Requests held longer than any of their waits allows: their holds
    /// end (the safety net under every wait, `holds.rs`).
    fn time_out_holds(&mut self) {
        if self.shared.holds.is_empty() {
            return;
        }
        for (context, hold) in self.shared.holds.expired(self.get_current_time()) {
            self.act_for(context, |r| r.overdue(hold));
        }
    }

    /// Sends the queued completions (one batch in flight at a time).
    fn report(&mut self) {
        if self.in_flight.is_some() || self.shared.queue.is_empty() {
            return;
        }
        if self.holds_calls() {
            return;
        }
        if !self.shared.reach_calls.allows(self.get_current_time()) {
            return;
        }
        let report = CompleteRequest {
            completions: self.shared.queue.take(REPORT_BATCH),
        };
        match self.dispatch_grpc_call(
            &self.shared.config.control_plane_cluster,
            SERVICE_NAME,
            "Complete",
            vec![],
            Some(&report.encode_to_vec()),
            REPORT_TIMEOUT,
        ) {
            // Kept until the answer comes, to requeue if the report fails.
            Ok(token) => self.in_flight = Some((token, report.completions)),
            Err(status) => {
                warn!("cannot dispatch completion report: {status:?}");
                self.shared.call_ended(None, self.get_current_time());
                self.shared.queue.requeue(report.completions);
            }
        }
    }

    /// Answers 408 for every request whose body stopped arriving, acting
    /// for its HTTP context (which has no timer of its own).
    fn time_out_bodies(&mut self) {
        if self.shared.body_waits.is_empty() {
            return;
        }
        let expired = self.shared.body_waits.expired(self.get_current_time());
        if expired.is_empty() {
            return;
        }
        for context in expired {
            let reply = LocalReply::new(
                408,
                "timeout",
                format!(
                    "the request body stopped arriving (nothing for {} ms)",
                    self.shared.config.body_idle_timeout_ms
                ),
            );
            // Fails harmlessly when the request is already gone.
            if let Err(e) = send_reply_for(context, &reply) {
                warn!("cannot time out request {context}: {e:?}");
            }
        }
        if let Err(e) = proxy_wasm::hostcalls::set_effective_context(self.context_id) {
            error!("cannot act as the root context again: {e:?}");
        }
    }

    /// True while the root's own calls wait for the VM's first stream
    /// (`Session::first_tries`): the ends and the worker list go once it
    /// is up or the tries are over. Not while the session's gate is
    /// closed: an opening that hangs (its questions ran past their
    /// deadline) must not hold the calls back from the replicas that
    /// answer them.
    fn holds_calls(&self) -> bool {
        self.shared.session.first_tries() && !self.shared.reach_session.is_refused()
    }

    /// Asks for the list of healthy workers every `workers_refresh_ms`.
    fn refresh_workers(&mut self) {
        if self.workers_call.is_some() || self.holds_calls() {
            return;
        }
        let now = self.get_current_time();
        let every = Duration::from_millis(self.shared.config.workers_refresh_ms);
        let due = self
            .workers_asked_at
            .is_none_or(|t| now.duration_since(t).unwrap_or_default() >= every);
        if !due {
            return;
        }
        self.workers_asked_at = Some(now);
        match self.dispatch_grpc_call(
            &self.shared.config.control_plane_cluster,
            SERVICE_NAME,
            "Workers",
            vec![],
            Some(&WorkersRequest {}.encode_to_vec()),
            REPORT_TIMEOUT,
        ) {
            Ok(token) => self.workers_call = Some(token),
            Err(status) => warn!("cannot ask for the worker list: {status:?}"),
        }
    }
}
