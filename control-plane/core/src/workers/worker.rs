use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use sglang_envoy_body::WireProfile;
use sglang_envoy_lifecycle::Mode;

use parking_lot::Mutex;

use crate::routing_key::RoutingKey;
use crate::tree::TenantId;
use crate::workers::{
    Circuit, CircuitState, EngineLoad, PrefillQueue, Sent, WorkerAddress, WorkerId,
};

/// What a worker does in the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A normal SGLang server: prefill and decode in one.
    Regular,
    /// PD disaggregation: runs prefills and serves their KV cache to decode
    /// workers on its bootstrap port.
    Prefill,
    /// PD disaggregation: fetches the KV cache and generates.
    Decode,
}

impl Role {
    /// The name used on the wire (`worker_type`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Regular => "regular",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }

    /// The role that serves clients' requests (through Envoy) in `mode`.
    pub fn serving(mode: Mode) -> Role {
        match mode {
            Mode::Regular => Role::Regular,
            Mode::Pd => Role::Decode,
        }
    }

    /// The roles of the workers a router in `mode` takes.
    pub fn taken_by(mode: Mode) -> &'static [Role] {
        match mode {
            Mode::Regular => &[Role::Regular],
            Mode::Pd => &[Role::Prefill, Role::Decode],
        }
    }

    /// A router in `mode` takes workers of this role.
    pub fn belongs_to(self, mode: Mode) -> bool {
        Role::taken_by(mode).contains(&self)
    }

    /// The role named `name` on the wire; `None` for anything else.
    pub fn parse(name: &str) -> Option<Role> {
        [Role::Regular, Role::Prefill, Role::Decode]
            .into_iter()
            .find(|r| r.as_str() == name)
    }
}

/// How a server was registered: its role and, for prefill servers only,
/// the bootstrap port decode workers fetch the KV cache from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerSpec {
    /// A normal SGLang server.
    Regular,
    /// A PD prefill server.
    Prefill {
        /// Its bootstrap port; `None` sends a null port, and the decode
        /// worker then uses its own default.
        bootstrap_port: Option<u16>,
    },
    /// A PD decode server.
    Decode,
}

impl WorkerSpec {
    /// A regular worker.
    pub const REGULAR: WorkerSpec = WorkerSpec::Regular;

    /// The spec of a server of `role`; `bootstrap_port` counts for prefill
    /// servers only.
    pub fn of(role: Role, bootstrap_port: Option<u16>) -> WorkerSpec {
        match role {
            Role::Regular => WorkerSpec::Regular,
            Role::Prefill => WorkerSpec::Prefill { bootstrap_port },
            Role::Decode => WorkerSpec::Decode,
        }
    }

    /// Regular, prefill or decode.
    pub fn role(self) -> Role {
        match self {
            WorkerSpec::Regular => Role::Regular,
            WorkerSpec::Prefill { .. } => Role::Prefill,
            WorkerSpec::Decode => Role::Decode,
        }
    }

    /// A prefill server's bootstrap port; `None` for the others.
    pub fn bootstrap_port(self) -> Option<u16> {
        match self {
            WorkerSpec::Prefill { bootstrap_port } => bootstrap_port,
            _ => None,
        }
    }
}

/// What the control plane knows of a server from the server itself (its
/// `/server_info`, read when it was added) or from the `--wire-profile`
/// flag.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerFacts {
    /// Its number of DP ranks (`--dp-aware` only): one unit per rank.
    pub dp_size: Option<u32>,
    /// The spelling of the DP and PD fields it reads.
    pub wire: WireProfile,
    /// The model it serves (its `served_model_name`), `None` when it could
    /// not be read: such a worker takes only requests that name no model
    /// in a fleet of several models (see the engine's `models` module).
    pub model: Option<Arc<str>>,
}

impl From<Option<u32>> for ServerFacts {
    /// `dp_size` and the default profile.
    fn from(dp_size: Option<u32>) -> Self {
        ServerFacts {
            dp_size,
            ..ServerFacts::default()
        }
    }
}

/// Health of one server, shared by all its DP-rank units: they live in one
/// process, answer one health endpoint and fail together.
#[derive(Debug, Default)]
pub struct Health {
    healthy: AtomicBool,
    failures: AtomicU32,
    successes: AtomicU32,
    /// Request outcomes, apart from health checks.
    circuit: Circuit,
}

/// One routing unit: a registered worker, or with `--dp-aware` one DP rank of
/// it. Each unit has its own load count and its own tenant in the
/// approximate radix tree, because each rank has its own KV cache and queue.
#[derive(Debug)]
pub struct Worker {
    /// The server's id in the `/workers` API (shared by its DP ranks).
    pub id: WorkerId,
    /// The unit's name: `http://host:port` (or `https://`), with `@rank`
    /// appended for a DP rank (sglang-router's convention).
    pub url: String,
    /// `http://host:port` (or `https://`) of the server as registered.
    pub base_url: String,
    /// The host of the URL (what PD mode sends as `bootstrap_host`).
    pub host: String,
    /// An `https://` worker: Envoy and the control plane talk TLS to it.
    pub tls: bool,
    /// The URL's host when it is a DNS name (Envoy sends it as SNI and
    /// checks the certificate against it); `None` for an IP address.
    pub dns_name: Option<String>,
    /// Where Envoy connects.
    pub endpoint: SocketAddr,
    /// `endpoint` as the `ip:port` text Envoy's override_host reads.
    pub endpoint_text: String,
    /// Regular, prefill or decode, and the bootstrap port.
    pub spec: WorkerSpec,
    /// The DP rank this unit stands for (`--dp-aware`), else `None`.
    pub dp_rank: Option<u32>,
    /// The server's DP size and field dialect.
    pub facts: ServerFacts,
    /// This unit's tenant in the approximate radix tree.
    pub tenant: TenantId,
    /// The model read after registration, when `facts` has none (the
    /// server was not answering yet when it was added).
    learned_model: OnceLock<Arc<str>>,
    load: AtomicUsize,
    /// The engine's own report of this unit's load (`--load-monitor-interval`).
    pub engine: EngineLoad,
    /// Estimated prefill work (uncached prompt bytes) of the requests in
    /// flight not yet prefilled, for policies that weigh queues by work
    /// rather than count.
    prefill: Mutex<PrefillQueue>,
    /// The other control planes' requests in flight here and their work,
    /// as the fleet store last told (see [`Worker::set_peer_load`]).
    peer_load: AtomicUsize,
    peer_work: AtomicU64,
    health: Arc<Health>,
    processed: AtomicUsize,
    /// Routing keys of the requests in flight, with how many each has:
    /// what the `manual` policy's `min_group` assignment compares.
    keys: Mutex<HashMap<RoutingKey, u32>>,
}

impl Worker {
    /// A new unit with a fresh id; it starts unhealthy until a health check
    /// passes. Units of one server share `health` (and, see
    /// [`Worker::with_id`], their id).
    pub fn new(
        address: WorkerAddress,
        spec: WorkerSpec,
        dp_rank: Option<u32>,
        health: Arc<Health>,
        tenant: TenantId,
    ) -> Self {
        let url = match dp_rank {
            Some(rank) => format!("{}@{rank}", address.url),
            None => address.url.clone(),
        };
        Worker {
            id: WorkerId::random(),
            endpoint_text: address.endpoint.to_string(),
            tls: address.tls,
            dns_name: address.dns_name().map(str::to_string),
            url,
            base_url: address.url,
            host: address.host,
            endpoint: address.endpoint,
            spec,
            dp_rank,
            facts: ServerFacts::default(),
            tenant,
            learned_model: OnceLock::new(),
            load: AtomicUsize::new(0),
            engine: EngineLoad::default(),
            prefill: Mutex::new(PrefillQueue::default()),
            peer_load: AtomicUsize::new(0),
            peer_work: AtomicU64::new(0),
            health,
            processed: AtomicUsize::new(0),
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// This unit with `id` as its server's id.
    pub fn with_id(self, id: WorkerId) -> Self {
        Worker { id, ..self }
    }

    /// Regular or prefill or decode.
    pub fn role(&self) -> Role {
        self.spec.role()
    }

    /// The model its server serves, when it was read (at registration,
    /// or later, see [`Worker::learn_model`]).
    pub fn model(&self) -> Option<&str> {
        self.facts
            .model
            .as_deref()
            .or_else(|| self.learned_model.get().map(|m| &**m))
    }

    /// Records the model of a server whose model was not known when it was
    /// added; a model already known stays.
    pub fn learn_model(&self, model: Arc<str>) {
        if self.facts.model.is_none() {
            let _ = self.learned_model.set(model);
        }
    }

    /// Requests sent to this worker whose end has not been reported yet.
    pub fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }

    /// The load policies route on: the engine's last report plus what this
    /// router sent since (see [`EngineLoad`]), and never less than this
    /// router's own requests in flight, which the engine holds or is about
    /// to; the router's own count alone without a live report.
    ///
    /// With several control planes sharing their counts (the fleet store),
    /// "this router's own" is all of theirs: the engine's report holds the
    /// others' requests too, but only as of its last read.
    pub fn routing_load(&self) -> usize {
        let ours = self.load() + self.peer_load.load(Ordering::Relaxed);
        self.engine.merged().map_or(ours, |merged| merged.max(ours))
    }

    /// The other control planes' requests in flight on this unit and their
    /// estimated prefill work, replacing the last figures (0, 0 when they
    /// are unknown: each then routes on its own counts).
    pub fn set_peer_load(&self, load: usize, work: u64) {
        self.peer_load.store(load, Ordering::Relaxed);
        self.peer_work.store(work, Ordering::Relaxed);
    }

    /// Counts one more request in flight.
    pub fn increment_load(&self) -> Sent {
        self.load.fetch_add(1, Ordering::Relaxed);
        self.engine.on_sent()
    }

    /// Counts one request as finished (never below zero).
    pub fn decrement_load(&self) {
        let _ = self
            .load
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1));
        self.processed.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request in flight with `work` bytes of estimated prefill;
    /// what [`Worker::finish`] takes back.
    pub fn start(&self, work: u64) -> Sent {
        self.start_at(work, Instant::now())
    }

    /// [`Worker::start`], sent at `now`.
    pub fn start_at(&self, work: u64, now: Instant) -> Sent {
        self.prefill.lock().push(work, now);
        self.increment_load()
    }

    /// Counts a request started with `work` (and `sent`) as finished; its
    /// work, if still queued, leaves the queue.
    pub fn finish(&self, work: u64, sent: Sent) {
        self.engine.on_ended(sent);
        self.decrement_load();
        self.prefill.lock().ended(work);
    }

    /// The worker has prefilled a request of `work` bytes (it decodes on):
    /// the work leaves the queue, and the time it took teaches the
    /// worker's pace ([`PrefillQueue::prefilled`]).
    pub fn prefilled(&self, work: u64) {
        self.prefilled_at(work, Instant::now());
    }

    /// [`Worker::prefilled`], reported at `now`.
    pub fn prefilled_at(&self, work: u64, now: Instant) {
        self.prefill.lock().prefilled(work, now);
    }

    /// Counts one more request in flight under routing `key`.
    pub fn hold_key(&self, key: RoutingKey) {
        *self.keys.lock().entry(key).or_insert(0) += 1;
    }

    /// Counts a request under routing `key` as finished.
    pub fn release_key(&self, key: RoutingKey) {
        let mut keys = self.keys.lock();
        if let Some(n) = keys.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                keys.remove(&key);
            }
        }
    }

    /// Distinct routing keys among the requests in flight (sglang-router's
    /// "routing key load").
    pub fn routing_keys(&self) -> usize {
        self.keys.lock().len()
    }

    /// Estimated prefill work of the requests in flight, this control
    /// plane's and (shared through the fleet store) the others'.
    pub fn pending_work(&self) -> u64 {
        self.own_work()
            .saturating_add(self.peer_work.load(Ordering::Relaxed))
    }

    /// [`Worker::pending_work`] less what the worker's pace (or, before its
    /// first report, `fallback`) says it has prefilled of this control
    /// plane's oldest request by `now` ([`PrefillQueue::remaining`]).
    pub fn remaining_work(&self, now: Instant, fallback: Option<f64>) -> u64 {
        self.prefill
            .lock()
            .remaining(now, fallback)
            .saturating_add(self.peer_work.load(Ordering::Relaxed))
    }

    /// Prefill bytes per second, as this worker's reports showed.
    pub fn prefill_pace(&self) -> Option<f64> {
        self.prefill.lock().pace()
    }

    /// Estimated prefill work of this control plane's requests in flight.
    pub fn own_work(&self) -> u64 {
        self.prefill.lock().total()
    }

    /// Requests this worker finished since it was added.
    pub fn processed(&self) -> usize {
        self.processed.load(Ordering::Relaxed)
    }

    /// Whether the worker passes its health checks.
    pub fn is_healthy(&self) -> bool {
        self.health.healthy.load(Ordering::Relaxed)
    }

    /// Whether the worker gets new requests: healthy, and its circuit not
    /// open.
    pub fn is_available(&self) -> bool {
        self.is_healthy() && self.health.circuit.state() != CircuitState::Open
    }

    /// The server's circuit breaker (shared by its DP-rank units).
    pub fn circuit(&self) -> &Circuit {
        &self.health.circuit
    }

    /// Records a health check; returns true when the health state changed.
    pub fn record_check(&self, ok: bool, failure_threshold: u32, success_threshold: u32) -> bool {
        let h = &self.health;
        if ok {
            h.failures.store(0, Ordering::Relaxed);
            let n = h.successes.fetch_add(1, Ordering::Relaxed) + 1;
            if !self.is_healthy() && n >= success_threshold {
                // Back from an outage: a fresh circuit too.
                h.circuit.reset();
                return !h.healthy.swap(true, Ordering::Relaxed);
            }
        } else {
            h.successes.store(0, Ordering::Relaxed);
            let n = h.failures.fetch_add(1, Ordering::Relaxed) + 1;
            if self.is_healthy() && n >= failure_threshold {
                return h.healthy.swap(false, Ordering::Relaxed);
            }
        }
        false
    }

    /// Sets the health state directly; returns true when it changed.
    pub fn set_healthy(&self, healthy: bool) -> bool {
        let h = &self.health;
        h.failures.store(0, Ordering::Relaxed);
        h.successes.store(0, Ordering::Relaxed);
        h.healthy.swap(healthy, Ordering::Relaxed) != healthy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address() -> WorkerAddress {
        WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], 1)))
    }

    fn worker() -> Worker {
        Worker::new(address(), WorkerSpec::REGULAR, None, Arc::default(), 0)
    }

    #[test]
    fn dp_units_share_health_but_not_load() {
        let health = Arc::new(Health::default());
        let a = Worker::new(address(), WorkerSpec::REGULAR, Some(0), health.clone(), 0);
        let b = Worker::new(address(), WorkerSpec::REGULAR, Some(1), health, 1);
        assert_eq!(a.url, "http://127.0.0.1:1@0");
        assert_eq!(b.base_url, "http://127.0.0.1:1");
        a.set_healthy(true);
        assert!(b.is_healthy());
        a.increment_load();
        assert_eq!((a.load(), b.load()), (1, 0));
    }

    #[test]
    fn the_other_control_planes_counts_add_to_ours_and_an_engine_report_bounds_them_below() {
        let w = worker();
        let sent = w.start(100);
        w.set_peer_load(3, 500);
        assert_eq!(
            (w.routing_load(), w.pending_work(), w.own_work()),
            (4, 600, 100)
        );
        // An engine report above everyone's counts (traffic from elsewhere)
        // stands; one below them (read before they were sent) does not.
        w.engine.record(9);
        assert_eq!(w.routing_load(), 9);
        w.engine.record(1);
        assert_eq!(w.routing_load(), 4);
        w.set_peer_load(0, 0);
        w.finish(100, sent);
        // The report's request ended since it was read.
        assert_eq!((w.routing_load(), w.pending_work()), (0, 0));
    }

    #[test]
    fn routing_keys_count_distinct_keys_in_flight() {
        let w = worker();
        let (a, b) = (
            RoutingKey::from_header("a").unwrap(),
            RoutingKey::from_header("b").unwrap(),
        );
        w.hold_key(a);
        w.hold_key(a);
        w.hold_key(b);
        assert_eq!(w.routing_keys(), 2);
        w.release_key(a);
        assert_eq!(w.routing_keys(), 2, "a still has a request in flight");
        w.release_key(a);
        w.release_key(a);
        assert_eq!(w.routing_keys(), 1);
        w.release_key(b);
        assert_eq!(w.routing_keys(), 0);
    }

    #[test]
    fn load_never_goes_negative() {
        let w = worker();
        w.decrement_load();
        assert_eq!(w.load(), 0);
        w.increment_load();
        w.increment_load();
        w.decrement_load();
        assert_eq!(w.load(), 1);
    }

    #[test]
    fn health_follows_thresholds() {
        let w = worker();
        assert!(!w.is_healthy());
        assert!(!w.record_check(true, 3, 2));
        assert!(w.record_check(true, 3, 2));
        assert!(w.is_healthy());
        assert!(!w.record_check(false, 3, 2));
        assert!(!w.record_check(false, 3, 2));
        assert!(w.record_check(false, 3, 2));
        assert!(!w.is_healthy());
    }
}
