use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::config::Args;
use crate::workers::{error_chain, Registry, Worker};

/// Checks the workers' health endpoint and flips their health state after
/// the configured number of consecutive failures or successes.
pub struct HealthChecker {
    registry: Arc<Registry>,
    client: reqwest::Client,
    path: String,
    timeout: Duration,
    interval: Duration,
    failure_threshold: u32,
    success_threshold: u32,
}

impl HealthChecker {
    /// A checker for `registry` with the flags' intervals and thresholds,
    /// checking through `client`, the control plane's one client for
    /// workers (see [`crate::workers::worker_client`]): an `https://`
    /// worker is healthy only when its TLS handshake passes too.
    pub fn new(registry: Arc<Registry>, args: &Args, client: reqwest::Client) -> Self {
        HealthChecker {
            registry,
            client,
            path: args.health_check_endpoint.clone(),
            timeout: Duration::from_secs(args.health_check_timeout_secs),
            interval: Duration::from_secs(args.health_check_interval_secs),
            failure_threshold: args.health_failure_threshold,
            success_threshold: args.health_success_threshold,
        }
    }

    /// One GET of the health endpoint; true on a 2xx answer.
    pub async fn probe(&self, worker: &Worker) -> bool {
        self.check(worker).await.is_ok()
    }

    /// One GET of the health endpoint; why it failed otherwise (the TLS
    /// reason included: unknown CA, missing client certificate...).
    async fn check(&self, worker: &Worker) -> Result<(), String> {
        let url = format!("{}{}", worker.base_url, self.path);
        match self.client.get(&url).timeout(self.timeout).send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("{} answered {}", self.path, r.status())),
            Err(e) => Err(error_chain(&e)),
        }
    }

    /// Checks every server once, concurrently (DP-rank units of one server
    /// share its health, so each server is probed once).
    pub async fn check_all(&self) {
        let workers = self.registry.all();
        let mut seen = std::collections::HashSet::new();
        let servers = workers.iter().filter(|w| seen.insert(w.base_url.as_str()));
        let checks = servers.map(|w| async move {
            let result = self.check(w).await;
            if w.record_check(
                result.is_ok(),
                self.failure_threshold,
                self.success_threshold,
            ) {
                self.registry.health_changed();
                match result {
                    Ok(()) => info!(worker = %w.base_url, "worker is healthy"),
                    Err(reason) => warn!(worker = %w.base_url, %reason, "worker is unhealthy"),
                }
            }
        });
        futures::future::join_all(checks).await;
    }

    /// A newly added worker: healthy at once if its first check passes (no
    /// reason to wait for the success threshold before its first request).
    pub async fn admit(&self, worker: &Worker) -> bool {
        match self.check(worker).await {
            Ok(()) => {
                self.registry.set_healthy(worker, true);
                true
            }
            Err(reason) => {
                warn!(worker = %worker.base_url, %reason, "worker failed its first health check");
                false
            }
        }
    }

    /// Evidence that a worker failed a request (Envoy had to fail over):
    /// check it now and take it out of rotation at once if it is down,
    /// rather than after `failure_threshold` intervals.
    pub async fn suspect(&self, worker: &Worker) {
        if !self.probe(worker).await && worker.is_healthy() {
            warn!(worker = %worker.base_url, "worker failed a request and its health check; marking unhealthy");
            self.registry.set_healthy(worker, false);
        }
    }

    /// Runs `check_all` every interval until the task is dropped.
    pub async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.check_all().await;
        }
    }
}
