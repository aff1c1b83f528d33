//! The decision engine: the one place that turns a routing question into a
//! decision, counts load, and releases it. The filter's gRPC service (and
//! later other front doors) are thin adapters over it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sglang_envoy_body::{is_info_path, RequestBody, Route, WireProfile};
use sglang_envoy_proto::{
    route_response, AdmissionOutcome, BodyField, Completion, Decision, NeedBody, PrefillEndpoint,
    PrefillOutcome, Rejection, RouteRequest, RouteResponse, WorkersSnapshot,
};
use tracing::debug;

use crate::admission::{AdmissionOptions, Gate};
use crate::metrics::Metrics;
use crate::pd::{self, PrefillDispatcher, PrefillJob, RidSource};
use crate::policy::{Policy, RouteInput};
use crate::retry::{self, RetryOptions};
use crate::routing_key::RoutingKey;
use crate::tickets::{Held, Tickets};
use crate::workers::{
    AddressError, AddressPolicy, Registry, RegistryError, Role, Worker, WorkerAddress, WorkerId,
    WorkerSpec,
};

/// Why an admin change to the worker set failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerChangeError {
    /// The URL is unusable.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// Duplicate or unknown worker.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A worker of a kind this router's mode does not use.
    #[error("{0}")]
    WrongMode(String),
    /// `--dp-aware` needs the worker's server info (`dp_size`), and it
    /// could not be read.
    #[error("cannot read dp_size of {0}: {1}")]
    DpSize(String, String),
}

impl WorkerChangeError {
    /// The worker cannot be reached yet (its host name does not resolve, or
    /// it does not tell its `dp_size`): trying again later may succeed.
    pub fn is_not_ready(&self) -> bool {
        matches!(
            self,
            WorkerChangeError::Address(AddressError::Resolve(..)) | WorkerChangeError::DpSize(..)
        )
    }
}

/// The policies of each role.
pub struct Policies {
    /// Regular mode.
    pub regular: Arc<dyn Policy>,
    /// PD mode, choosing the prefill worker.
    pub prefill: Arc<dyn Policy>,
    /// PD mode, choosing the decode worker.
    pub decode: Arc<dyn Policy>,
}

impl Policies {
    /// One policy for every role.
    pub fn same(policy: Arc<dyn Policy>) -> Self {
        Policies {
            regular: policy.clone(),
            prefill: policy.clone(),
            decode: policy,
        }
    }

    /// The policy for `role`.
    pub fn of(&self, role: Role) -> &Arc<dyn Policy> {
        match role {
            Role::Regular => &self.regular,
            Role::Prefill => &self.prefill,
            Role::Decode => &self.decode,
        }
    }

    /// Each distinct policy once, with the role it serves.
    pub fn each(&self) -> Vec<(Role, Arc<dyn Policy>)> {
        let mut out: Vec<(Role, Arc<dyn Policy>)> = Vec::new();
        for role in [Role::Regular, Role::Prefill, Role::Decode] {
            let p = self.of(role);
            if !out.iter().any(|(_, q)| Arc::ptr_eq(p, q)) {
                out.push((role, p.clone()));
            }
        }
        out
    }
}

/// How the engine routes.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// How failed attempts are retried (and how many servers to offer).
    pub retry: RetryOptions,
    /// Prefill/decode disaggregation.
    pub pd: bool,
    /// Route to DP ranks and read `dp_size` from workers as they are added.
    pub dp_aware: bool,
    /// Longest a prefill request may take.
    pub request_timeout: Duration,
    /// Which addresses may be workers.
    pub addresses: AddressPolicy,
    /// Admission control (`--max-concurrent-requests`); `None`: off.
    pub admission: Option<AdmissionOptions>,
    /// The control plane's one client for workers (TLS settings of the
    /// flags, see [`crate::workers::worker_client`]): the PD prefill halves
    /// and `/server_info` go through it.
    pub worker_client: reqwest::Client,
    /// `--wire-profile`: the field dialect of every worker; `None` (auto):
    /// each worker's own, from the version it reports (see
    /// [`pd::wire_profile`]).
    pub wire_profile: Option<WireProfile>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            retry: RetryOptions::default(),
            pd: false,
            dp_aware: false,
            request_timeout: Duration::from_secs(1800),
            addresses: AddressPolicy::default(),
            admission: None,
            worker_client: reqwest::Client::new(),
            wire_profile: None,
        }
    }
}

/// Chooses workers, counts their load, and releases it.
pub struct Engine {
    registry: Arc<Registry>,
    policies: Policies,
    tickets: Tickets,
    metrics: Arc<Metrics>,
    options: EngineOptions,
    prefill: PrefillDispatcher,
    rids: RidSource,
    info_turn: AtomicUsize,
    gate: Option<Gate>,
}

impl Engine {
    /// An engine over `registry` using `policies`.
    pub fn new(
        registry: Arc<Registry>,
        policies: Policies,
        metrics: Arc<Metrics>,
        options: EngineOptions,
    ) -> Result<Self, reqwest::Error> {
        let gate = options.admission.map(Gate::new);
        Ok(Engine {
            policies,
            tickets: Tickets::default(),
            prefill: PrefillDispatcher::new(
                options.worker_client.clone(),
                options.request_timeout,
                metrics.clone(),
                registry.clone(),
            ),
            registry,
            metrics,
            rids: RidSource::default(),
            options,
            info_turn: AtomicUsize::new(0),
            gate,
        })
    }

    /// The registry this engine routes over.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The routing policies.
    pub fn policies(&self) -> &Policies {
        &self.policies
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// How this engine routes.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The role that serves clients' requests through Envoy.
    fn serving_role(&self) -> Role {
        if self.options.pd {
            Role::Decode
        } else {
            Role::Regular
        }
    }

    /// Answers one routing question. With admission control, an inference
    /// request over the limit is queued (or refused) first, and a slot that
    /// does not end in a decision is freed at once.
    pub fn route(&self, req: &RouteRequest) -> RouteResponse {
        let Some(gate) = self
            .gate
            .as_ref()
            .filter(|_| req.ticket != 0 && Route::from_path(&req.path).is_some())
        else {
            return self.decide_route(req);
        };
        if let Some(answer) = gate.check(req.ticket) {
            if let Some(route_response::Outcome::Rejection(_)) = &answer.outcome {
                self.metrics.error("queue_full");
            }
            return answer;
        }
        let answer = self.decide_route(req);
        if let Some(route_response::Outcome::Rejection(_)) = &answer.outcome {
            gate.release(req.ticket);
        }
        answer
    }

    /// Waits until a request `route` queued may be routed (admission control).
    pub async fn await_admission(&self, ticket: u64) -> AdmissionOutcome {
        let Some(gate) = &self.gate else {
            return AdmissionOutcome {
                admitted: true,
                rejection: None,
            };
        };
        let outcome = gate.wait(ticket).await;
        if outcome
            .rejection
            .as_ref()
            .is_some_and(|r| r.http_status == 408)
        {
            self.metrics.error("queue_timeout");
        }
        outcome
    }

    /// Requests holding an admission slot and waiting for one.
    pub fn admission_counts(&self) -> Option<(usize, usize)> {
        self.gate.as_ref().map(Gate::counts)
    }

    /// The routing decision proper.
    fn decide_route(&self, req: &RouteRequest) -> RouteResponse {
        let started = Instant::now();
        let serving = self.registry.available(self.serving_role());

        // Model and server info: any healthy worker, no load counted.
        if req.method == "GET" && is_info_path(&req.path) {
            if serving.is_empty() {
                return self.no_workers(self.serving_role());
            }
            let index = self.info_turn.fetch_add(1, Ordering::Relaxed) % serving.len();
            let plan = retry::plan(&serving, index, &self.options.retry);
            return self.decide(&plan, 0, Vec::new(), false);
        }
        let Some(route) = Route::from_path(&req.path) else {
            return reject(404, "not_found", "this route is not served by the router");
        };
        if self.options.pd {
            return self.route_pd(req, route, &serving, started);
        }
        if serving.is_empty() {
            return self.no_workers(Role::Regular);
        }

        let input = route_input(req);
        let selection = self.policies.regular.select(&serving, &input);
        let Some(worker) = serving.get(selection.index) else {
            return reject(503, "service_unavailable", "no worker could be chosen");
        };
        let plan = retry::plan(&serving, selection.index, &self.options.retry);
        self.count(&plan, req.ticket, selection.work, input.routing_key);
        self.metrics
            .decided(route.path(), selection.cache, elapsed(started));
        debug!(path = %req.path, worker = %worker.url, cache = ?selection.cache, "routed");
        let inject = fields(pd::dp_fields(worker));
        self.decide(&plan, req.ticket, inject, req.stream)
    }

    /// PD mode: chooses a prefill and a decode unit, starts the prefill
    /// request, and sends the decode half back through Envoy.
    fn route_pd(
        &self,
        req: &RouteRequest,
        route: Route,
        decodes: &[Arc<Worker>],
        started: Instant,
    ) -> RouteResponse {
        if req.body.is_empty() {
            // The filter sends bodies only once asked; from then on it always does.
            return RouteResponse {
                outcome: Some(route_response::Outcome::NeedBody(NeedBody {})),
            };
        }
        let body = match RequestBody::parse(&req.body) {
            Ok(b) => b,
            Err(e) => return reject(400, "invalid_request_error", &e.to_string()),
        };
        let prefills = self.registry.available(Role::Prefill);
        if prefills.is_empty() {
            return self.no_workers(Role::Prefill);
        }
        if decodes.is_empty() {
            return self.no_workers(Role::Decode);
        }
        let input = route_input(req);
        let p = self.policies.prefill.select(&prefills, &input);
        let d = self.policies.decode.select(decodes, &input);
        let (Some(prefill), Some(decode)) = (prefills.get(p.index), decodes.get(d.index)) else {
            return reject(503, "service_unavailable", "no worker could be chosen");
        };
        let pd_fields = pd::pd_fields(route, &body, prefill, decode, &self.rids);
        let prefill_body = match body.with_fields(&pd::as_pairs(&pd_fields.prefill)) {
            Ok(b) => b,
            Err(e) => return reject(400, "invalid_request_error", &e.to_string()),
        };
        let want_logprobs = pd::wants_input_logprobs(route, &body);
        let plan = retry::plan(decodes, d.index, &self.options.retry);
        self.count(&plan, req.ticket, d.work, input.routing_key);
        self.prefill.dispatch(
            req.ticket,
            PrefillJob {
                worker: prefill.clone(),
                path: req.path.clone(),
                headers: req
                    .headers
                    .iter()
                    .map(|h| (h.name.clone(), h.value.clone()))
                    .collect(),
                body: prefill_body,
                want_logprobs,
                work: p.work,
                routing_key: input.routing_key,
            },
        );
        self.metrics
            .decided(route.path(), p.cache, elapsed(started));
        debug!(path = %req.path, prefill = %prefill.url, decode = %decode.url, "routed PD pair");
        let mut response = self.decide(&plan, req.ticket, fields(pd_fields.decode), req.stream);
        if let Some(route_response::Outcome::Decision(decision)) = response.outcome.as_mut() {
            decision.await_prefill = true;
            decision.merge_input_logprobs = want_logprobs;
        }
        response
    }

    /// Counts a request (its estimated `work`, its routing key) on the first
    /// unit of `plan` until `ticket` is reported finished.
    fn count(&self, plan: &[Arc<Worker>], ticket: u64, work: u64, key: Option<RoutingKey>) {
        let Some(worker) = plan.first() else {
            return;
        };
        let held = Held::start(worker.clone(), work, key).with_plan(plan.to_vec());
        if ticket == 0 {
            // No ticket to report the end with.
            held.release();
        } else {
            // Released at once if the end came first.
            self.tickets.open(ticket, held);
        }
    }

    fn no_workers(&self, role: Role) -> RouteResponse {
        self.metrics.error("no_healthy_workers");
        let what = match role {
            Role::Regular => "workers",
            Role::Prefill => "prefill workers",
            Role::Decode => "decode workers",
        };
        reject(
            503,
            "service_unavailable",
            &format!("no healthy {what} available (each is unhealthy or its circuit is open)"),
        )
    }

    /// The decision to try the units of `plan` in order (`retry::plan`: the
    /// chosen unit, then the ones Envoy retries on).
    fn decide(
        &self,
        plan: &[Arc<Worker>],
        ticket: u64,
        inject: Vec<BodyField>,
        stream: bool,
    ) -> RouteResponse {
        let Some(first) = plan.first() else {
            return reject(503, "service_unavailable", "no worker could be chosen");
        };
        RouteResponse {
            outcome: Some(route_response::Outcome::Decision(Decision {
                ticket,
                endpoints: plan.iter().map(|w| w.endpoint_text.clone()).collect(),
                worker_url: first.url.clone(),
                inject,
                await_prefill: false,
                merge_input_logprobs: false,
                request_headers: retry::request_headers(plan, stream, &self.options.retry),
            })),
        }
    }

    /// The healthy servers, for the filter's outage fallback.
    pub fn snapshot(&self) -> WorkersSnapshot {
        let endpoints = |role: Role| -> Vec<Arc<Worker>> {
            let mut seen = std::collections::HashSet::new();
            self.registry
                .available(role)
                .iter()
                .filter(|w| seen.insert(w.endpoint))
                .cloned()
                .collect()
        };
        WorkersSnapshot {
            pd: self.options.pd,
            serving: endpoints(self.serving_role())
                .iter()
                .map(|w| w.endpoint_text.clone())
                .collect(),
            prefill: endpoints(Role::Prefill)
                .iter()
                .map(|w| PrefillEndpoint {
                    endpoint: w.endpoint_text.clone(),
                    host: w.host.clone(),
                    bootstrap_port: w.spec.bootstrap_port.map_or(0, u32::from),
                })
                .collect(),
            wire_profiles: [self.serving_role(), Role::Prefill]
                .into_iter()
                .flat_map(endpoints)
                .map(|w| (w.endpoint_text.clone(), pd::wire_code(w.facts.wire)))
                .collect(),
        }
    }

    /// Waits for the prefill half of `ticket`.
    pub async fn await_prefill(&self, ticket: u64) -> PrefillOutcome {
        self.prefill.wait(ticket).await
    }

    /// Records what a request's attempts say about their workers as soon as
    /// its answer starts with a failure, before the client sees it (and
    /// sends its next request). Its end, reported later, records nothing
    /// more.
    pub fn record_outcome(&self, c: &Completion) {
        let Some(plan) = self.tickets.take_plan(c.ticket) else {
            return;
        };
        for (tried, ok) in retry::outcomes(&plan, c) {
            self.registry.record_outcome(&tried, ok);
        }
    }

    /// Releases a finished request's load. Returns the worker when Envoy had
    /// to fail over away from it, so the caller can check its health.
    pub fn complete(&self, c: &Completion) -> Option<Arc<Worker>> {
        if let Some(gate) = &self.gate {
            gate.release(c.ticket);
        }
        if self.options.pd {
            self.prefill.finish(c.ticket);
        }
        let held = self.tickets.close(c.ticket)?;
        held.release();
        for (tried, ok) in retry::outcomes(&held.plan, c) {
            self.registry.record_outcome(&tried, ok);
        }
        let worker = held.worker;
        let failed_over = !c.upstream_host.is_empty() && c.upstream_host != worker.endpoint_text;
        self.metrics.finished(
            c.duration_us as f64 / 1e6,
            failed_over,
            c.attempts.saturating_sub(1),
        );
        if c.client_cancelled {
            self.metrics.error("client_cancelled");
        } else if c.http_status == 0 || c.http_status >= 500 {
            self.metrics.error("upstream_error");
        }
        failed_over.then_some(worker)
    }

    /// What can be told of a worker without calling anything: that this
    /// router's mode takes its role and that its URL is well formed.
    /// Returns the normalised URL.
    pub fn check_worker(&self, url: &str, spec: WorkerSpec) -> Result<String, WorkerChangeError> {
        let wanted = if self.options.pd {
            "prefill or decode"
        } else {
            "regular"
        };
        if (spec.role == Role::Regular) == self.options.pd {
            return Err(WorkerChangeError::WrongMode(format!(
                "this router runs {} mode: it takes {wanted} workers, not {}",
                if self.options.pd { "PD" } else { "regular" },
                spec.role.as_str()
            )));
        }
        Ok(WorkerAddress::normalise(url)?.0)
    }

    /// Registers a server as `id`: one routing unit, or one per DP rank with
    /// `--dp-aware`. The caller checks its health.
    pub async fn add_worker(
        &self,
        url: &str,
        spec: WorkerSpec,
        id: WorkerId,
    ) -> Result<Vec<Arc<Worker>>, WorkerChangeError> {
        self.check_worker(url, spec)?;
        let address = WorkerAddress::resolve(url).await?;
        self.options.addresses.check(url, address.endpoint)?;
        if self.registry.contains(&address.url) {
            return Err(RegistryError::Duplicate(address.url).into());
        }
        let facts = crate::workers::server_facts(
            &self.options.worker_client,
            &address.url,
            self.options.dp_aware,
            self.options.wire_profile,
        )
        .await
        .map_err(|e| {
            WorkerChangeError::DpSize(address.url.clone(), crate::workers::error_chain(&e))
        })?;
        Ok(self.registry.add_with_id(address, spec, facts, id)?)
    }

    /// Unregisters a server (all its units) and forgets its cache history.
    /// Its requests in flight finish; their ends are still accounted.
    pub fn remove_worker(&self, url: &str) -> Result<Vec<Arc<Worker>>, WorkerChangeError> {
        let (normalised, _, _) = WorkerAddress::normalise(url)?;
        let units = self.registry.remove(&normalised)?;
        for unit in &units {
            self.policies.of(unit.role()).on_removed(unit);
        }
        Ok(units)
    }

    /// Releases requests whose end was never reported.
    pub fn reap(&self, timeout: std::time::Duration) -> usize {
        self.prefill.reap(timeout);
        if let Some(gate) = &self.gate {
            gate.reap(timeout);
        }
        self.tickets.reap(timeout)
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.tickets.open_count()
    }
}

/// What the policies see of a question.
fn route_input(req: &RouteRequest) -> RouteInput<'_> {
    RouteInput {
        text: &req.routing_text,
        routing_key: RoutingKey::from_header(&req.routing_key),
    }
}

fn elapsed(started: Instant) -> f64 {
    started.elapsed().as_secs_f64()
}

fn fields(list: Vec<(&'static str, String)>) -> Vec<BodyField> {
    list.into_iter()
        .map(|(key, json_value)| BodyField {
            key: key.to_string(),
            json_value,
        })
        .collect()
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::RoundRobin;

    fn address(port: u16) -> WorkerAddress {
        WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// An engine with round robin over healthy loopback `servers`
    /// (port, spec, DP size).
    pub(crate) fn engine_with(
        options: EngineOptions,
        servers: &[(u16, WorkerSpec, Option<u32>)],
    ) -> Engine {
        engine_with_policies(
            options,
            servers,
            Policies::same(Arc::new(RoundRobin::default())),
        )
    }

    /// Like [`engine_with`], with these policies.
    fn engine_with_policies(
        options: EngineOptions,
        servers: &[(u16, WorkerSpec, Option<u32>)],
        policies: Policies,
    ) -> Engine {
        let registry = Arc::new(Registry::default());
        for (port, spec, dp) in servers {
            let units = registry.add(address(*port), *spec, *dp).unwrap();
            registry.set_healthy(&units[0], true);
        }
        Engine::new(registry, policies, Arc::new(Metrics::default()), options).unwrap()
    }

    fn engine(n: u16) -> Engine {
        let servers: Vec<_> = (1..=n).map(|p| (p, WorkerSpec::REGULAR, None)).collect();
        engine_with(EngineOptions::default(), &servers)
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
        // One endpoint per attempt (five by default): the chosen worker,
        // the two others, then the same again.
        assert_eq!(d.endpoints.len(), 5);
        let distinct: std::collections::HashSet<_> = d.endpoints[..3].iter().collect();
        assert_eq!(distinct.len(), 3);
        assert_eq!(d.endpoints[3..], d.endpoints[..2]);
        assert_eq!(d.request_headers[0].name, "x-envoy-max-retries");
        assert_eq!(d.request_headers[0].value, "4");
        assert!(d.inject.is_empty(), "nothing injected without DP");
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

    #[test]
    fn dp_aware_units_get_their_rank_and_fallbacks_skip_sibling_ranks() {
        let e = engine_with(
            EngineOptions::default(),
            &[
                (1, WorkerSpec::REGULAR, Some(2)),
                (2, WorkerSpec::REGULAR, Some(2)),
            ],
        );
        let mut seen = std::collections::HashSet::new();
        for t in 1..=4 {
            let d = decision(ask(&e, t));
            assert_eq!(d.inject.len(), 1);
            assert_eq!(d.inject[0].key, "routed_dp_rank", "the default profile");
            let rank: u32 = d.inject[0].json_value.parse().unwrap();
            assert!(d.worker_url.ends_with(&format!("@{rank}")), "{d:?}");
            // The other server is the fallback, never a sibling rank.
            assert_ne!(d.endpoints[0], d.endpoints[1]);
            assert_eq!(d.endpoints[2], d.endpoints[0]);
            seen.insert(d.worker_url);
        }
        assert_eq!(
            seen.len(),
            4,
            "round robin visits every rank of every server"
        );
    }

    fn manual() -> Arc<dyn Policy> {
        Arc::new(crate::policy::Manual::new(crate::policy::ManualConfig {
            max_idle: Duration::from_secs(60),
            assignment: crate::config::AssignmentMode::Random,
        }))
    }

    fn keyed(key: &str, ticket: u64, body: &[u8]) -> RouteRequest {
        RouteRequest {
            path: "/generate".into(),
            method: "POST".into(),
            routing_text: b"hello".to_vec(),
            routing_key: key.into(),
            body: body.to_vec(),
            ticket,
            ..Default::default()
        }
    }

    #[test]
    fn manual_policy_keeps_each_key_on_one_dp_rank_and_counts_its_key() {
        let e = engine_with_policies(
            EngineOptions::default(),
            &[
                (1, WorkerSpec::REGULAR, Some(4)),
                (2, WorkerSpec::REGULAR, Some(4)),
            ],
            Policies::same(manual()),
        );
        let mut ranks = std::collections::HashMap::new();
        let mut ticket = 0;
        for k in 0..16 {
            let key = format!("session-{k}");
            ticket += 1;
            let first = decision(e.route(&keyed(&key, ticket, b"")));
            let keys_here = ranks.entry(first.worker_url.clone()).or_insert(0);
            *keys_here += 1;
            let unit = e.registry().get(&first.worker_url).unwrap();
            assert_eq!(
                unit.routing_keys(),
                *keys_here,
                "each key in flight is counted once on its unit"
            );
            for _ in 0..3 {
                ticket += 1;
                let d = decision(e.route(&keyed(&key, ticket, b"")));
                assert_eq!(d.worker_url, first.worker_url, "{key} moved");
                assert_eq!(d.inject, first.inject, "same rank injected");
            }
        }
        assert!(ranks.len() >= 4, "16 keys on {} of 8 ranks", ranks.len());
        for t in 1..=ticket {
            e.complete(&Completion {
                ticket: t,
                http_status: 200,
                ..Default::default()
            });
        }
        assert!(e
            .registry()
            .all()
            .iter()
            .all(|w| w.routing_keys() == 0 && w.load() == 0));
    }

    #[tokio::test]
    async fn manual_policy_keeps_a_key_on_its_prefill_and_decode_pair() {
        // Each prefill server tells itself apart by its bootstrap port.
        let prefill = |port| WorkerSpec {
            role: Role::Prefill,
            bootstrap_port: Some(port),
        };
        let decode = WorkerSpec {
            role: Role::Decode,
            bootstrap_port: None,
        };
        let e = engine_with_policies(
            EngineOptions {
                pd: true,
                ..Default::default()
            },
            &[
                (1, prefill(9001), None),
                (2, prefill(9002), None),
                (3, decode, None),
                (4, decode, None),
                (5, decode, None),
            ],
            Policies {
                regular: manual(),
                prefill: manual(),
                decode: manual(),
            },
        );
        let body = br#"{"text":"hello"}"#;
        let (mut decodes, mut prefills) = (
            std::collections::HashSet::new(),
            std::collections::HashSet::new(),
        );
        for k in 0..12 {
            let key = format!("s{k}");
            let first = decision(e.route(&keyed(&key, 100 + k, body)));
            let prefill_port = |d: &Decision| {
                d.inject
                    .iter()
                    .find(|f| f.key == "bootstrap_port")
                    .map(|f| f.json_value.clone())
            };
            for i in 0..3 {
                let d = decision(e.route(&keyed(&key, 1000 + k * 10 + i, body)));
                assert_eq!(d.worker_url, first.worker_url, "decode of {key} moved");
                assert_eq!(
                    prefill_port(&d),
                    prefill_port(&first),
                    "prefill of {key} moved"
                );
            }
            prefills.insert(prefill_port(&first));
            decodes.insert(first.worker_url);
        }
        assert!(decodes.len() >= 2, "12 keys on one decode worker");
        assert_eq!(prefills.len(), 2, "12 keys on one prefill worker");
    }

    fn pd_engine() -> Engine {
        let prefill = WorkerSpec {
            role: Role::Prefill,
            bootstrap_port: Some(9),
        };
        let decode = WorkerSpec {
            role: Role::Decode,
            bootstrap_port: None,
        };
        engine_with(
            EngineOptions {
                pd: true,
                ..Default::default()
            },
            // The prefill "server" is a closed port: the prefill fails fast.
            &[(1, prefill, None), (2, decode, None)],
        )
    }

    #[tokio::test]
    async fn pd_asks_for_the_body_then_decides_and_reports_prefill_failure() {
        let e = pd_engine();
        match ask(&e, 1).outcome {
            Some(route_response::Outcome::NeedBody(_)) => {}
            other => panic!("expected NeedBody, got {other:?}"),
        }
        let r = e.route(&RouteRequest {
            path: "/generate".into(),
            method: "POST".into(),
            routing_text: b"hello".to_vec(),
            body: br#"{"text":"hello"}"#.to_vec(),
            ticket: 2,
            ..Default::default()
        });
        let d = decision(r);
        assert!(d.await_prefill);
        assert_eq!(d.worker_url, "http://127.0.0.1:2");
        let keys: Vec<_> = d.inject.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(
            keys,
            ["rid", "bootstrap_host", "bootstrap_port", "bootstrap_room",],
            "no ranks: no rank fields in the (default) upstream profile"
        );
        let snapshot = e.snapshot();
        assert_eq!(
            snapshot.wire_profiles.get("127.0.0.1:1"),
            Some(&(sglang_envoy_proto::WireProfile::Upstream as i32))
        );
        assert_eq!(snapshot.wire_profiles.len(), 2, "prefill and decode");
        let outcome = e.await_prefill(2).await;
        assert!(!outcome.ok);
        assert_eq!(outcome.http_status, 502);
        let prefill = e.registry().get("http://127.0.0.1:1").unwrap();
        assert_eq!(prefill.load(), 0, "prefill load released when it ended");
        e.complete(&Completion {
            ticket: 2,
            http_status: 502,
            ..Default::default()
        });
        assert_eq!(e.registry().get("http://127.0.0.1:2").unwrap().load(), 0);
    }

    #[tokio::test]
    async fn pd_without_prefill_workers_is_503() {
        let decode = WorkerSpec {
            role: Role::Decode,
            bootstrap_port: None,
        };
        let e = engine_with(
            EngineOptions {
                pd: true,
                ..Default::default()
            },
            &[(2, decode, None)],
        );
        let r = e.route(&RouteRequest {
            path: "/generate".into(),
            method: "POST".into(),
            body: br#"{"text":"x"}"#.to_vec(),
            ticket: 3,
            ..Default::default()
        });
        match r.outcome {
            Some(route_response::Outcome::Rejection(r)) => {
                assert_eq!(r.http_status, 503);
                assert!(r.message.contains("prefill"), "{}", r.message);
            }
            other => panic!("{other:?}"),
        }
    }
}
