use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::workers::{
    identity, CircuitConfig, CircuitState, Health, Role, ServerFacts, Worker, WorkerAddress,
    WorkerId, WorkerSpec,
};

/// Why a registry change was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    /// The URL (after normalisation) is registered already.
    #[error("worker {0} is already registered")]
    Duplicate(String),
    /// Another URL reaching the same server is registered already.
    #[error("worker {0} is already registered as {1}")]
    SameServer(String, String),
    /// No worker has this URL.
    #[error("worker {0} is not registered")]
    NotFound(String),
    /// Another server has this id (a state file edited by hand).
    #[error("worker id {0} is taken by another worker")]
    DuplicateId(WorkerId),
}

/// All registered workers (routing units: one per server, or one per DP rank
/// with `--dp-aware`).
///
/// Routing decisions read immutable snapshots (`available(role)`), swapped
/// atomically, so a decision takes no lock however many workers there are;
/// only the rare changes (add, remove, health flips, circuits opening and
/// closing) take the writer lock and rebuild the snapshots. Every change
/// bumps a version that EDS watches.
pub struct Registry {
    workers: Mutex<Vec<Arc<Worker>>>,
    all: ArcSwap<Vec<Arc<Worker>>>,
    /// Available units per role, indexed by [`role_index`].
    available: [ArcSwap<Vec<Arc<Worker>>>; 3],
    version: watch::Sender<u64>,
    next_tenant: AtomicU32,
    circuits: CircuitConfig,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new(CircuitConfig::default())
    }
}

impl Registry {
    /// An empty registry whose workers' circuits follow `circuits`.
    pub fn new(circuits: CircuitConfig) -> Self {
        Registry {
            workers: Mutex::new(Vec::new()),
            all: ArcSwap::from_pointee(Vec::new()),
            available: std::array::from_fn(|_| ArcSwap::from_pointee(Vec::new())),
            version: watch::Sender::new(1),
            next_tenant: AtomicU32::new(0),
            circuits,
        }
    }

    /// Registers a server with a fresh id; see [`Registry::add_with_id`].
    pub fn add(
        &self,
        address: WorkerAddress,
        spec: WorkerSpec,
        facts: impl Into<ServerFacts>,
    ) -> Result<Vec<Arc<Worker>>, RegistryError> {
        self.add_with_id(address, spec, facts, WorkerId::random())
    }

    /// Registers a server as `id` (unhealthy until its first good health
    /// check): one unit, or one per DP rank when `facts` (or the bare
    /// `dp_size` given in its place) has a DP size. Returns the units.
    pub fn add_with_id(
        &self,
        address: WorkerAddress,
        spec: WorkerSpec,
        facts: impl Into<ServerFacts>,
        id: WorkerId,
    ) -> Result<Vec<Arc<Worker>>, RegistryError> {
        let facts = facts.into();
        let mut workers = self.workers.lock();
        if workers.iter().any(|w| w.base_url == address.url) {
            return Err(RegistryError::Duplicate(address.url));
        }
        let server = identity(address.endpoint);
        if let Some(same) = workers.iter().find(|w| identity(w.endpoint) == server) {
            return Err(RegistryError::SameServer(
                address.url,
                same.base_url.clone(),
            ));
        }
        if workers.iter().any(|w| w.id == id) {
            return Err(RegistryError::DuplicateId(id));
        }
        let health = Arc::new(Health::default());
        let ranks: Vec<Option<u32>> = match facts.dp_size {
            Some(n) => (0..n.max(1)).map(Some).collect(),
            None => vec![None],
        };
        let units: Vec<Arc<Worker>> = ranks
            .into_iter()
            .map(|rank| {
                let tenant = self.next_tenant.fetch_add(1, Ordering::Relaxed);
                let mut unit =
                    Worker::new(address.clone(), spec, rank, health.clone(), tenant).with_id(id);
                unit.facts = facts.clone();
                Arc::new(unit)
            })
            .collect();
        workers.extend(units.iter().cloned());
        self.publish(&workers);
        Ok(units)
    }

    /// Unregisters the server with this (normalised) URL and all its units.
    pub fn remove(&self, url: &str) -> Result<Vec<Arc<Worker>>, RegistryError> {
        let mut workers = self.workers.lock();
        let (removed, kept): (Vec<_>, Vec<_>) = workers.drain(..).partition(|w| w.base_url == url);
        *workers = kept;
        if removed.is_empty() {
            return Err(RegistryError::NotFound(url.to_string()));
        }
        self.publish(&workers);
        Ok(removed)
    }

    /// Points the server registered under `base_url` at a new address: its
    /// DNS name resolves elsewhere now (a Kubernetes pod that moved keeps its
    /// name, not its IP). Its units are replaced in place by units at the new
    /// address with the same id, role and DP ranks; they are a new server to
    /// everything else (unhealthy until probed, a closed circuit, no cache
    /// history: a moved pod is a restarted process). Requests in flight
    /// finish on the old units. Returns the old units, empty when the
    /// address is the one it has.
    pub fn readdress(
        &self,
        base_url: &str,
        address: WorkerAddress,
    ) -> Result<Vec<Arc<Worker>>, RegistryError> {
        let mut workers = self.workers.lock();
        let Some(first) = workers.iter().find(|w| w.base_url == base_url) else {
            return Err(RegistryError::NotFound(base_url.to_string()));
        };
        if first.endpoint == address.endpoint {
            return Ok(Vec::new());
        }
        let server = identity(address.endpoint);
        if let Some(same) = workers
            .iter()
            .find(|w| w.base_url != base_url && identity(w.endpoint) == server)
        {
            return Err(RegistryError::SameServer(
                base_url.to_string(),
                same.base_url.clone(),
            ));
        }
        let health = Arc::new(Health::default());
        let mut old = Vec::new();
        for slot in workers.iter_mut().filter(|w| w.base_url == base_url) {
            let tenant = self.next_tenant.fetch_add(1, Ordering::Relaxed);
            let mut unit = Worker::new(
                address.clone(),
                slot.spec,
                slot.dp_rank,
                health.clone(),
                tenant,
            )
            .with_id(slot.id);
            unit.facts = slot.facts.clone();
            old.push(std::mem::replace(slot, Arc::new(unit)));
        }
        self.publish(&workers);
        Ok(old)
    }

    /// Sets a worker's health and republishes the snapshots if it changed.
    pub fn set_healthy(&self, worker: &Worker, healthy: bool) {
        if worker.set_healthy(healthy) {
            self.health_changed();
        }
    }

    /// Republishes the snapshots after a worker's health flipped.
    pub fn health_changed(&self) {
        let workers = self.workers.lock();
        self.publish(&workers);
    }

    /// Whether a server with this normalised URL is registered.
    pub fn contains(&self, base_url: &str) -> bool {
        self.all.load().iter().any(|w| w.base_url == base_url)
    }

    /// The unit registered under this URL (`@rank` for a DP rank).
    pub fn get(&self, url: &str) -> Option<Arc<Worker>> {
        self.all.load().iter().find(|w| w.url == url).cloned()
    }

    /// The units of the server with this id (empty when there is none).
    pub fn by_id(&self, id: WorkerId) -> Vec<Arc<Worker>> {
        self.all
            .load()
            .iter()
            .filter(|w| w.id == id)
            .cloned()
            .collect()
    }

    /// The units of the server registered under this normalised URL.
    pub fn by_base_url(&self, base_url: &str) -> Vec<Arc<Worker>> {
        self.all
            .load()
            .iter()
            .filter(|w| w.base_url == base_url)
            .cloned()
            .collect()
    }

    /// Every registered worker, in registration order.
    pub fn all(&self) -> Arc<Vec<Arc<Worker>>> {
        self.all.load_full()
    }

    /// The units of `role` that may get new requests (healthy, circuit not
    /// open), in registration order.
    pub fn available(&self, role: Role) -> Arc<Vec<Arc<Worker>>> {
        self.available[role_index(role)].load_full()
    }

    /// Records the outcome of one request (or one attempt of it) on
    /// `worker`'s server, opening or closing its circuit.
    pub fn record_outcome(&self, worker: &Worker, ok: bool) {
        let Some(state) = worker.circuit().record(ok, Instant::now(), &self.circuits) else {
            return;
        };
        match state {
            CircuitState::Open => {
                warn!(worker = %worker.base_url, "circuit opened: the worker keeps failing requests")
            }
            _ => info!(worker = %worker.base_url, state = state.as_str(), "circuit changed"),
        }
        self.health_changed();
    }

    /// Moves open circuits whose time is up to half-open (their workers get
    /// requests again). Call about once a second.
    pub fn tick_circuits(&self) {
        let now = Instant::now();
        let mut changed = false;
        let mut seen = std::collections::HashSet::new();
        for w in self.all.load().iter() {
            if seen.insert(w.base_url.as_str()) && w.circuit().tick(now, &self.circuits) {
                info!(worker = %w.base_url, "circuit half-open: the worker gets requests again");
                changed = true;
            }
        }
        if changed {
            self.health_changed();
        }
    }

    /// Notified on every change; the value is the registry version.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    fn publish(&self, workers: &[Arc<Worker>]) {
        self.all.store(Arc::new(workers.to_vec()));
        for role in [Role::Regular, Role::Prefill, Role::Decode] {
            let available = workers
                .iter()
                .filter(|w| w.role() == role && w.is_available())
                .cloned()
                .collect();
            self.available[role_index(role)].store(Arc::new(available));
        }
        self.version.send_modify(|v| *v += 1);
    }
}

fn role_index(role: Role) -> usize {
    match role {
        Role::Regular => 0,
        Role::Prefill => 1,
        Role::Decode => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(port: u16) -> WorkerAddress {
        WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn add_remove_and_snapshots() {
        let r = Registry::default();
        let rx = r.subscribe();
        let v0 = *rx.borrow();
        let a = r
            .add(address(1), WorkerSpec::REGULAR, None)
            .unwrap()
            .remove(0);
        let b = r
            .add(address(2), WorkerSpec::REGULAR, None)
            .unwrap()
            .remove(0);
        assert_ne!(a.tenant, b.tenant);
        assert_ne!(a.id, b.id);
        assert_eq!(r.by_id(a.id).len(), 1);
        assert_eq!(
            r.add(address(1), WorkerSpec::REGULAR, None).unwrap_err(),
            RegistryError::Duplicate("http://127.0.0.1:1".into())
        );
        assert_eq!(r.all().len(), 2);
        assert!(
            r.available(Role::Regular).is_empty(),
            "new workers start unhealthy"
        );
        r.set_healthy(&a, true);
        assert_eq!(r.available(Role::Regular).len(), 1);
        assert_eq!(r.available(Role::Regular)[0].url, a.url);
        r.remove(&a.url).unwrap();
        assert!(r.available(Role::Regular).is_empty());
        assert_eq!(r.all().len(), 1);
        assert!(r.remove(&a.url).is_err());
        assert!(*rx.borrow() >= v0 + 4);
    }

    #[test]
    fn dp_ranks_are_units_of_one_server_and_roles_are_separate() {
        let r = Registry::default();
        let decode = WorkerSpec::Decode;
        let id = WorkerId::random();
        let units = r.add_with_id(address(1), decode, Some(4), id).unwrap();
        assert_eq!(units.len(), 4);
        assert!(
            units.iter().all(|u| u.id == id),
            "ranks share the server's id"
        );
        assert_eq!(r.by_id(id).len(), 4);
        assert_eq!(
            r.add_with_id(address(3), WorkerSpec::REGULAR, None, id)
                .unwrap_err(),
            RegistryError::DuplicateId(id)
        );
        let prefill = WorkerSpec::Prefill {
            bootstrap_port: Some(9000),
        };
        let p = r.add(address(2), prefill, None).unwrap();
        r.set_healthy(&units[0], true);
        r.set_healthy(&p[0], true);
        let healthy = r.available(Role::Decode);
        let ranks: Vec<_> = healthy.iter().map(|w| w.dp_rank).collect();
        assert_eq!(ranks, [Some(0), Some(1), Some(2), Some(3)]);
        assert_eq!(r.available(Role::Prefill).len(), 1);
        assert!(r.available(Role::Regular).is_empty());
        assert_eq!(r.remove("http://127.0.0.1:1").unwrap().len(), 4);
        assert_eq!(r.all().len(), 1);
    }

    #[test]
    fn a_moved_server_keeps_its_name_id_and_ranks_at_a_new_address() {
        let r = Registry::default();
        let named = |ip: [u8; 4]| WorkerAddress {
            url: "http://worker.test:30000".into(),
            host: "worker.test".into(),
            endpoint: std::net::SocketAddr::from((ip, 30000)),
            tls: false,
        };
        let decode = WorkerSpec::Decode;
        let old = r.add(named([10, 0, 0, 1]), decode, Some(2)).unwrap();
        let other = r.add(address(4), decode, None).unwrap();
        r.set_healthy(&old[0], true);
        assert_eq!(r.available(Role::Decode).len(), 2);
        let version = *r.subscribe().borrow();

        // The same address: nothing changes.
        assert!(r
            .readdress(&old[0].base_url, named([10, 0, 0, 1]))
            .unwrap()
            .is_empty());
        let replaced = r.readdress(&old[0].base_url, named([10, 0, 0, 2])).unwrap();
        assert_eq!(replaced.len(), 2);
        assert!(*r.subscribe().borrow() > version, "EDS is told");
        let now = r.by_base_url(&old[0].base_url);
        let ranks: Vec<_> = now.iter().map(|u| (u.id, u.dp_rank, u.role())).collect();
        assert_eq!(
            ranks,
            [
                (old[0].id, Some(0), Role::Decode),
                (old[0].id, Some(1), Role::Decode)
            ]
        );
        assert!(now.iter().all(|u| u.endpoint_text == "10.0.0.2:30000"));
        assert!(now.iter().all(|u| old.iter().all(|o| o.tenant != u.tenant)));
        // A new process: no traffic until a health check passes.
        assert!(!now[0].is_healthy());
        assert_eq!(r.available(Role::Decode).len(), 0);
        // Registration order kept; another server's address is refused.
        assert_eq!(r.all()[2].url, other[0].url);
        assert_eq!(
            r.readdress(&old[0].base_url, address(4)).unwrap_err(),
            RegistryError::SameServer(old[0].base_url.clone(), other[0].base_url.clone())
        );
        assert!(r.readdress("http://gone.test:1", address(5)).is_err());
    }
}
