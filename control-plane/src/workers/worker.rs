use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use crate::tree::TenantId;
use crate::workers::WorkerAddress;

/// One registered worker: its address, health, and requests in flight.
#[derive(Debug)]
pub struct Worker {
    /// `http://host:port` as registered.
    pub url: String,
    /// The host of the URL (what PD mode sends as `bootstrap_host`).
    pub host: String,
    /// Where Envoy connects.
    pub endpoint: SocketAddr,
    /// `endpoint` as the `ip:port` text Envoy's override_host reads.
    pub endpoint_text: String,
    /// This worker's tenant in the approximate radix tree.
    pub tenant: TenantId,
    load: AtomicUsize,
    healthy: AtomicBool,
    failures: AtomicU32,
    successes: AtomicU32,
    processed: AtomicUsize,
}

impl Worker {
    /// A new worker; it starts unhealthy until a health check passes.
    pub fn new(address: WorkerAddress, tenant: TenantId) -> Self {
        Worker {
            endpoint_text: address.endpoint.to_string(),
            url: address.url,
            host: address.host,
            endpoint: address.endpoint,
            tenant,
            load: AtomicUsize::new(0),
            healthy: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            successes: AtomicU32::new(0),
            processed: AtomicUsize::new(0),
        }
    }

    /// Requests sent to this worker whose end has not been reported yet.
    pub fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }

    /// Counts one more request in flight.
    pub fn increment_load(&self) {
        self.load.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one request as finished (never below zero).
    pub fn decrement_load(&self) {
        let _ = self
            .load
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1));
        self.processed.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests this worker finished since it was added.
    pub fn processed(&self) -> usize {
        self.processed.load(Ordering::Relaxed)
    }

    /// Whether the worker gets new requests.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Records a health check; returns true when the health state changed.
    pub fn record_check(&self, ok: bool, failure_threshold: u32, success_threshold: u32) -> bool {
        if ok {
            self.failures.store(0, Ordering::Relaxed);
            let n = self.successes.fetch_add(1, Ordering::Relaxed) + 1;
            if !self.is_healthy() && n >= success_threshold {
                return !self.healthy.swap(true, Ordering::Relaxed);
            }
        } else {
            self.successes.store(0, Ordering::Relaxed);
            let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
            if self.is_healthy() && n >= failure_threshold {
                return self.healthy.swap(false, Ordering::Relaxed);
            }
        }
        false
    }

    /// Sets the health state directly; returns true when it changed.
    pub fn set_healthy(&self, healthy: bool) -> bool {
        self.failures.store(0, Ordering::Relaxed);
        self.successes.store(0, Ordering::Relaxed);
        self.healthy.swap(healthy, Ordering::Relaxed) != healthy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> Worker {
        Worker::new(
            WorkerAddress {
                url: "http://127.0.0.1:1".into(),
                host: "127.0.0.1".into(),
                endpoint: "127.0.0.1:1".parse().unwrap(),
            },
            0,
        )
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
