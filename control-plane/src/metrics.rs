//! Prometheus metrics, served at `GET /metrics` of the admin API.

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::kv_events::WorkerKvView;
use crate::policy::CacheOutcome;
use crate::workers::{CircuitState, Worker};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabel {
    worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabel {
    prefix: String,
}

/// Every metric the control plane exports.
pub struct Metrics {
    registry: Registry,
    requests: Family<RouteLabel, Counter>,
    errors: Family<ReasonLabel, Counter>,
    duration: Histogram,
    decision_seconds: Histogram,
    decision_cpu_seconds: Histogram,
    cache_hits: Counter,
    cache_misses: Counter,
    imbalanced: Counter,
    failovers: Counter,
    retries: Counter,
    worker_load: Family<WorkerLabel, Gauge>,
    worker_engine_load: Family<WorkerLabel, Gauge>,
    worker_routing_load: Family<WorkerLabel, Gauge>,
    worker_circuit: Family<WorkerLabel, Gauge>,
    admitted: Gauge,
    queued: Gauge,
    worker_healthy: Family<WorkerLabel, Gauge>,
    worker_processed: Family<WorkerLabel, Gauge>,
    sessions: Gauge,
    session_messages: Family<KindLabel, Counter>,
    session_answer_messages: Counter,
    session_answers: Counter,
    kv_events_received: Family<WorkerLabel, Counter>,
    kv_events_gaps: Family<WorkerLabel, Counter>,
    worker_kv_blocks: Family<WorkerLabel, Gauge>,
    worker_kv_events_live: Family<WorkerLabel, Gauge>,
    exact_cache: Family<ReasonLabel, Counter>,
    exact_checks: Family<CheckLabel, Counter>,
    fleet_store_up: Family<StoreLabel, Gauge>,
    shared_tree: Family<DirectionLabel, Counter>,
    fleet_store_peers: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabel {
    worker: String,
    result: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(None)
    }
}

impl Metrics {
    /// The metrics, with `--prometheus-duration-buckets` (upper bounds in
    /// seconds) for the request duration histogram when given; 1 ms
    /// doubling twenty times (to about 9 minutes) otherwise.
    pub fn new(duration_buckets: Option<&[f64]>) -> Self {
        let mut registry = Registry::default();
        let duration = match duration_buckets {
            Some(b) => Histogram::new(b.iter().copied()),
            None => Histogram::new(exponential_buckets(0.001, 2.0, 20)),
        };
        let m = Metrics {
            requests: Family::default(),
            errors: Family::default(),
            duration,
            // Factor 1.25 from 1 us to ~1.6 s: a p99 read from the buckets
            // is within 25%, fine enough to compare replicas (bench).
            decision_seconds: Histogram::new(exponential_buckets(0.000_001, 1.25, 64)),
            decision_cpu_seconds: Histogram::new(exponential_buckets(0.000_001, 1.25, 64)),
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            imbalanced: Counter::default(),
            failovers: Counter::default(),
            retries: Counter::default(),
            worker_load: Family::default(),
            worker_engine_load: Family::default(),
            worker_routing_load: Family::default(),
            worker_circuit: Family::default(),
            admitted: Gauge::default(),
            queued: Gauge::default(),
            worker_healthy: Family::default(),
            worker_processed: Family::default(),
            sessions: Gauge::default(),
            session_messages: Family::default(),
            session_answer_messages: Counter::default(),
            session_answers: Counter::default(),
            kv_events_received: Family::default(),
            kv_events_gaps: Family::default(),
            worker_kv_blocks: Family::default(),
            worker_kv_events_live: Family::default(),
            exact_cache: Family::default(),
            exact_checks: Family::default(),
            fleet_store_up: Family::default(),
            shared_tree: Family::default(),
            fleet_store_peers: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "sgl_router_requests",
            "Requests routed, by route",
            m.requests.clone(),
        );
        registry.register(
            "sgl_router_request_errors",
            "Requests that failed, by reason",
            m.errors.clone(),
        );
        registry.register(
            "sgl_router_request_duration_seconds",
            "Time from a request's arrival at Envoy to its end",
            m.duration.clone(),
        );
        registry.register(
            "sgl_router_decision_duration_seconds",
            "Time the control plane took to choose a worker",
            m.decision_seconds.clone(),
        );
        registry.register(
            "sgl_router_decision_cpu_seconds",
            "CPU time the control plane's thread spent choosing a worker (with --decision-cpu-metric)",
            m.decision_cpu_seconds.clone(),
        );
        registry.register(
            "sgl_router_cache_hits",
            "Cache-aware decisions sent to the best prefix match",
            m.cache_hits.clone(),
        );
        registry.register(
            "sgl_router_cache_misses",
            "Cache-aware decisions below the match threshold",
            m.cache_misses.clone(),
        );
        registry.register(
            "sgl_router_imbalanced_decisions",
            "Cache-aware decisions made by shortest queue because loads were imbalanced",
            m.imbalanced.clone(),
        );
        registry.register(
            "sgl_router_worker_failovers",
            "Requests Envoy had to send to a fallback worker",
            m.failovers.clone(),
        );
        registry.register(
            "sgl_router_retries",
            "Attempts Envoy made beyond the first, after a worker failed one",
            m.retries.clone(),
        );
        registry.register(
            "sgl_router_worker_circuit_state",
            "Circuit breaker per worker: 0 closed, 1 open, 2 half-open",
            m.worker_circuit.clone(),
        );
        registry.register(
            "sgl_router_admission_in_flight",
            "Inference requests holding an admission slot (--max-concurrent-requests)",
            m.admitted.clone(),
        );
        registry.register(
            "sgl_router_admission_queued",
            "Inference requests waiting for an admission slot",
            m.queued.clone(),
        );
        registry.register(
            "sgl_router_worker_load",
            "Requests in flight per worker",
            m.worker_load.clone(),
        );
        registry.register(
            "sgl_router_worker_engine_load",
            "Running plus waiting requests per worker in its own last load report; absent for a worker without a live report, which is routed on this router's counts alone",
            m.worker_engine_load.clone(),
        );
        registry.register(
            "sgl_router_worker_routing_load",
            "The load policies compare: the worker's report plus the requests sent since, or this router's own count without a report",
            m.worker_routing_load.clone(),
        );
        registry.register(
            "sgl_router_worker_healthy",
            "1 when the worker passes its health checks (whether its circuit lets requests through: sgl_router_worker_circuit_state)",
            m.worker_healthy.clone(),
        );
        registry.register(
            "sgl_router_worker_processed_requests",
            "Requests finished per worker",
            m.worker_processed.clone(),
        );
        registry.register(
            "sgl_router_filter_sessions",
            "Filter VMs (one per Envoy worker thread) with an open session stream",
            m.sessions.clone(),
        );
        registry.register(
            "sgl_router_filter_session_messages",
            "Messages filters sent up their session streams, by kind (route, end, ends, prefill, synced): the per-request exchange's cost",
            m.session_messages.clone(),
        );
        registry.register(
            "sgl_router_filter_session_answer_messages",
            "Messages of answers sent down filters' session streams (several answers ready together go in one)",
            m.session_answer_messages.clone(),
        );
        registry.register(
            "sgl_router_filter_session_answers",
            "Answers sent down filters' session streams, in messages of their own or batched",
            m.session_answers.clone(),
        );
        registry.register(
            "sgl_router_kv_events_received",
            "KV-event messages received per worker (all DP ranks), well-formed or not",
            m.kv_events_received.clone(),
        );
        registry.register(
            "sgl_router_kv_events_gaps",
            "KV-event sequence gaps per worker (all DP ranks), replayed or not",
            m.kv_events_gaps.clone(),
        );
        registry.register(
            "sgl_router_worker_kv_blocks",
            "KV cache blocks the KV-event index holds per worker (all DP ranks and tiers)",
            m.worker_kv_blocks.clone(),
        );
        registry.register(
            "sgl_router_worker_kv_events_live",
            "1 when every DP rank of the worker is subscribed to and trusted; 0 otherwise (untrusted after a lost batch, or not subscribed yet)",
            m.worker_kv_events_live.clone(),
        );
        registry.register(
            "sgl_router_exact_cache_decisions",
            "Decisions among workers of which some publish KV events: reason=events when their exact cached prefixes were used, else why the trees alone decided (unpredictable: images, batches, LoRA; invalid; template; tokenizer)",
            m.exact_cache.clone(),
        );
        registry.register(
            "sgl_router_exact_cache_checks",
            "KV-event self-check per worker: answers whose reported cached tokens matched the router's prediction (result=agree) or not (result=disagree)",
            m.exact_checks.clone(),
        );
        registry.register(
            "sgl_router_fleet_store_up",
            "1 while the fleet store (--fleet-store-url, keys under prefix) answers, 0 while it does not; absent without a store",
            m.fleet_store_up.clone(),
        );
        registry.register(
            "sgl_router_shared_tree_inserts",
            "Approximate-tree inserts shared through the fleet store: direction=sent (this control plane's choices written), received (the others' applied here), dropped (queue full or store down)",
            m.shared_tree.clone(),
        );
        registry.register(
            "sgl_router_fleet_store_peers",
            "Other control planes whose requests in flight this one read from the fleet store last (0 while it is unreachable)",
            m.fleet_store_peers.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// One self-check of `worker`'s predicted cached tokens.
    pub fn exact_check(&self, worker: &str, agree: bool) {
        self.exact_checks
            .get_or_create(&CheckLabel {
                worker: worker.to_string(),
                result: if agree { "agree" } else { "disagree" },
            })
            .inc();
    }

    /// A decision among workers with KV events, and what it used.
    pub fn exact_cache(&self, reason: &'static str) {
        self.exact_cache
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Whether the fleet store with keys under `prefix` answered last.
    pub fn fleet_store(&self, prefix: &str, up: bool) {
        self.fleet_store_up
            .get_or_create(&StoreLabel {
                prefix: prefix.to_string(),
            })
            .set(i64::from(up));
    }

    /// `n` tree inserts shared in `direction` (sent, received, dropped).
    pub fn shared_tree(&self, direction: &'static str, n: u64) {
        if n > 0 {
            self.shared_tree
                .get_or_create(&DirectionLabel { direction })
                .inc_by(n);
        }
    }

    /// How many other control planes' counts were read last.
    pub fn fleet_store_peers(&self, n: usize) {
        self.fleet_store_peers.set(n as i64);
    }

    /// A message carrying `answers` answers went down a session.
    pub fn session_answers(&self, answers: usize) {
        self.session_answer_messages.inc();
        self.session_answers.inc_by(answers as u64);
    }

    /// A filter sent a message of `kind` up its session.
    pub fn session_message(&self, kind: &'static str) {
        self.session_messages
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    /// A filter's session stream opened (`+1`) or ended (`-1`).
    pub fn session(&self, delta: i64) {
        self.sessions.inc_by(delta);
    }

    /// One routing decision for `route`, which took `took.0` seconds on
    /// the clock and `took.1` of its thread's CPU (`--decision-cpu-metric`).
    pub fn decided(&self, route: &str, cache: CacheOutcome, took: (f64, Option<f64>)) {
        let (seconds, cpu_seconds) = took;
        self.requests
            .get_or_create(&RouteLabel {
                route: route.to_string(),
            })
            .inc();
        self.decision_seconds.observe(seconds);
        if let Some(cpu) = cpu_seconds {
            self.decision_cpu_seconds.observe(cpu);
        }
        match cache {
            CacheOutcome::Hit => self.cache_hits.inc(),
            CacheOutcome::Miss => self.cache_misses.inc(),
            CacheOutcome::Imbalanced => self.imbalanced.inc(),
            CacheOutcome::NotApplicable => 0,
        };
    }

    /// A failed request (rejected, upstream error, or failover).
    pub fn error(&self, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// A finished request, after `retries` attempts beyond the first.
    pub fn finished(&self, seconds: f64, failed_over: bool, retries: u32) {
        self.duration.observe(seconds);
        if failed_over {
            self.failovers.inc();
        }
        if retries > 0 {
            self.retries.inc_by(u64::from(retries));
        }
    }

    /// The KV-event subscriber's state, per worker, for the next render.
    /// Rebuilt on each call, so removed workers disappear; counters restart
    /// from zero when a worker is registered again.
    pub fn record_kv_events(&self, views: &[WorkerKvView]) {
        self.kv_events_received.clear();
        self.kv_events_gaps.clear();
        self.worker_kv_blocks.clear();
        self.worker_kv_events_live.clear();
        for v in views {
            let label = WorkerLabel {
                worker: v.worker.clone(),
            };
            self.kv_events_received
                .get_or_create(&label)
                .inc_by(v.received());
            self.kv_events_gaps.get_or_create(&label).inc_by(v.gaps());
            self.worker_kv_blocks
                .get_or_create(&label)
                .set(i64::try_from(v.blocks).unwrap_or(i64::MAX));
            self.worker_kv_events_live
                .get_or_create(&label)
                .set(i64::from(v.live));
        }
    }

    /// The text exposition, with per-worker gauges read from `workers` now
    /// and the admission counts (in flight, queued) when there is a limit.
    pub fn render(&self, workers: &[Arc<Worker>], admission: Option<(usize, usize)>) -> String {
        let (admitted, queued) = admission.unwrap_or_default();
        self.admitted.set(admitted as i64);
        self.queued.set(queued as i64);
        // Rebuilt per scrape so removed workers disappear.
        self.worker_load.clear();
        self.worker_engine_load.clear();
        self.worker_routing_load.clear();
        self.worker_circuit.clear();
        self.worker_healthy.clear();
        self.worker_processed.clear();
        for w in workers {
            let label = WorkerLabel {
                worker: w.url.clone(),
            };
            self.worker_load.get_or_create(&label).set(w.load() as i64);
            if let Some(n) = w.engine.reported() {
                self.worker_engine_load.get_or_create(&label).set(n as i64);
            }
            self.worker_routing_load
                .get_or_create(&label)
                .set(w.routing_load() as i64);
            let circuit = match w.circuit().state() {
                CircuitState::Closed => 0,
                CircuitState::Open => 1,
                CircuitState::HalfOpen => 2,
            };
            self.worker_circuit.get_or_create(&label).set(circuit);
            self.worker_healthy
                .get_or_create(&label)
                .set(i64::from(w.is_healthy()));
            self.worker_processed
                .get_or_create(&label)
                .set(w.processed() as i64);
        }
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
