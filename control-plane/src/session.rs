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

use sglang_envoy_lifecycle::{wire, Question};
use sglang_envoy_proto::session_up::Kind;
use sglang_envoy_proto::{route_response, Completion, SessionDown, SessionUp};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use tracing::{debug, warn};

use crate::engine::Engine;
use crate::sessions::Registration;

/// Answers not yet taken by Envoy before the session stops reading
/// questions (back-pressure instead of unbounded memory).
pub const ANSWERS_BUFFERED: usize = 1024;

/// One filter's session.
pub struct FilterSession {
    engine: Arc<Engine>,
    /// Tickets answered on this session whose end has not come.
    open: HashSet<u64>,
    /// Its place among the open sessions, told of the filter's `synced`.
    registration: Registration,
}

impl FilterSession {
    /// A session over `engine`, registered as `registration`.
    pub fn new(engine: Arc<Engine>, registration: Registration) -> Self {
        engine.metrics().session(1);
        FilterSession {
            engine,
            open: HashSet::new(),
            registration,
        }
    }

    /// Reads the filter's messages until the stream ends, sending answers
    /// to `answers`; then releases what is still open.
    pub async fn run(
        mut self,
        mut incoming: Streaming<SessionUp>,
        answers: mpsc::Sender<Result<SessionDown, Status>>,
    ) {
        loop {
            let up = match incoming.message().await {
                Ok(Some(up)) => up,
                Ok(None) => break,
                Err(status) => {
                    debug!("filter session ended: {status}");
                    break;
                }
            };
            if let Some(Kind::Prefill(wait)) = &up.kind {
                // Answered when the prefill ends, without holding up the
                // session's other questions.
                let (engine, answers, ticket) = (self.engine.clone(), answers.clone(), wait.ticket);
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
                continue;
            }
            let Some(down) = self.take(up) else {
                continue;
            };
            if answers.send(Ok(down)).await.is_err() {
                // Envoy stopped reading answers: the session is over.
                break;
            }
        }
    }

    /// One message from the filter; the answer to send, if it asks.
    fn take(&mut self, up: SessionUp) -> Option<SessionDown> {
        match up.kind? {
            Kind::Route(request) => {
                let ticket = request.ticket;
                let question = Question::from(request);
                let response = wire::response_of(self.engine.route(&question));
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

    /// A request ended: its load is released.
    fn end(&mut self, c: &Completion) {
        if !c.outcome_only {
            self.open.remove(&c.ticket);
        }
        self.engine.report(c);
    }
}

impl Drop for FilterSession {
    fn drop(&mut self) {
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

    fn session() -> (FilterSession, Arc<Engine>) {
        let engine = Arc::new(engine_with(
            EngineOptions::default(),
            &[(1, WorkerSpec::REGULAR, None)],
        ));
        let (answers, _) = tokio::sync::mpsc::channel(1);
        let registration = Arc::new(Sessions::default()).open(answers);
        (FilterSession::new(engine.clone(), registration), engine)
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
        let engine = Arc::new(engine_with(
            EngineOptions::default(),
            &[(1, WorkerSpec::REGULAR, None)],
        ));
        let sessions = Arc::new(Sessions::default());
        let (answers, mut filter) = tokio::sync::mpsc::channel(4);
        let mut s = FilterSession::new(engine, sessions.open(answers));
        let settling = tokio::spawn({
            let sessions = sessions.clone();
            async move { sessions.settle(std::time::Duration::from_secs(5)).await }
        });
        let sync = filter.recv().await.unwrap().unwrap().sync;
        assert_ne!(sync, 0);
        let synced = SessionUp {
            kind: Some(Kind::Synced(sync)),
            ack_end: false,
        };
        assert_eq!(s.take(synced), None);
        assert_eq!(settling.await.unwrap(), 0, "every session answered");
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
