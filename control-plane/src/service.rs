//! The gRPC service the Envoy filter calls (see `proto/router.proto`).

use std::pin::Pin;
use std::sync::Arc;

use sglang_envoy_lifecycle::{wire, Question};
use sglang_envoy_proto::router_server::Router;
use sglang_envoy_proto::{
    AdmissionOutcome, AdmissionWait, CompleteRequest, CompleteResponse, PrefillOutcome,
    PrefillWait, RouteRequest, RouteResponse, SessionDown, SessionUp, WorkersRequest,
    WorkersSnapshot,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::engine::Engine;
use crate::session::{FilterSession, ANSWERS_BUFFERED};
use crate::sessions::Sessions;

/// Adapts the [`Engine`] to the filter's gRPC contract.
pub struct RouterService {
    engine: Arc<Engine>,
    /// Where filter sessions register, so loads can settle them.
    sessions: Arc<Sessions>,
}

impl RouterService {
    /// A service over `engine`, registering its sessions in `sessions`.
    pub fn new(engine: Arc<Engine>, sessions: Arc<Sessions>) -> Self {
        RouterService { engine, sessions }
    }
}

/// The answers of one filter session.
type SessionAnswers = Pin<Box<dyn Stream<Item = Result<SessionDown, Status>> + Send>>;

#[tonic::async_trait]
impl Router for RouterService {
    type SessionStream = SessionAnswers;

    async fn session(
        &self,
        request: Request<Streaming<SessionUp>>,
    ) -> Result<Response<SessionAnswers>, Status> {
        // Filters that read batched answers say so; older ones get one
        // answer a message.
        let batches = request
            .metadata()
            .get(sglang_envoy_proto::BATCHES_METADATA)
            .is_some_and(|v| v.as_bytes() == sglang_envoy_proto::BATCHES.as_bytes());
        let (tx, rx) = mpsc::channel(ANSWERS_BUFFERED);
        let registration = self.sessions.open(tx.clone());
        let session = FilterSession::new(self.engine.clone(), registration, batches);
        tokio::spawn(session.run(request.into_inner(), tx));
        let mut response = Response::new(Box::pin(ReceiverStream::new(rx)) as SessionAnswers);
        // Filters may send ends with their next message (`SessionUp.ends`).
        response.metadata_mut().insert(
            sglang_envoy_proto::ENDS_RIDE_METADATA,
            tonic::metadata::MetadataValue::from_static(sglang_envoy_proto::ENDS_RIDE),
        );
        Ok(response)
    }

    async fn route(
        &self,
        request: Request<RouteRequest>,
    ) -> Result<Response<RouteResponse>, Status> {
        // The gRPC edge: the contract's types in and out, the router's own inside.
        let question = Question::from(request.into_inner());
        Ok(Response::new(wire::response_of(
            self.engine.route_owned(question),
        )))
    }

    async fn complete(
        &self,
        request: Request<CompleteRequest>,
    ) -> Result<Response<CompleteResponse>, Status> {
        for c in &request.get_ref().completions {
            self.engine.report(c);
        }
        Ok(Response::new(CompleteResponse {}))
    }

    async fn await_prefill(
        &self,
        request: Request<PrefillWait>,
    ) -> Result<Response<PrefillOutcome>, Status> {
        let ticket = request.get_ref().ticket;
        Ok(Response::new(self.engine.await_prefill(ticket).await))
    }

    async fn await_admission(
        &self,
        request: Request<AdmissionWait>,
    ) -> Result<Response<AdmissionOutcome>, Status> {
        let ticket = request.get_ref().ticket;
        Ok(Response::new(self.engine.await_admission(ticket).await))
    }

    async fn workers(
        &self,
        _request: Request<WorkersRequest>,
    ) -> Result<Response<WorkersSnapshot>, Status> {
        Ok(Response::new(self.engine.snapshot()))
    }
}
