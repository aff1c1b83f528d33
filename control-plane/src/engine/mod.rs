//! The decision engine: the one place that turns a routing question into a
//! decision (`decide.rs`), counts load, and releases it. Both front doors
//! reach it the same way: the wasm filter's questions through the gRPC
//! service (`service.rs`), the ext_proc front door's in process.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use sglang_envoy_body::WireProfile;
use sglang_envoy_lifecycle::{ClientKey, Mode};
use sglang_envoy_proto::{
    AdmissionOutcome, Completion, PrefillEndpoint, PrefillOutcome, WorkersSnapshot,
};

use crate::admission::{AdmissionOptions, Gate};
use crate::metrics::Metrics;
use crate::pd::{self, PrefillDispatcher, RidSource};
use crate::retry::{self, RetryOptions};
use crate::shared_ends::{EndTaker, EndsOutbox};
use crate::shared_tree::{Learner, TreeOutbox};
use crate::tickets::Tickets;
use crate::workers::{
    AddressError, AddressPolicy, HealthChecker, Registry, RegistryError, Role, Worker,
    WorkerAddress, WorkerId, WorkerSpec,
};

mod decide;
pub mod exact;
mod models;
mod policies;
mod share;
mod stopwatch;

pub use policies::Policies;

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

/// How the engine routes.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// How failed attempts are retried (and how many servers to offer).
    pub retry: RetryOptions,
    /// Regular routing, or prefill/decode disaggregation.
    pub mode: Mode,
    /// Route to DP ranks and read `dp_size` from workers as they are added.
    pub dp_aware: bool,
    /// Longest a prefill request may take.
    pub request_timeout: Duration,
    /// Which addresses may be workers.
    pub addresses: AddressPolicy,
    /// Admission control (`--max-concurrent-requests`); `None`: off.
    pub admission: Option<AdmissionOptions>,
    /// The control plane's client for workers (TLS settings of the flags,
    /// see [`crate::workers::worker_client`]): `/server_info` at
    /// registration goes through it.
    pub worker_client: reqwest::Client,
    /// A client of the same settings for the PD prefill halves alone. A
    /// pooled connection's task runs on the runtime that opened it, and
    /// the prefill halves run on the gRPC port's thread
    /// (`grpc_runtime.rs`): on a pool shared with registration and health
    /// checks (the main runtime), a prefill could get a connection whose
    /// every write and read woke a main-runtime thread.
    pub prefill_client: reqwest::Client,
    /// `--wire-profile`: the field dialect of every worker; `None` (auto):
    /// each worker's own, from the version it reports (see
    /// [`pd::wire_profile`]).
    pub wire_profile: Option<WireProfile>,
    /// `--api-key`: the key inference requests must carry.
    pub client_key: Option<ClientKey>,
    /// `--tenant-header-name`, lower-cased, with `--trust-tenant-header`
    /// (`None` without): the header both front doors copy into
    /// `Question.tenant` (the filter learns it from the worker snapshot).
    pub tenant_header: Option<String>,
    /// `--enable-trace`: each decision is a span (see [`crate::trace`]).
    pub trace: bool,
    /// `--decision-cpu-metric`: each decision's CPU time is measured too
    /// (`stopwatch.rs`).
    pub decision_cpu: bool,
    /// `--max-payload-size`: larger request bodies are refused (413),
    /// whatever the front door's own limit.
    pub max_body_bytes: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            retry: RetryOptions::default(),
            mode: Mode::Regular,
            dp_aware: false,
            request_timeout: Duration::from_secs(1800),
            addresses: AddressPolicy::default(),
            admission: None,
            worker_client: reqwest::Client::new(),
            prefill_client: reqwest::Client::new(),
            wire_profile: None,
            client_key: None,
            tenant_header: None,
            trace: false,
            decision_cpu: false,
            max_body_bytes: sglang_envoy_lifecycle::names::DEFAULT_MAX_BODY_BYTES,
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
    /// Checks at once each worker a request failed on (see
    /// [`Engine::report`]); `None` in unit tests.
    health: Option<Arc<HealthChecker>>,
    /// Exact cached prefixes from KV events (with a tokenizer); `None`:
    /// the policies' trees alone.
    exact: Option<exact::ExactCache>,
    /// Where the trees' inserts go for the other control planes
    /// (`--fleet-store-url`); `None`: not shared.
    shared_tree: Option<TreeOutbox>,
    /// Where ends of tickets not known here go for the other control
    /// planes; `None`: not shared.
    shared_ends: Option<EndsOutbox>,
}

impl Engine {
    /// An engine over `registry` using `policies`.
    pub fn new(
        registry: Arc<Registry>,
        policies: Policies,
        metrics: Arc<Metrics>,
        options: EngineOptions,
    ) -> Self {
        let gate = options.admission.clone().map(Gate::new);
        Engine {
            policies,
            tickets: Tickets::default(),
            prefill: PrefillDispatcher::new(
                options.prefill_client.clone(),
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
            health: None,
            exact: None,
            shared_tree: None,
            shared_ends: None,
        }
    }

    /// This engine, telling the other control planes each insert into its
    /// policies' trees through `outbox`.
    pub fn with_shared_tree(mut self, outbox: TreeOutbox) -> Self {
        self.shared_tree = Some(outbox);
        self
    }

    /// This engine, passing the ends of tickets it does not know to the
    /// other control planes through `outbox`.
    pub fn with_shared_ends(mut self, outbox: EndsOutbox) -> Self {
        self.shared_ends = Some(outbox);
        self
    }

    /// This engine, routing on exact cached prefixes where workers publish
    /// KV events.
    pub fn with_exact_cache(mut self, exact: exact::ExactCache) -> Self {
        self.exact = Some(exact);
        self
    }

    /// Whether decisions tokenize prompts (exact cache matching): each
    /// then costs far more than a lookup.
    pub fn tokenizes(&self) -> bool {
        self.exact.is_some()
    }

    /// Whether decisions read request bodies (PD's prefill half, or exact
    /// cache matching): the front doors then send every body.
    pub fn wants_bodies(&self) -> bool {
        self.options.mode == Mode::Pd || self.exact.is_some()
    }

    /// This engine, checking at once through `health` each worker that a
    /// request failed on.
    pub fn with_health(mut self, health: Arc<HealthChecker>) -> Self {
        self.health = Some(health);
        self
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
            pd: self.options.mode == Mode::Pd,
            serving: endpoints(Role::serving(self.options.mode))
                .iter()
                .map(|w| w.endpoint_text.clone())
                .collect(),
            prefill: endpoints(Role::Prefill)
                .iter()
                .map(|w| PrefillEndpoint {
                    endpoint: w.endpoint_text.clone(),
                    host: w.host.clone(),
                    bootstrap_port: w.spec.bootstrap_port().map_or(0, u32::from),
                })
                .collect(),
            wire_profiles: [Role::serving(self.options.mode), Role::Prefill]
                .into_iter()
                .flat_map(endpoints)
                .map(|w| (w.endpoint_text.clone(), pd::wire_code(w.facts.wire)))
                .collect(),
            max_body_bytes: self.options.max_body_bytes as u64,
            client_key_sha256: self
                .options
                .client_key
                .map(|k| k.digest().to_vec())
                .unwrap_or_default(),
            tenant_header: self.options.tenant_header.clone().unwrap_or_default(),
        }
    }

    /// How many PD prefill halves this control plane sent still run.
    pub fn prefills_running(&self) -> usize {
        self.tickets.prefills_running()
    }

    /// Waits for the prefill half of `ticket`.
    pub async fn await_prefill(&self, ticket: u64) -> PrefillOutcome {
        match self.tickets.prefill(ticket) {
            Some(prefill) => prefill.outcome().await,
            None => PrefillOutcome {
                ok: false,
                http_status: 503,
                message:
                    "no prefill request is known for this ticket (another replica sent it, or this one restarted)"
                        .into(),
                error_type: "prefill_failed".into(),
                unknown_ticket: true,
                ..Default::default()
            },
        }
    }

    /// What a front door reports of a request, whichever front door and
    /// however it came (the filter's session or `Complete` call, an
    /// ext_proc stream): what its answer says of the workers tried
    /// (`outcome_only`), that its worker has prefilled it (`prefilled`),
    /// or its end, which releases its load. A worker an
    /// attempt failed on is checked at once. Returns those workers.
    pub fn report(&self, c: &Completion) -> Vec<Arc<Worker>> {
        if c.prefilled {
            // Not the end: the worker is done prefilling it. A ticket
            // another control plane counted is left to its end there.
            self.tickets.prefilled(c.ticket);
            return Vec::new();
        }
        let failed = if c.outcome_only {
            self.record_outcome(c)
        } else {
            self.complete(c, false)
        };
        if let Some(health) = &self.health {
            health.suspect_each(&failed);
        }
        failed
    }

    /// Records what a request's attempts say about their workers as soon as
    /// its answer starts with a failure, before the client sees it (and
    /// sends its next request). Its end, reported later, records nothing
    /// more.
    fn record_outcome(&self, c: &Completion) -> Vec<Arc<Worker>> {
        let Some(plan) = self.tickets.take_plan(c.ticket) else {
            return Vec::new();
        };
        self.record_attempts(&plan, c)
    }

    /// Records what each attempt of `c` says of its worker; returns the
    /// workers an attempt failed on, each once, for the caller to check at
    /// once (a refused connection or a 5xx is the first sign of a worker
    /// gone, long before its next scheduled health check).
    fn record_attempts(&self, plan: &[Arc<Worker>], c: &Completion) -> Vec<Arc<Worker>> {
        let mut failed: Vec<Arc<Worker>> = Vec::new();
        for (tried, ok) in retry::outcomes(plan, c) {
            self.registry.record_outcome(&tried, ok);
            if !ok && !failed.iter().any(|w| Arc::ptr_eq(w, &tried)) {
                failed.push(tried);
            }
        }
        failed
    }

    /// Releases a finished request's load. Returns the workers its attempts
    /// failed on. An end whose ticket is not known here goes on to the
    /// other control planes (`shared_ends.rs`) unless it came from them
    /// (`forwarded`).
    fn complete(&self, c: &Completion, forwarded: bool) -> Vec<Arc<Worker>> {
        if let Some(gate) = &self.gate {
            gate.release(c.ticket);
        }
        let Some(mut counted) = self.tickets.close(c.ticket) else {
            if let Some(ends) = self.shared_ends.as_ref().filter(|_| !forwarded) {
                if c.ticket != 0 && !ends.forward(c) {
                    tracing::debug!(
                        ticket = c.ticket,
                        "too many unknown ends to pass on: dropped"
                    );
                }
            }
            return Vec::new();
        };
        let worker = counted.worker.clone();
        let plan = std::mem::take(&mut counted.plan);
        let predicted = counted.predicted_cached.take();
        drop(counted); // releases the load
        if let Some(p) = predicted {
            self.self_check(&worker, p, c);
        }
        let failed = self.record_attempts(&plan, c);
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
        failed
    }

    /// Compares the cached tokens `worker` reported for `c` with the `predicted`
    /// ones (when it answered, and the request did not move to another worker).
    fn self_check(&self, worker: &Worker, predicted: u64, c: &Completion) {
        let (Some(exact), Some(reported)) = (&self.exact, c.cached_tokens) else {
            return;
        };
        if c.upstream_host != worker.endpoint_text || !(200..300).contains(&c.http_status) {
            return;
        }
        self.metrics
            .exact_check(&worker.base_url, predicted == reported);
        match exact.check(&worker.base_url, predicted, reported) {
            exact::CheckChange::Distrusted => tracing::error!(
                worker = %worker.base_url,
                predicted,
                reported,
                "KV-event self-check: the cached tokens this worker reports disagree with the router's predictions (is --tokenizer-path / --chat-template the worker's model and template?); routing it on the approximate tree until they agree"
            ),
            exact::CheckChange::Trusted => tracing::info!(
                worker = %worker.base_url,
                "KV-event self-check: predictions agree again; routing this worker on its events"
            ),
            exact::CheckChange::None => {}
        }
    }

    /// The KV-event self-check of the server at `base_url`; `None` when
    /// the router does not route on events (no tokenizer).
    pub fn exact_check(&self, base_url: &str) -> Option<exact::CheckView> {
        self.exact.as_ref().map(|e| e.check_view(base_url))
    }

    /// Releases a request whose end will never be reported where it was
    /// counted (the filter's session stream it was answered on ended), as
    /// if it had ended with nothing to say about its worker. True when it
    /// was still open.
    pub fn abandon(&self, ticket: u64) -> bool {
        if let Some(gate) = &self.gate {
            gate.release(ticket);
        }
        // Dropped, so released.
        self.tickets.close(ticket).is_some()
    }

    /// What can be told of a worker without calling anything: that this
    /// router's mode takes its role and that its URL is well formed.
    /// Returns the normalised URL.
    pub fn check_worker(&self, url: &str, spec: WorkerSpec) -> Result<String, WorkerChangeError> {
        let mode = self.options.mode;
        if !spec.role().belongs_to(mode) {
            let wanted = match mode {
                Mode::Pd => "prefill or decode",
                Mode::Regular => "regular",
            };
            return Err(WorkerChangeError::WrongMode(format!(
                "this router runs {} mode: it takes {wanted} workers, not {}",
                mode.as_str(),
                spec.role().as_str()
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
        self.forget(&units);
        Ok(units)
    }

    /// The policies forget units that are gone (removed, or moved to
    /// another address): their cache history no longer stands for anything.
    pub fn forget(&self, units: &[Arc<Worker>]) {
        for unit in units {
            self.policies.of(unit.role()).on_removed(unit);
        }
    }

    /// Releases requests whose end was never reported.
    pub fn reap(&self, timeout: std::time::Duration) -> usize {
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

impl EndTaker for Engine {
    /// Released here if the ticket is ours, as if reported here; a ticket
    /// not known here either leaves a tombstone, which cancels its decision
    /// if that is still on its way.
    fn take_forwarded(&self, end: &Completion) {
        let failed = self.complete(end, true);
        if let Some(health) = &self.health {
            health.suspect_each(&failed);
        }
    }
}

impl Learner for Engine {
    /// The unit's role's policy records it (if it keeps a tree).
    fn learn_shared(&self, unit: &str, text: &[u8]) -> bool {
        let Some(worker) = self.registry.get(unit) else {
            return false;
        };
        self.policies.of(worker.role()).learn(&worker, text);
        true
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
pub(crate) mod tests;
