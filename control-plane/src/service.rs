//! The gRPC service the Envoy filter calls (see `proto/router.proto`).

use std::sync::Arc;

use sglang_envoy_lifecycle::{wire, Question};
use sglang_envoy_proto::router_server::Router;
use sglang_envoy_proto::{
    AdmissionOutcome, AdmissionWait, CompleteRequest, CompleteResponse, PrefillOutcome,
    PrefillWait, RouteRequest, RouteResponse, WorkersRequest, WorkersSnapshot,
};
use tonic::{Request, Response, Status};

use crate::engine::Engine;
use crate::workers::HealthChecker;

/// Adapts the [`Engine`] to the filter's gRPC contract.
pub struct RouterService {
    engine: Arc<Engine>,
    health: Arc<HealthChecker>,
}

impl RouterService {
    /// A service over `engine`; `health` checks workers Envoy failed over from.
    pub fn new(engine: Arc<Engine>, health: Arc<HealthChecker>) -> Self {
        RouterService { engine, health }
    }
}

#[tonic::async_trait]
impl Router for RouterService {
    async fn route(
        &self,
        request: Request<RouteRequest>,
    ) -> Result<Response<RouteResponse>, Status> {
        // The gRPC edge: the contract's types in and out, the router's own inside.
        let question = Question::from(request.into_inner());
        Ok(Response::new(wire::response_of(
            self.engine.route(&question),
        )))
    }

    async fn complete(
        &self,
        request: Request<CompleteRequest>,
    ) -> Result<Response<CompleteResponse>, Status> {
        for c in &request.get_ref().completions {
            if c.outcome_only {
                self.engine.record_outcome(c);
                continue;
            }
            if let Some(worker) = self.engine.complete(c) {
                let health = self.health.clone();
                tokio::spawn(async move { health.suspect(&worker).await });
            }
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
