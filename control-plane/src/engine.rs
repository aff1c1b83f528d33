//! The decision engine: the one place that turns a routing question into a
//! decision, counts load, and releases it. The filter's gRPC service (and
//! later other front doors) are thin adapters over it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sglang_envoy_body::{is_info_path, Route};
use sglang_envoy_proto::{
    route_response, Completion, Decision, Rejection, RouteRequest, RouteResponse,
};
use tracing::debug;

use crate::metrics::Metrics;
use crate::policy::{least_loaded, Policy, RouteInput};
use crate::tickets::Tickets;
use crate::workers::{AddressError, Registry, RegistryError, Worker, WorkerAddress};

/// Why an admin change to the worker set failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerChangeError {
    /// The URL is unusable.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// Duplicate or unknown worker.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// Chooses workers, counts their load, and releases it.
pub struct Engine {
    registry: Arc<Registry>,
    policy: Arc<dyn Policy>,
    tickets: Tickets,
    metrics: Arc<Metrics>,
    max_fallbacks: usize,
    info_turn: AtomicUsize,
}

impl Engine {
    /// An engine over `registry` using `policy`.
    pub fn new(
        registry: Arc<Registry>,
        policy: Arc<dyn Policy>,
        metrics: Arc<Metrics>,
        max_fallbacks: usize,
    ) -> Self {
        Engine {
            registry,
            policy,
            tickets: Tickets::default(),
            metrics,
            max_fallbacks,
            info_turn: AtomicUsize::new(0),
        }
    }

    /// The registry this engine routes over.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The routing policy.
    pub fn policy(&self) -> &Arc<dyn Policy> {
        &self.policy
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Answers one routing question.
    pub fn route(&self, req: &RouteRequest) -> RouteResponse {
        let started = Instant::now();
        let healthy = self.registry.healthy();
        if healthy.is_empty() {
            self.metrics.error("no_healthy_workers");
            return reject(503, "service_unavailable", "no healthy workers available");
        }

        // Model and server info: any healthy worker, no load counted.
        if req.method == "GET" && is_info_path(&req.path) {
            let index = self.info_turn.fetch_add(1, Ordering::Relaxed) % healthy.len();
            return self.decide(&healthy, index, 0);
        }
        let Some(route) = Route::from_path(&req.path) else {
            return reject(404, "not_found", "this route is not served by the router");
        };

        let selection = self.policy.select(
            &healthy,
            &RouteInput {
                text: &req.routing_text,
            },
        );
        let Some(worker) = healthy.get(selection.index) else {
            return reject(503, "service_unavailable", "no worker could be chosen");
        };
        worker.increment_load();
        let ticket = req.ticket;
        if ticket == 0 || !self.tickets.open(ticket, worker.clone()) {
            // No ticket to report the end with, or the end came first.
            worker.decrement_load();
        }
        let seconds = started.elapsed().as_secs_f64();
        self.metrics
            .decided(route_label(route), selection.cache, seconds);
        debug!(
            path = %req.path,
            worker = %worker.url,
            cache = ?selection.cache,
            "routed"
        );
        self.decide(&healthy, selection.index, ticket)
    }

    /// The decision for `healthy[index]`, plus the least loaded other workers
    /// as fallbacks for Envoy to retry on.
    fn decide(&self, healthy: &[Arc<Worker>], index: usize, ticket: u64) -> RouteResponse {
        let mut endpoints = Vec::with_capacity(1 + self.max_fallbacks);
        endpoints.push(healthy[index].endpoint_text.clone());
        let mut taken = vec![index];
        while endpoints.len() <= self.max_fallbacks {
            match least_loaded(healthy, |i| !taken.contains(&i)) {
                Some(i) => {
                    taken.push(i);
                    endpoints.push(healthy[i].endpoint_text.clone());
                }
                None => break,
            }
        }
        RouteResponse {
            outcome: Some(route_response::Outcome::Decision(Decision {
                ticket,
                endpoints,
                worker_url: healthy[index].url.clone(),
                inject: Vec::new(),
            })),
        }
    }

    /// Releases a finished request's load. Returns the worker when Envoy had
    /// to fail over away from it, so the caller can check its health.
    pub fn complete(&self, c: &Completion) -> Option<Arc<Worker>> {
        let worker = self.tickets.close(c.ticket)?;
        worker.decrement_load();
        let failed_over = !c.upstream_host.is_empty() && c.upstream_host != worker.endpoint_text;
        self.metrics
            .finished(c.duration_us as f64 / 1e6, failed_over);
        if c.client_cancelled {
            self.metrics.error("client_cancelled");
        } else if c.http_status == 0 || c.http_status >= 500 {
            self.metrics.error("upstream_error");
        }
        failed_over.then_some(worker)
    }

    /// Registers a worker; the caller checks its health.
    pub async fn add_worker(&self, url: &str) -> Result<Arc<Worker>, WorkerChangeError> {
        let address = WorkerAddress::resolve(url).await?;
        Ok(self.registry.add(address)?)
    }

    /// Unregisters a worker and forgets its cache history. Its requests in
    /// flight finish; their ends are still accounted.
    pub fn remove_worker(&self, url: &str) -> Result<Arc<Worker>, WorkerChangeError> {
        let (normalised, _, _) = WorkerAddress::normalise(url)?;
        let worker = self.registry.remove(&normalised)?;
        self.policy.on_removed(&worker);
        Ok(worker)
    }

    /// Releases requests whose end was never reported.
    pub fn reap(&self, timeout: std::time::Duration) -> usize {
        self.tickets.reap(timeout)
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.tickets.open_count()
    }
}

fn reject(status: u32, kind: &str, message: &str) -> RouteResponse {
    RouteResponse {
        outcome: Some(route_response::Outcome::Rejection(Rejection {
            http_status: status,
            message: message.to_string(),
            error_type: kind.to_string(),
        })),
    }
}

fn route_label(route: Route) -> &'static str {
    match route {
        Route::ChatCompletions => "/v1/chat/completions",
        Route::Completions => "/v1/completions",
        Route::Generate => "/generate",
        Route::Embeddings => "/v1/embeddings",
        Route::Rerank => "/v1/rerank",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::RoundRobin;

    fn engine(n: u16) -> Engine {
        let registry = Arc::new(Registry::default());
        for port in 1..=n {
            let w = registry
                .add(WorkerAddress {
                    url: format!("http://127.0.0.1:{port}"),
                    host: "127.0.0.1".into(),
                    endpoint: format!("127.0.0.1:{port}").parse().unwrap(),
                })
                .unwrap();
            registry.set_healthy(&w, true);
        }
        Engine::new(
            registry,
            Arc::new(RoundRobin::default()),
            Arc::new(Metrics::default()),
            2,
        )
    }

    fn ask(e: &Engine, ticket: u64) -> RouteResponse {
        e.route(&RouteRequest {
            path: "/generate".into(),
            method: "POST".into(),
            routing_text: b"hello".to_vec(),
            ticket,
            ..Default::default()
        })
    }

    fn decision(r: RouteResponse) -> Decision {
        match r.outcome {
            Some(route_response::Outcome::Decision(d)) => d,
            other => panic!("expected a decision, got {other:?}"),
        }
    }

    #[test]
    fn load_counted_at_decision_and_released_at_completion() {
        let e = engine(3);
        let d = decision(ask(&e, 42));
        assert_eq!(d.ticket, 42);
        assert_eq!(d.endpoints.len(), 3, "primary plus two fallbacks");
        let w = e.registry().get(&d.worker_url).unwrap();
        assert_eq!(w.load(), 1);
        assert!(e
            .complete(&Completion {
                ticket: 42,
                http_status: 200,
                upstream_host: d.endpoints[0].clone(),
                ..Default::default()
            })
            .is_none());
        assert_eq!(w.load(), 0);
    }

    #[test]
    fn failover_is_reported_for_health_check() {
        let e = engine(2);
        let d = decision(ask(&e, 5));
        let suspect = e.complete(&Completion {
            ticket: 5,
            http_status: 200,
            upstream_host: d.endpoints[1].clone(),
            ..Default::default()
        });
        assert_eq!(suspect.map(|w| w.url.clone()), Some(d.worker_url));
    }

    #[test]
    fn no_healthy_worker_is_503() {
        let e = engine(0);
        match ask(&e, 1).outcome {
            Some(route_response::Outcome::Rejection(r)) => assert_eq!(r.http_status, 503),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn completion_before_decision_leaves_no_load() {
        let e = engine(1);
        assert!(e
            .complete(&Completion {
                ticket: 9,
                ..Default::default()
            })
            .is_none());
        let d = decision(ask(&e, 9));
        assert_eq!(e.registry().get(&d.worker_url).unwrap().load(), 0);
        assert_eq!(e.in_flight(), 0);
    }
}
