//! A filter VM's session: the long-lived stream on which its routing
//! questions come up and their answers go down, matched by ticket, and on
//! which each request's end comes up the moment it ends.
//!
//! The session remembers the tickets it answered with counted load until
//! their end arrives. When the stream ends (Envoy died, or the filter
//! reopened it), those requests are released at once: nothing else would
//! release them before `--request-timeout-secs`.

use std::collections::HashSet;
use std::sync::Arc;

use futures::FutureExt;
use sglang_envoy_lifecycle::{wire, Question};
use sglang_envoy_proto::session_up::Kind;
use sglang_envoy_proto::{route_response, Completion, SessionDown, SessionUp};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use tracing::{debug, warn};

use crate::engine::Engine;
use crate::sessions::Registration;
use crate::shutdown;

/// Answers not yet taken by Envoy before the session stops reading
/// questions (back-pressure instead of unbounded memory).
pub const ANSWERS_BUFFERED: usize = 1024;

/// Most answers sent in one message (`SessionDown.more`).
pub const MAX_BATCH: usize = 32;

/// One filter's session.
pub struct FilterSession {
    engine: Arc<Engine>,
    /// Tickets answered on this session whose end has not come.
    open: HashSet<u64>,
    /// Its place among the open sessions, told of the filter's `synced`.
    registration: Registration,
    /// The filter reads answers batched in `SessionDown.more`.
    batches: bool,
    /// Answers to the questions read in one go, not sent yet.
    ready: Vec<SessionDown>,
    /// PD tickets among them whose prefill outcome follows unasked.
    outcomes_due: Vec<u64>,
}

impl FilterSession {
    /// A session over `engine`, registered as `registration`; `batches`:
    /// the filter said it reads `SessionDown.more` (`BATCHES_METADATA`).
    pub fn new(engine: Arc<Engine>, registration: Registration, batches: bool) -> Self {
        engine.metrics().session(1);
        FilterSession {
            engine,
            open: HashSet::new(),
            registration,
            batches,
            ready: Vec::new(),
            outcomes_due: Vec::new(),
        }
    }

    /// Reads the filter's messages until the stream ends, sending answers
    /// to `answers`; then releases what is still open.
    ///
    /// When this control plane is going away, the stream ends at once with
    /// `UNAVAILABLE`, after the answers already sent: the filter opens its
    /// next one on another replica (this one no longer takes connections)
    /// and asks its unanswered questions there.
    pub async fn run(
        mut self,
        mut incoming: Streaming<SessionUp>,
        answers: mpsc::Sender<Result<SessionDown, Status>>,
    ) {
        if self.registration.is_draining() {
            let _ = answers.send(Err(shutdown::refusal())).await;
            return;
        }
        // One future for the session's life, polled only when no message
        // is ready: a message waiting costs nothing more than before.
        let drained = self.registration.drained();
        tokio::pin!(drained);
        // The read that ended a batch, when it was the stream's end.
        let mut ended = None;
        loop {
            let message = match ended.take() {
                Some(end) => end,
                None => tokio::select! {
                    biased;
                    message = incoming.message() => message,
                    () = &mut drained => {
                        let _ = answers.send(Err(shutdown::refusal())).await;
                        break;
                    }
                },
            };
            let up = match message {
                Ok(Some(up)) => up,
                Ok(None) => break,
                Err(status) => {
                    debug!("filter session ended: {status}");
                    break;
                }
            };
            // Then every message already read from the connection, so
            // that their answers go down as one message: Envoy's cost is
            // per message (docs/request-cost.md, step 7). Nothing waits
            // for more: a question that has not arrived is not waited for.
            let mut open = self.handle(up, &answers).await;
            while open && self.batches {
                match incoming.message().now_or_never() {
                    Some(Ok(Some(up))) => open = self.handle(up, &answers).await,
                    // The stream's end (or error), taken above once the
                    // batch has gone.
                    Some(end) => {
                        ended = Some(end);
                        break;
                    }
                    None => break,
                }
            }
            if !open || !self.send_ready(&answers).await {
                // Envoy stopped reading answers: the session is over.
                break;
            }
        }
    }

    /// One message from the filter, answered on `answers` if it asks for
    /// an answer. False once nobody reads answers.
    async fn handle(
        &mut self,
        up: SessionUp,
        answers: &mpsc::Sender<Result<SessionDown, Status>>,
    ) -> bool {
        self.engine.metrics().session_message(kind_name(&up));
        // Ends that rode up with this message came before it.
        for c in &up.ends {
            self.end(c);
        }
        if let Some(Kind::Prefill(wait)) = &up.kind {
            self.send_prefill_outcome(wait.ticket, answers);
            return true;
        }
        let Some(down) = self.take(up) else {
            return true;
        };
        if prefill_follows(&down) {
            self.outcomes_due.push(down.ticket);
        }
        self.ready.push(down);
        if !self.batches || self.ready.len() >= MAX_BATCH {
            return self.send_ready(answers).await;
        }
        true
    }

    /// Sends the answers ready, the first carrying the others in `more`,
    /// then starts the waits for the prefill outcomes promised in them.
    /// False once nobody reads answers.
    async fn send_ready(&mut self, answers: &mpsc::Sender<Result<SessionDown, Status>>) -> bool {
        let mut ready = self.ready.drain(..);
        let Some(mut first) = ready.next() else {
            return true;
        };
        first.more = ready.collect();
        self.engine.metrics().session_answers(1 + first.more.len());
        if answers.send(Ok(first)).await.is_err() {
            return false;
        }
        // Each outcome goes after its decision (the filter must know the
        // ticket awaits one before it comes): only now are they sent.
        for ticket in std::mem::take(&mut self.outcomes_due) {
            self.send_prefill_outcome(ticket, answers);
        }
        true
    }

    /// Sends the outcome of `ticket`'s prefill half once it has ended,
    /// without holding up the session's other questions.
    fn send_prefill_outcome(
        &self,
        ticket: u64,
        answers: &mpsc::Sender<Result<SessionDown, Status>>,
    ) {
        let (engine, answers) = (self.engine.clone(), answers.clone());
        tokio::spawn(async move {
            let outcome = engine.await_prefill(ticket).await;
            let down = SessionDown {
                ticket,
                prefill: Some(outcome),
                ..Default::default()
            };
            // Fails only when the session is over: nobody waits.
            let _ = answers.send(Ok(down)).await;
        });
    }

    /// One message from the filter; the answer to send, if it asks.
    fn take(&mut self, up: SessionUp) -> Option<SessionDown> {
        match up.kind? {
            Kind::Route(request) => {
                let ticket = request.ticket;
                let follows = request.prefill_follows;
                let question = Question::from(request);
                let mut response = wire::response_of(self.engine.route_owned(question));
                if let Some(route_response::Outcome::Decision(d)) = &mut response.outcome {
                    // `handle` sends the outcome when the filter asked for it.
                    d.prefill_follows = follows && d.await_prefill;
                }
                if holds_load(&response) {
                    self.open.insert(ticket);
                }
                Some(SessionDown {
                    ticket,
                    route: Some(response),
                    ..Default::default()
                })
            }
            Kind::End(completion) => {
                self.end(&completion);
                up.ack_end.then_some(SessionDown {
                    ticket: completion.ticket,
                    ended: true,
                    ..Default::default()
                })
            }
            // Every end sent before it is counted (read above).
            Kind::Synced(n) => {
                self.registration.synced(n);
                None
            }
            // Taken by `run`, which waits for the prefill in a task.
            Kind::Prefill(_) => None,
        }
    }

    /// A request ended: its load is released (or, `outcome_only` and
    /// `prefilled`, not yet).
    fn end(&mut self, c: &Completion) {
        if !c.outcome_only && !c.prefilled {
            self.open.remove(&c.ticket);
        }
        self.engine.report(c);
    }
}

impl Drop for FilterSession {
    fn drop(&mut self) {
        if self.registration.is_draining() {
            // Their prefill halves run on (releasing them would abort
            // them); the process ends once they have (`main.rs`).
            self.open.clear();
        }
        let released = self
            .open
            .drain()
            .filter(|&t| self.engine.abandon(t))
            .count();
        if released > 0 {
            warn!("a filter session ended with {released} requests open; released them");
        }
        self.engine.metrics().session(-1);
    }
}

/// The `kind` label of `up` in the session message counter.
fn kind_name(up: &SessionUp) -> &'static str {
    match up.kind {
        Some(Kind::Route(_)) => "route",
        Some(Kind::End(_)) => "end",
        Some(Kind::Prefill(_)) => "prefill",
        Some(Kind::Synced(_)) => "synced",
        None if !up.ends.is_empty() => "ends",
        None => "empty",
    }
}

/// Whether `down` is a decision whose prefill outcome the filter was
/// promised unasked.
fn prefill_follows(down: &SessionDown) -> bool {
    matches!(
        down.route.as_ref().and_then(|r| r.outcome.as_ref()),
        Some(route_response::Outcome::Decision(d)) if d.prefill_follows
    )
}

/// Whether the answer counted load the request's end must release (a
/// decision with a ticket, or a place in the admission queue).
fn holds_load(response: &sglang_envoy_proto::RouteResponse) -> bool {
    match &response.outcome {
        Some(route_response::Outcome::Decision(d)) => d.ticket != 0,
        Some(route_response::Outcome::Queued(_)) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use sglang_envoy_core::workers::WorkerSpec;
    use sglang_envoy_proto::RouteRequest;

    use super::*;
    use crate::engine::tests::engine_with;
    use crate::engine::EngineOptions;
    use crate::sessions::Sessions;

    /// An engine with one regular worker.
    fn one_worker() -> Arc<Engine> {
        Arc::new(engine_with(
            EngineOptions::default(),
            &[(1, WorkerSpec::REGULAR, None)],
        ))
    }

    fn session() -> (FilterSession, Arc<Engine>) {
        let engine = one_worker();
        let (s, _answers) = session_on(engine.clone(), false);
        (s, engine)
    }

    type Answers = (
        mpsc::Sender<Result<SessionDown, Status>>,
        mpsc::Receiver<Result<SessionDown, Status>>,
    );

    /// A session on `engine` whose filter reads batches (`batches`) or
    /// not, and the channel its answers go down.
    fn session_on(engine: Arc<Engine>, batches: bool) -> (FilterSession, Answers) {
        let (tx, rx) = mpsc::channel(64);
        let registration = Arc::new(Sessions::default()).open(tx.clone());
        (FilterSession::new(engine, registration, batches), (tx, rx))
    }

    /// [`session_on`] the one-worker engine.
    fn session_to(batches: bool) -> (FilterSession, Answers) {
        session_on(one_worker(), batches)
    }

    fn tickets(down: &SessionDown) -> Vec<u64> {
        std::iter::once(down.ticket)
            .chain(down.more.iter().map(|d| d.ticket))
            .collect()
    }

    #[tokio::test]
    async fn answers_read_together_go_down_in_one_message_in_order() {
        let (mut s, (tx, mut rx)) = session_to(true);
        for t in [3, 1, 2] {
            assert!(s.handle(question(t), &tx).await);
        }
        assert!(rx.try_recv().is_err(), "nothing goes before the batch ends");
        assert!(s.send_ready(&tx).await);
        let down = rx.try_recv().unwrap().unwrap();
        assert_eq!(tickets(&down), [3, 1, 2]);
        assert!(down
            .more
            .iter()
            .all(|d| d.more.is_empty() && d.route.is_some()));
        assert!(rx.try_recv().is_err(), "one message");
        assert!(s.send_ready(&tx).await, "nothing left to send");
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_filter_that_reads_no_batches_gets_each_answer_alone_at_once() {
        let (mut s, (tx, mut rx)) = session_to(false);
        for t in [1, 2] {
            assert!(s.handle(question(t), &tx).await);
            let down = rx.try_recv().unwrap().unwrap();
            assert_eq!(tickets(&down), [t]);
        }
    }

    #[tokio::test]
    async fn a_batch_goes_once_it_holds_max_batch_answers() {
        let (mut s, (tx, mut rx)) = session_to(true);
        for t in 0..MAX_BATCH as u64 {
            assert!(rx.try_recv().is_err());
            assert!(s.handle(question(t), &tx).await);
        }
        let down = rx.try_recv().unwrap().unwrap();
        assert_eq!(tickets(&down), (0..MAX_BATCH as u64).collect::<Vec<_>>());
    }

    fn question(ticket: u64) -> SessionUp {
        SessionUp {
            kind: Some(Kind::Route(RouteRequest {
                path: "/generate".into(),
                method: "POST".into(),
                ticket,
                ..Default::default()
            })),
            ack_end: false,
            ends: Vec::new(),
        }
    }

    fn end(ticket: u64, ack_end: bool) -> SessionUp {
        SessionUp {
            kind: Some(Kind::End(Completion {
                ticket,
                http_status: 200,
                ..Default::default()
            })),
            ack_end,
            ends: Vec::new(),
        }
    }

    fn load(engine: &Engine) -> usize {
        engine.registry().all().iter().map(|w| w.load()).sum()
    }

    #[tokio::test]
    async fn answers_carry_their_ticket_and_an_end_is_acknowledged_when_asked() {
        let (mut s, engine) = session();
        let down = s.take(question(7)).unwrap();
        assert_eq!(down.ticket, 7);
        assert!(!down.ended && holds_load(down.route.as_ref().unwrap()));
        assert_eq!(load(&engine), 1);
        assert_eq!(s.take(end(7, false)), None, "no acknowledgement asked");
        assert_eq!(load(&engine), 0);
        s.take(question(8));
        let ack = s.take(end(8, true)).unwrap();
        assert!(ack.ended && ack.route.is_none());
        assert_eq!(ack.ticket, 8);
    }

    #[tokio::test]
    async fn a_synced_answers_the_settle_that_asked_and_nothing_goes_down() {
        let engine = one_worker();
        let sessions = Arc::new(Sessions::default());
        let (answers, mut filter) = tokio::sync::mpsc::channel(4);
        let mut s = FilterSession::new(engine, sessions.open(answers), false);
        let settling = tokio::spawn({
            let sessions = sessions.clone();
            async move { sessions.settle(std::time::Duration::from_secs(5)).await }
        });
        let sync = filter.recv().await.unwrap().unwrap().sync;
        assert_ne!(sync, 0);
        let synced = SessionUp {
            kind: Some(Kind::Synced(sync)),
            ack_end: false,
            ends: Vec::new(),
        };
        assert_eq!(s.take(synced), None);
        assert_eq!(settling.await.unwrap(), 0, "every session answered");
    }

    /// A PD routing question with `ticket`, promised its prefill's outcome
    /// unasked when `prefill_follows`.
    fn pd_up(ticket: u64, prefill_follows: bool) -> SessionUp {
        SessionUp {
            kind: Some(Kind::Route(RouteRequest {
                path: "/generate".into(),
                method: "POST".into(),
                routing_text: b"hello".to_vec(),
                body: br#"{"text":"hello"}"#.to_vec(),
                ticket,
                prefill_follows,
                ..Default::default()
            })),
            ack_end: false,
            ends: Vec::new(),
        }
    }

    /// A PD question asked on the session with `prefill_follows` (of the
    /// `pd` engine): its decision and what comes down after it.
    async fn pd_question(prefill_follows: bool) -> (SessionDown, Filter) {
        let engine = Arc::new(crate::engine::tests::pd_engine());
        let (mut s, (answers, mut filter)) = session_on(engine, false);
        assert!(s.handle(pd_up(2, prefill_follows), &answers).await);
        let down = filter.try_recv().expect("the decision went").unwrap();
        (
            down,
            Filter {
                answers: filter,
                _session: s,
                _sender: answers,
            },
        )
    }

    /// The filter's end of a session, which it keeps open.
    struct Filter {
        answers: mpsc::Receiver<Result<SessionDown, Status>>,
        _session: FilterSession,
        _sender: mpsc::Sender<Result<SessionDown, Status>>,
    }

    fn decision_of(down: &SessionDown) -> &sglang_envoy_proto::Decision {
        match down.route.as_ref().and_then(|r| r.outcome.as_ref()) {
            Some(route_response::Outcome::Decision(d)) => d,
            other => panic!("expected a decision, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_prefill_outcome_asked_for_with_the_question_comes_unasked_after_its_decision() {
        let (down, mut filter) = pd_question(true).await;
        let d = decision_of(&down);
        assert!(d.await_prefill && d.prefill_follows);
        // The prefill "server" is a closed port: it fails fast.
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), filter.answers.recv())
            .await
            .expect("the outcome comes without a SessionUp.prefill")
            .unwrap()
            .unwrap();
        assert_eq!(next.ticket, 2);
        let outcome = next.prefill.expect("a prefill outcome");
        assert_eq!((outcome.ok, outcome.http_status), (false, 502));
    }

    #[tokio::test]
    async fn batched_pd_decisions_go_before_their_outcomes() {
        let engine = Arc::new(crate::engine::tests::pd_engine());
        let (mut s, (tx, mut rx)) = session_on(engine, true);
        for ticket in [2, 3] {
            assert!(s.handle(pd_up(ticket, true), &tx).await);
        }
        // The prefill "server" is a closed port: an outcome would come at
        // once if its wait had started before its decision went.
        let early = tokio::time::timeout(std::time::Duration::from_millis(300), rx.recv()).await;
        assert!(early.is_err(), "nothing before the batch: {early:?}");
        assert!(s.send_ready(&tx).await);
        let down = rx.recv().await.unwrap().unwrap();
        assert_eq!(tickets(&down), [2, 3]);
        assert!(std::iter::once(&down)
            .chain(&down.more)
            .all(|d| decision_of(d).prefill_follows));
        let mut outcomes = Vec::new();
        for _ in 0..2 {
            let next = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
                .await
                .expect("the outcomes come")
                .unwrap()
                .unwrap();
            assert!(next.prefill.is_some() && next.route.is_none());
            outcomes.push(next.ticket);
        }
        outcomes.sort();
        assert_eq!(outcomes, [2, 3]);
    }

    #[tokio::test]
    async fn without_prefill_follows_the_outcome_waits_to_be_asked() {
        let (down, mut filter) = pd_question(false).await;
        let d = decision_of(&down);
        assert!(d.await_prefill && !d.prefill_follows);
        let next =
            tokio::time::timeout(std::time::Duration::from_millis(500), filter.answers.recv())
                .await;
        assert!(next.is_err(), "nothing unasked: {next:?}");
    }

    #[tokio::test]
    async fn an_ended_session_releases_what_it_answered_and_nothing_else() {
        let (mut s, engine) = session();
        s.take(question(1));
        s.take(question(2));
        s.take(end(1, false));
        // Answered on another session (or by a call): not this one's.
        let other = Question::from(RouteRequest {
            path: "/generate".into(),
            method: "POST".into(),
            ticket: 3,
            ..Default::default()
        });
        assert!(engine.route(&other).is_ok());
        assert_eq!(load(&engine), 2);
        drop(s);
        assert_eq!(load(&engine), 1, "ticket 2 released, ticket 3 kept");
        assert_eq!(engine.in_flight(), 1);
    }
}
