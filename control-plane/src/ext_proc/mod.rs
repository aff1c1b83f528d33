//! The `ext_proc` front door: Envoy's built-in `envoy.filters.http.ext_proc`
//! filter streams each HTTP request to this gRPC service
//! (`envoy.service.ext_proc.v3.ExternalProcessor`). Each stream's messages
//! become events of the request's [`Lifecycle`] (the same one the wasm
//! filter drives), and what it says to do becomes ext_proc replies; the
//! routing questions go straight to the [`Engine`]. Operators who cannot
//! load wasm get the same routing.
//!
//! One gRPC stream is one HTTP request. With the processing modes of
//! `envoy/envoy-ext-proc.yaml` (request headers SEND, request body BUFFERED,
//! response headers SKIP unless an inference request asks for them, response
//! body NONE, no trailers) it goes:
//!
//! 1. request headers: the head is checked; info `GET`s are routed at once,
//!    inference requests ask for their body and their response headers;
//! 2. request body (whole): the question, the decision, the edits
//!    (`exchange.rs`);
//! 3. response headers: let go, or in PD mode held until the prefill half
//!    has answered. A prefill that fails before the answer starts ends the
//!    request at once: an `ImmediateResponse` sent unprompted, which Envoy
//!    honours while the request is upstream (it resets the decode request);
//! 4. response body, as much as the lifecycle must see: SSE chunk by chunk
//!    (their end says the stream finished), a JSON body whole for a merge.
//!
//! Envoy ends the gRPC stream after the last message it expects, or when the
//! HTTP request is destroyed (client gone, reset). Whenever it ends, the
//! request's load is released (`Engine::complete`, from `Drop`), so loads
//! return to zero on every path.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ext_proc::v3::{
    external_processor_server::ExternalProcessor, ProcessingRequest, ProcessingResponse,
};
use futures::{Stream, StreamExt};
use sglang_envoy_lifecycle::{
    Destination, EndFacts, Lifecycle, LocalReply, Settings, TicketSource,
};
use sglang_envoy_proto::{AdmissionOutcome, PrefillOutcome};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, warn};

use crate::body_budget::{BodyBudget, BodyHold};
use crate::engine::Engine;

mod duplex;
mod exchange;
mod messages;
#[cfg(test)]
mod tests;

use exchange::{Next, Received};

/// gRPC metadata (set with `initial_metadata` in the Envoy config) carrying
/// the largest request body accepted; larger bodies get 413.
pub const MAX_BODY_METADATA: &str = "x-sglang-max-body-bytes";

/// gRPC metadata (set with `initial_metadata` in the Envoy config) saying
/// what destination its cluster takes: `list` (it reads it with
/// `override_host`) or `one`; `--destination-endpoints` otherwise.
pub const DESTINATION_METADATA: &str = "x-sglang-destination-endpoints";

/// Longest wait for a PD prefill that Envoy is asked to allow
/// (`override_message_timeout`). Must not exceed `max_message_timeout` in
/// `envoy/envoy-ext-proc.yaml`.
pub const MAX_PREFILL_WAIT: Duration = Duration::from_secs(1800);

/// How long the whole body of an inference request may take to arrive
/// once its head has: this, plus a second per MiB it declares (a minimum
/// upload rate). Envoy buffers the body before sending it here, so progress
/// is invisible; a client that announces a body and stalls gets 408 when
/// this runs out, not when Envoy's request timeout does.
pub const BODY_WAIT_BASE: Duration = Duration::from_secs(4);

/// The slowest upload accepted, in bytes per second (see [`BODY_WAIT_BASE`]).
pub const BODY_MIN_RATE: u64 = 1 << 20;

/// Adapts the [`Engine`] to Envoy's `ext_proc` protocol.
pub struct ExtProcService {
    engine: Arc<Engine>,
    tickets: Arc<TicketSource>,
    max_body_bytes: usize,
    budget: Arc<BodyBudget>,
    /// `--destination-endpoints`.
    destination: Destination,
}

impl ExtProcService {
    /// A front door over `engine`, holding at most `budget` of request bodies at once;
    /// bodies over `max_body_bytes` (`--max-payload-size`), or over the
    /// smaller limit Envoy sends in [`MAX_BODY_METADATA`], get 413; the
    /// destination written is `destination` unless Envoy says otherwise in
    /// [`DESTINATION_METADATA`].
    pub fn new(
        engine: Arc<Engine>,
        max_body_bytes: usize,
        budget: Arc<BodyBudget>,
        destination: Destination,
    ) -> Self {
        ExtProcService {
            engine,
            tickets: Arc::new(TicketSource::new(rand::random())),
            max_body_bytes,
            budget,
            destination,
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
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map_or(self.max_body_bytes, |envoy| envoy.min(self.max_body_bytes));
        let said = request
            .metadata()
            .get(DESTINATION_METADATA)
            .and_then(|v| v.to_str().ok());
        let destination = destination_said(said, self.destination);
        let mut exchange = Exchange::new(
            self.engine.clone(),
            self.tickets.next(),
            max_body_bytes,
            self.budget.clone(),
        );
        exchange.destination = destination;
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(exchange.run(request.into_inner(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

type Waiting<T> = Option<Pin<Box<dyn Future<Output = T> + Send>>>;

/// One HTTP request passing through Envoy: the state of one ext_proc stream.
/// Dropping it reports the request's end to the engine.
pub(super) struct Exchange {
    engine: Arc<Engine>,
    /// Bodies Envoy holds for requests through this front door.
    budget: Arc<BodyBudget>,
    /// This request's body in the budget, until its worker answers.
    body_hold: Option<BodyHold>,
    lc: Lifecycle,
    /// The client's headers and body, as the lifecycle reads them.
    request: Received,
    started: Instant,
    /// What Envoy said about the answer so far.
    facts: EndFacts,
    /// The body's declared length (`content-length`), while it is awaited.
    declared_body: Option<usize>,
    /// The decision sent a prefill half to follow.
    follow_prefill: bool,
    /// Which bodies Envoy streams in full duplex, and answer bytes held.
    duplex: duplex::Duplex,
    /// The endpoints the gateway allows this request (its subset hint).
    subset: Option<Vec<String>>,
    /// What the destination holds: one endpoint, or a list.
    destination: Destination,
    /// The client's address, when Envoy sends it (`source.address`).
    client_address: String,
}

impl Exchange {
    fn new(
        engine: Arc<Engine>,
        ticket: u64,
        max_body_bytes: usize,
        budget: Arc<BodyBudget>,
    ) -> Self {
        let settings = Settings {
            max_body_bytes,
            // Envoy sends no body while the answer's head awaits our reply.
            body_while_head_held: false,
            client_key: engine.options().client_key,
        };
        Exchange {
            engine,
            budget,
            body_hold: None,
            lc: Lifecycle::new(ticket, settings),
            request: Received::default(),
            started: Instant::now(),
            facts: EndFacts::default(),
            declared_body: None,
            follow_prefill: false,
            duplex: duplex::Duplex::default(),
            subset: None,
            destination: Destination::One,
            client_address: String::new(),
        }
    }

    /// Answers Envoy's messages until the stream ends; then `self` is
    /// dropped, which releases the request's load.
    async fn run<S>(mut self, mut inbound: S, tx: mpsc::Sender<Result<ProcessingResponse, Status>>)
    where
        S: Stream<Item = Result<ProcessingRequest, Status>> + Unpin,
    {
        let mut prefill: Waiting<PrefillOutcome> = None;
        let mut admission: Waiting<AdmissionOutcome> = None;
        let mut grace: Option<Pin<Box<tokio::time::Sleep>>> = None;
        let mut body_due: Option<Pin<Box<tokio::time::Sleep>>> = None;
        loop {
            let next = tokio::select! {
                message = inbound.next() => match message {
                    Some(Ok(message)) => {
                        let next = self.on_message(message);
                        body_due = self
                            .body_wait()
                            .map(|wait| Box::pin(tokio::time::sleep(wait)));
                        next
                    }
                    // Envoy resets the stream when it is done with it.
                    Some(Err(status)) => {
                        debug!(path = %self.lc.path(), code = ?status.code(), "ext_proc stream reset");
                        break;
                    }
                    None => break,
                },
                outcome = wait_for(&mut prefill) => {
                    prefill = None;
                    grace = None;
                    let step = self.lc.on_prefill(outcome);
                    self.prefill_step(step)
                }
                outcome = wait_for(&mut admission) => {
                    admission = None;
                    let step = self.lc.on_admission(outcome, &self.request, self.attach_body());
                    self.step(step)
                }
                () = sleep_for(&mut body_due) => {
                    body_due = None;
                    let wait = self.body_wait().unwrap_or_default();
                    warn!(path = %self.lc.path(), "request body did not arrive in {wait:?}");
                    let reply = LocalReply::new(
                        408,
                        "timeout",
                        format!("the request body did not arrive within {} s", wait.as_secs()),
                    );
                    self.reply(reply)
                }
                () = sleep_for(&mut grace) => {
                    grace = None;
                    // The prefill is still running: the decode's error goes out.
                    let step = self.lc.on_prefill_unknown();
                    self.prefill_step(step)
                }
            };
            if std::mem::take(&mut self.follow_prefill) {
                // PD: follow the prefill from the decision on.
                let (engine, ticket) = (self.engine.clone(), self.lc.ticket());
                prefill = Some(Box::pin(async move { engine.await_prefill(ticket).await }));
            }
            let reply = match next {
                Next::Reply(reply) => *reply,
                Next::Replies(replies) => {
                    let mut sent = true;
                    for reply in replies {
                        if tx.send(Ok(reply)).await.is_err() {
                            sent = false;
                            break;
                        }
                    }
                    if !sent {
                        break;
                    }
                    continue;
                }
                Next::Nothing => continue,
                Next::AwaitAdmission => {
                    let (engine, ticket) = (self.engine.clone(), self.lc.ticket());
                    admission = Some(Box::pin(
                        async move { engine.await_admission(ticket).await },
                    ));
                    // The wait may outlast Envoy's per-message timeout.
                    let limit = self
                        .engine
                        .options()
                        .admission
                        .as_ref()
                        .map_or(Duration::from_secs(1), |a| {
                            a.longest_wait() + Duration::from_secs(1)
                        });
                    messages::extend_timeout(limit)
                }
                Next::Hold { grace: Some(wait) } => {
                    grace = Some(Box::pin(tokio::time::sleep(wait)));
                    continue;
                }
                // The wait may outlast Envoy's per-message timeout.
                Next::Hold { grace: None } => {
                    messages::extend_timeout(self.engine.options().request_timeout)
                }
            };
            if tx.send(Ok(reply)).await.is_err() {
                break;
            }
        }
    }

    /// While an inference request's body is awaited: how long it may take.
    fn body_wait(&self) -> Option<Duration> {
        if !self.lc.reading_body() {
            return None;
        }
        let declared = self
            .declared_body
            .unwrap_or(self.lc.settings().max_body_bytes) as u64;
        Some(BODY_WAIT_BASE + Duration::from_secs(declared / BODY_MIN_RATE))
    }

    /// What Envoy said about the request, as the lifecycle takes it.
    fn facts(&self) -> EndFacts {
        EndFacts {
            duration_us: self.started.elapsed().as_micros() as u64,
            ..self.facts.clone()
        }
    }
}

impl Drop for Exchange {
    /// Reports the request's end, so its load is released however the
    /// stream ended (response done, client gone, Envoy reset, our error).
    fn drop(&mut self) {
        let facts = self.facts();
        let Some(completion) = self.lc.end(|| facts) else {
            return;
        };
        debug!(
            ticket = completion.ticket,
            status = completion.http_status,
            cancelled = completion.client_cancelled,
            upstream = %completion.upstream_host,
            "request ended"
        );
        self.engine.report(&completion);
    }
}

/// What Envoy's config says its worker cluster takes
/// ([`DESTINATION_METADATA`]), or `default` when it says nothing it means.
fn destination_said(said: Option<&str>, default: Destination) -> Destination {
    match said.map(str::trim) {
        Some("list") => Destination::List,
        Some("one") => Destination::One,
        _ => default,
    }
}

/// Resolves with what is awaited, or never when nothing is.
async fn wait_for<T>(waiting: &mut Waiting<T>) -> T {
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
