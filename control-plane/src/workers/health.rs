//! Health checks: each server's health endpoint is probed on its own
//! schedule (see `probe_schedule.rs`): every interval while healthy, within
//! seconds while not, so workers that start after the router, or come back
//! after an outage, serve within seconds of answering.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::workers::probe_schedule::{ProbePlan, Schedule};
use crate::workers::{error_chain, Registry, Worker};

/// How health is checked (from the `--health-*` flags, see
/// `config/options.rs`).
#[derive(Debug, Clone)]
pub struct HealthOptions {
    /// The path probed on each server (`--health-check-endpoint`).
    pub path: String,
    /// The longest one probe may take.
    pub timeout: Duration,
    /// When each server is probed.
    pub plan: ProbePlan,
    /// Consecutive failed probes that take a healthy server out.
    pub failure_threshold: u32,
    /// Consecutive good probes that bring a server that was healthy back.
    pub success_threshold: u32,
    /// `--disable-health-check`: every check passes without a request.
    pub disabled: bool,
}

/// Checks the workers' health endpoint and flips their health state: a
/// server never healthy yet on its first good check, one that was healthy
/// after the configured number of consecutive failures or successes.
pub struct HealthChecker {
    registry: Arc<Registry>,
    client: reqwest::Client,
    options: HealthOptions,
    /// Servers (base URLs) being checked because a request failed on them,
    /// so that a burst of failed requests probes each once.
    suspected: Mutex<HashSet<String>>,
    /// When the fleet was last checked because a worker was found down.
    last_sweep: Mutex<Option<Instant>>,
}

/// The least time between two checks of the whole fleet on suspicion.
const SWEEP_SPACING: Duration = Duration::from_secs(1);

/// A server the checker follows, by its first unit (DP-rank units share
/// their server's health).
struct Tracked {
    unit: Arc<Worker>,
    /// Tells this server's probe results from those of a server that was
    /// registered before it under the same key.
    serial: u64,
    schedule: Schedule,
    /// Healthy at some point since it was registered: from then on the
    /// success threshold applies.
    admitted: bool,
    /// A probe is running.
    probing: bool,
}

impl HealthChecker {
    /// A checker for `registry` checking as `options` say, through
    /// `client`, the control plane's one client for workers (see
    /// [`crate::workers::worker_client`]): an `https://` worker is healthy
    /// only when its TLS handshake passes too.
    pub fn new(registry: Arc<Registry>, options: HealthOptions, client: reqwest::Client) -> Self {
        HealthChecker {
            registry,
            client,
            options,
            suspected: Mutex::new(HashSet::new()),
            last_sweep: Mutex::new(None),
        }
    }

    /// One GET of the health endpoint; true on a 2xx answer.
    pub async fn probe(&self, worker: &Worker) -> bool {
        self.check(worker).await.is_ok()
    }

    /// One GET of the health endpoint; why it failed otherwise (the TLS
    /// reason included: unknown CA, missing client certificate...).
    async fn check(&self, worker: &Worker) -> Result<(), String> {
        if self.options.disabled {
            // Workers are taken as healthy; only their circuits (failed
            // requests) keep one out.
            return Ok(());
        }
        let url = format!("{}{}", worker.base_url, self.options.path);
        match self
            .client
            .get(&url)
            .timeout(self.options.timeout)
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("{} answered {}", self.options.path, r.status())),
            Err(e) => Err(error_chain(&e)),
        }
    }

    /// A newly added worker: healthy at once if its first check passes (no
    /// reason to wait for the success threshold before its first request).
    /// For callers that answer only once the worker can serve; the checker
    /// probes new servers at once anyway.
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

    /// Checks, in the background, each worker a request's attempts failed
    /// on (see [`HealthChecker::suspect`]).
    pub fn suspect_each(self: &Arc<Self>, failed: &[Arc<Worker>]) {
        if failed.is_empty() {
            return; // the common case: every request's end comes here
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for worker in failed {
            let (this, worker) = (self.clone(), worker.clone());
            runtime.spawn(async move { this.suspect(&worker).await });
        }
    }

    /// Evidence that a worker failed a request (a refused connection, a
    /// reset, a 5xx): check it now and take it out of rotation at once if
    /// it is down, rather than after `failure_threshold` intervals. A worker
    /// found down is seldom alone (a node, a rollout, the whole fleet), so
    /// every other healthy server is checked at once too: the router stops
    /// naming dead endpoints after one failed request, not one per worker.
    pub async fn suspect(&self, worker: &Worker) {
        if !self.suspected.lock().insert(worker.base_url.clone()) {
            return; // already being checked
        }
        let down = !self.probe(worker).await;
        self.suspected.lock().remove(&worker.base_url);
        if !down || !worker.is_healthy() {
            return;
        }
        warn!(worker = %worker.base_url, "worker failed a request and its health check; marking unhealthy");
        self.registry.set_healthy(worker, false);
        self.sweep().await;
    }

    /// Checks every healthy server now (at most once per [`SWEEP_SPACING`]);
    /// those that fail are taken out of rotation at once.
    async fn sweep(&self) {
        {
            let mut last = self.last_sweep.lock();
            if last.is_some_and(|t| t.elapsed() < SWEEP_SPACING) {
                return;
            }
            *last = Some(Instant::now());
        }
        let all = self.registry.all();
        let mut seen = HashSet::new();
        let servers: Vec<&Arc<Worker>> = all
            .iter()
            .filter(|w| w.is_healthy() && seen.insert(w.base_url.as_str()))
            .collect();
        let checks = servers
            .iter()
            .map(|w| async move { (*w, self.probe(w).await) });
        for (worker, up) in futures::future::join_all(checks).await {
            if !up && worker.is_healthy() {
                warn!(worker = %worker.base_url, "worker failed its health check after another was found down; marking unhealthy");
                self.registry.set_healthy(worker, false);
            }
        }
    }

    /// Records one probe of `tracked`'s server.
    fn record(&self, tracked: &mut Tracked, result: Result<(), String>) {
        let ok = result.is_ok();
        let unit = &tracked.unit;
        let changed = if ok && !tracked.admitted && !unit.is_healthy() {
            // First time up (at startup, or added): no threshold, as
            // sglang-router activates a worker on its first good check.
            self.registry.set_healthy(unit, true);
            true
        } else if unit.record_check(
            ok,
            self.options.failure_threshold,
            self.options.success_threshold,
        ) {
            self.registry.health_changed();
            true
        } else {
            false
        };
        let healthy = unit.is_healthy();
        if changed && healthy {
            info!(worker = %unit.base_url, id = %unit.id, "worker is healthy");
            if unit.model().is_none() && !self.options.disabled {
                self.learn_model(&unit.base_url);
            }
        } else if changed {
            let reason = result.err().unwrap_or_default();
            warn!(worker = %unit.base_url, id = %unit.id, %reason, "worker is unhealthy");
        }
        tracked.admitted |= healthy;
        tracked
            .schedule
            .probed(Instant::now(), ok, healthy, &self.options.plan);
    }

    /// Reads, in the background, the model of the server at `base_url`,
    /// which did not tell it when it was added (it was not up yet), and
    /// records it on each of its units: model-aware routing needs it.
    fn learn_model(&self, base_url: &str) {
        let (registry, client, base_url) = (
            self.registry.clone(),
            self.client.clone(),
            base_url.to_string(),
        );
        tokio::spawn(async move {
            let Some(model) = super::served_model(&client, &base_url).await else {
                return;
            };
            let model: Arc<str> = model.into();
            info!(worker = %base_url, %model, "worker's model read once it was healthy");
            for unit in registry.by_base_url(&base_url) {
                unit.learn_model(model.clone());
            }
            // `/workers` and the model list follow the registry's version.
            registry.health_changed();
        });
    }

    /// Follows the registry: new servers are probed at once, then each on
    /// its schedule, until the task is dropped.
    pub async fn run(self: Arc<Self>) {
        let mut changes = self.registry.subscribe();
        let (done_tx, mut done) = mpsc::unbounded_channel::<(usize, u64, Result<(), String>)>();
        let mut servers: HashMap<usize, Tracked> = HashMap::new();
        let mut serials = 0u64;
        loop {
            self.follow_registry(&mut servers, &mut serials);
            let now = Instant::now();
            for (key, tracked) in servers.iter_mut() {
                if tracked.probing || tracked.schedule.due() > now {
                    continue;
                }
                tracked.probing = true;
                let (this, unit, tx) = (self.clone(), tracked.unit.clone(), done_tx.clone());
                let (key, serial) = (*key, tracked.serial);
                tokio::spawn(async move {
                    let result = this.check(&unit).await;
                    let _ = tx.send((key, serial, result));
                });
            }
            let next = servers
                .values()
                .filter(|t| !t.probing)
                .map(|t| t.schedule.due())
                .min()
                .unwrap_or_else(|| now + self.options.plan.interval);
            tokio::select! {
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(next)) => {}
                changed = changes.changed() => {
                    if changed.is_err() {
                        return; // the registry is gone
                    }
                }
                Some((key, serial, result)) = done.recv() => {
                    if let Some(tracked) = servers.get_mut(&key).filter(|t| t.serial == serial) {
                        tracked.probing = false;
                        self.record(tracked, result);
                    }
                }
            }
        }
    }

    /// Starts following new servers, forgets removed ones, and moves a
    /// server whose health changed outside the probes to its new schedule.
    fn follow_registry(&self, servers: &mut HashMap<usize, Tracked>, serials: &mut u64) {
        let all = self.registry.all();
        let now = Instant::now();
        let mut seen = HashSet::new();
        let mut live = HashSet::new();
        for unit in all.iter().filter(|w| seen.insert(w.base_url.as_str())) {
            // Keyed by the unit's address: the Arc held here keeps it from
            // being reused, and a server removed and added again is new.
            let key = Arc::as_ptr(unit) as usize;
            live.insert(key);
            let healthy = unit.is_healthy();
            let tracked = servers.entry(key).or_insert_with(|| Tracked {
                unit: unit.clone(),
                serial: {
                    *serials += 1;
                    *serials
                },
                schedule: Schedule::new(now, healthy),
                admitted: healthy,
                probing: false,
            });
            tracked
                .schedule
                .health_changed(now, healthy, &self.options.plan);
            tracked.admitted |= healthy;
        }
        servers.retain(|key, _| live.contains(key));
    }
}
