use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::workers::{Worker, WorkerAddress};

/// Why a registry change was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    /// The URL (after normalisation) is registered already.
    #[error("worker {0} is already registered")]
    Duplicate(String),
    /// No worker has this URL.
    #[error("worker {0} is not registered")]
    NotFound(String),
}

/// All registered workers.
///
/// Routing decisions read immutable snapshots (`healthy()`), swapped
/// atomically, so a decision takes no lock however many workers there are;
/// only the rare changes (add, remove, health flips) take the writer lock and
/// rebuild the snapshots. Every change bumps a version that EDS watches.
pub struct Registry {
    workers: Mutex<Vec<Arc<Worker>>>,
    all: ArcSwap<Vec<Arc<Worker>>>,
    healthy: ArcSwap<Vec<Arc<Worker>>>,
    version: watch::Sender<u64>,
    next_tenant: AtomicU32,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            workers: Mutex::new(Vec::new()),
            all: ArcSwap::from_pointee(Vec::new()),
            healthy: ArcSwap::from_pointee(Vec::new()),
            version: watch::Sender::new(1),
            next_tenant: AtomicU32::new(0),
        }
    }
}

impl Registry {
    /// Registers a worker (unhealthy until its first good health check).
    pub fn add(&self, address: WorkerAddress) -> Result<Arc<Worker>, RegistryError> {
        let mut workers = self.workers.lock();
        if workers.iter().any(|w| w.url == address.url) {
            return Err(RegistryError::Duplicate(address.url));
        }
        let tenant = self.next_tenant.fetch_add(1, Ordering::Relaxed);
        let worker = Arc::new(Worker::new(address, tenant));
        workers.push(worker.clone());
        self.publish(&workers);
        Ok(worker)
    }

    /// Unregisters the worker with this (normalised) URL.
    pub fn remove(&self, url: &str) -> Result<Arc<Worker>, RegistryError> {
        let mut workers = self.workers.lock();
        let index = workers
            .iter()
            .position(|w| w.url == url)
            .ok_or_else(|| RegistryError::NotFound(url.to_string()))?;
        let worker = workers.remove(index);
        self.publish(&workers);
        Ok(worker)
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

    /// The worker registered under this normalised URL.
    #[cfg(test)]
    pub fn get(&self, url: &str) -> Option<Arc<Worker>> {
        self.all.load().iter().find(|w| w.url == url).cloned()
    }

    /// Every registered worker, in registration order.
    pub fn all(&self) -> Arc<Vec<Arc<Worker>>> {
        self.all.load_full()
    }

    /// The workers that may get new requests, in registration order.
    pub fn healthy(&self) -> Arc<Vec<Arc<Worker>>> {
        self.healthy.load_full()
    }

    /// Notified on every change; the value is the registry version.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    fn publish(&self, workers: &[Arc<Worker>]) {
        self.all.store(Arc::new(workers.to_vec()));
        let healthy = workers.iter().filter(|w| w.is_healthy()).cloned().collect();
        self.healthy.store(Arc::new(healthy));
        self.version.send_modify(|v| *v += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(port: u16) -> WorkerAddress {
        WorkerAddress {
            url: format!("http://127.0.0.1:{port}"),
            host: "127.0.0.1".into(),
            endpoint: format!("127.0.0.1:{port}").parse().unwrap(),
        }
    }

    #[test]
    fn add_remove_and_snapshots() {
        let r = Registry::default();
        let rx = r.subscribe();
        let v0 = *rx.borrow();
        let a = r.add(address(1)).unwrap();
        let b = r.add(address(2)).unwrap();
        assert_ne!(a.tenant, b.tenant);
        assert_eq!(
            r.add(address(1)).unwrap_err(),
            RegistryError::Duplicate("http://127.0.0.1:1".into())
        );
        assert_eq!(r.all().len(), 2);
        assert!(r.healthy().is_empty(), "new workers start unhealthy");
        r.set_healthy(&a, true);
        assert_eq!(r.healthy().len(), 1);
        assert_eq!(r.healthy()[0].url, a.url);
        r.remove(&a.url).unwrap();
        assert!(r.healthy().is_empty());
        assert_eq!(r.all().len(), 1);
        assert!(r.remove(&a.url).is_err());
        assert!(*rx.borrow() >= v0 + 4);
    }
}
