//! Workers on their way in: a server is registered at once when it can be,
//! and otherwise in the background, for as long as
//! `--worker-startup-timeout-secs`, while it cannot be reached yet (its host
//! name does not resolve, or, with `--dp-aware`, it does not answer
//! `/get_server_info` with its `dp_size`). The `/workers` API shows those
//! background registrations as sglang-router shows its jobs.
//!
//! A registered worker that is down is not a registration problem: it is
//! registered unhealthy and the health checker admits it once it answers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tracing::{debug, error, info, warn};

use crate::engine::{Engine, WorkerChangeError};
use crate::workers::{RegistryError, Worker, WorkerId, WorkerSpec};

/// First wait between two registration attempts; each retry waits a second
/// longer, up to [`MAX_RETRY_DELAY`] (sglang-router's startup probe).
const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
/// Longest wait between two registration attempts.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// Where a background registration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Still trying.
    Processing,
    /// Gave up: the worker stayed unreachable for the startup timeout, or
    /// turned out to be one the router cannot take.
    Failed,
}

impl JobState {
    /// sglang-router's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Processing => "processing",
            JobState::Failed => "failed",
        }
    }
}

/// A background registration.
#[derive(Debug, Clone)]
pub struct Job {
    /// The id the worker gets once registered.
    pub id: WorkerId,
    /// Its URL, normalised.
    pub url: String,
    /// Its role and bootstrap port.
    pub spec: WorkerSpec,
    /// Still trying, or given up.
    pub state: JobState,
    /// Why the last attempt failed.
    pub message: Option<String>,
    /// When the job started or last changed state.
    pub since: SystemTime,
}

/// What [`Enrollment::enroll`] did.
#[derive(Debug)]
pub enum Enrolled {
    /// Registered now, under this id; the health checker probes it at once
    /// and admits it once its health endpoint answers.
    Registered(WorkerId, Vec<Arc<Worker>>),
    /// Already registered under this URL, as this id: nothing changed.
    Existing(WorkerId),
    /// Being registered in the background, as this id.
    Pending(WorkerId),
}

impl Enrolled {
    /// The worker's id, whatever happened.
    pub fn id(&self) -> WorkerId {
        match self {
            Enrolled::Registered(id, _) | Enrolled::Existing(id) | Enrolled::Pending(id) => *id,
        }
    }
}

/// Registers workers now or in the background, and keeps the background
/// registrations' status.
pub struct Enrollment {
    engine: Arc<Engine>,
    timeout: Duration,
    jobs: Mutex<HashMap<WorkerId, Job>>,
}

impl Enrollment {
    /// Background registrations give up after `timeout`.
    pub fn new(engine: Arc<Engine>, timeout: Duration) -> Arc<Self> {
        Arc::new(Enrollment {
            engine,
            timeout,
            jobs: Mutex::new(HashMap::new()),
        })
    }

    /// Registers the server at `url` as `id` (a fresh one when `None`):
    /// now if it can be reached, else in the background. A URL registered
    /// or being registered already keeps its id. Errors are requests this
    /// router can never take (bad URL, wrong mode, forbidden address...).
    pub async fn enroll(
        self: &Arc<Self>,
        url: &str,
        spec: WorkerSpec,
        id: Option<WorkerId>,
    ) -> Result<Enrolled, WorkerChangeError> {
        let normalised = self.engine.check_worker(url, spec)?;
        if let Some(existing) = self.engine.registry().by_base_url(&normalised).first() {
            if existing.spec != spec {
                // Same server, another role or bootstrap port: not the same
                // request, and not one to apply silently.
                return Err(RegistryError::Duplicate(normalised).into());
            }
            return Ok(Enrolled::Existing(existing.id));
        }
        let retried = {
            let mut jobs = self.jobs.lock();
            let same_url = jobs.values().find(|j| j.url == normalised).cloned();
            match same_url {
                Some(job) if job.state == JobState::Processing => {
                    return Ok(Enrolled::Pending(job.id));
                }
                // Asked again after giving up: try again, under the same id.
                Some(job) => jobs.remove(&job.id).map(|j| j.id),
                None => None,
            }
        };
        // A stored id another server already has (a state file edited by
        // hand) is not worth refusing the worker for: it gets a new one.
        let id = retried
            .or(id.filter(|id| self.id_is_free(*id)))
            .unwrap_or_else(WorkerId::random);
        if !self.engine.options().dp_aware {
            // Only a name lookup away: no reason to answer before it is done.
            match self.engine.add_worker(url, spec, id).await {
                Ok(units) => {
                    self.registered_now(&units);
                    return Ok(Enrolled::Registered(id, units));
                }
                Err(e) if e.is_not_ready() => {
                    warn!(worker = %normalised, error = %e, "worker not reachable yet; registering it in the background");
                }
                Err(e) => return self.existing_or(&normalised, e),
            }
        }
        Ok(Enrolled::Pending(self.start_job(Job {
            id,
            url: normalised,
            spec,
            state: JobState::Processing,
            message: None,
            since: SystemTime::now(),
        })))
    }

    fn id_is_free(&self, id: WorkerId) -> bool {
        self.engine.registry().by_id(id).is_empty() && !self.jobs.lock().contains_key(&id)
    }

    /// The background registration of `id`, if there is one.
    pub fn job(&self, id: WorkerId) -> Option<Job> {
        self.jobs.lock().get(&id).cloned()
    }

    /// Every background registration, running or failed.
    pub fn jobs(&self) -> Vec<Job> {
        self.jobs.lock().values().cloned().collect()
    }

    /// The background registration of this (normalised) URL, if any.
    pub fn job_by_url(&self, url: &str) -> Option<Job> {
        self.jobs.lock().values().find(|j| j.url == url).cloned()
    }

    /// Stops the background registration of `id`; returns it.
    pub fn cancel(&self, id: WorkerId) -> Option<Job> {
        self.jobs.lock().remove(&id)
    }

    /// Unregisters the server at `url`, or stops its background
    /// registration (then no unit is returned).
    pub fn withdraw(&self, url: &str) -> Result<Vec<Arc<Worker>>, WorkerChangeError> {
        match self.engine.remove_worker(url) {
            Ok(units) => {
                if let Some(first) = units.first() {
                    info!(worker = %first.base_url, id = %first.id, "worker removed");
                }
                Ok(units)
            }
            Err(WorkerChangeError::Registry(RegistryError::NotFound(normalised))) => {
                match self.job_by_url(&normalised) {
                    Some(job) => {
                        self.cancel(job.id);
                        info!(worker = %job.url, id = %job.id, "worker registration cancelled");
                        Ok(Vec::new())
                    }
                    None => Err(RegistryError::NotFound(normalised).into()),
                }
            }
            Err(e) => Err(e),
        }
    }

    fn registered(&self, normalised: &str) -> Option<WorkerId> {
        self.engine
            .registry()
            .by_base_url(normalised)
            .first()
            .map(|w| w.id)
    }

    /// `e`, unless it says the URL got registered meanwhile (two requests
    /// for one worker at once): then the id it got.
    fn existing_or(
        &self,
        normalised: &str,
        e: WorkerChangeError,
    ) -> Result<Enrolled, WorkerChangeError> {
        match (&e, self.registered(normalised)) {
            (WorkerChangeError::Registry(RegistryError::Duplicate(_)), Some(id)) => {
                Ok(Enrolled::Existing(id))
            }
            _ => Err(e),
        }
    }

    /// Logs a registration; the health checker probes the new server at
    /// once and admits it as soon as it answers.
    fn registered_now(&self, units: &[Arc<Worker>]) {
        if let Some(first) = units.first() {
            info!(worker = %first.base_url, id = %first.id, role = first.role().as_str(), units = units.len(), "worker registered");
        }
    }

    /// Starts `job`, unless one for its URL started meanwhile (two requests
    /// for one worker at once). Returns the id of the job that runs.
    fn start_job(self: &Arc<Self>, job: Job) -> WorkerId {
        let (id, url, spec) = (job.id, job.url.clone(), job.spec);
        {
            let mut jobs = self.jobs.lock();
            if let Some(running) = jobs.values().find(|j| j.url == url) {
                return running.id;
            }
            jobs.insert(id, job);
        }
        let this = self.clone();
        tokio::spawn(async move { this.run_job(id, url, spec).await });
        id
    }

    /// Tries to register `url` until it works, the job is cancelled, or the
    /// timeout passes.
    async fn run_job(self: Arc<Self>, id: WorkerId, url: String, spec: WorkerSpec) {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut delay = FIRST_RETRY_DELAY;
        loop {
            if self.job(id).is_none() {
                return; // cancelled
            }
            let e = match self.engine.add_worker(&url, spec, id).await {
                Ok(units) => {
                    if self.cancel(id).is_none() {
                        // Cancelled while the attempt ran: undo it.
                        let _ = self.engine.remove_worker(&url);
                        return;
                    }
                    self.registered_now(&units);
                    return;
                }
                Err(e) => e,
            };
            if e.is_not_ready() && tokio::time::Instant::now() < deadline {
                debug!(worker = %url, error = %e, "worker not ready; retrying");
                if let Some(job) = self.jobs.lock().get_mut(&id) {
                    job.message = Some(e.to_string());
                }
                tokio::time::sleep(delay).await;
                delay = (delay + FIRST_RETRY_DELAY).min(MAX_RETRY_DELAY);
                continue;
            }
            if self.registered(&url).is_some() {
                // Registered by another way meanwhile (/add_worker).
                self.cancel(id);
                return;
            }
            error!(worker = %url, error = %e, timeout_secs = self.timeout.as_secs(), "gave up registering worker");
            if let Some(job) = self.jobs.lock().get_mut(&id) {
                job.state = JobState::Failed;
                job.message = Some(e.to_string());
                job.since = SystemTime::now();
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineOptions, Policies};
    use crate::metrics::Metrics;
    use crate::policy::RoundRobin;
    use crate::workers::Registry;

    fn enrollment_with(options: EngineOptions) -> Arc<Enrollment> {
        let engine = Engine::new(
            Arc::new(Registry::default()),
            Policies::same(Arc::new(RoundRobin::default())),
            Arc::new(Metrics::default()),
            options,
        );
        Enrollment::new(Arc::new(engine), Duration::from_secs(60))
    }

    fn enrollment(dp_aware: bool) -> Arc<Enrollment> {
        enrollment_with(EngineOptions {
            dp_aware,
            ..Default::default()
        })
    }

    /// A loopback port nothing listens on.
    fn closed_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap()
    }

    #[tokio::test]
    async fn a_url_keeps_its_id_and_its_role() {
        let e = enrollment(false);
        let url = format!("http://127.0.0.1:{}", closed_port());
        let given = WorkerId::random();
        let first = e
            .enroll(&url, WorkerSpec::REGULAR, Some(given))
            .await
            .unwrap();
        assert!(
            matches!(first, Enrolled::Registered(id, ref units) if id == given && units.len() == 1)
        );
        let again = e
            .enroll(&format!("{url}/"), WorkerSpec::REGULAR, None)
            .await
            .unwrap();
        assert!(matches!(again, Enrolled::Existing(id) if id == given));
        let other_role = WorkerSpec::Decode;
        assert!(
            e.enroll(&url, other_role, None).await.is_err(),
            "wrong mode"
        );
        // A taken id is replaced, not fatal.
        let url2 = format!("http://127.0.0.1:{}", closed_port());
        let second = e
            .enroll(&url2, WorkerSpec::REGULAR, Some(given))
            .await
            .unwrap();
        assert_ne!(second.id(), given);
    }

    #[tokio::test]
    async fn a_registered_url_is_not_taken_again_in_another_role() {
        let e = enrollment_with(EngineOptions {
            mode: sglang_envoy_lifecycle::Mode::Pd,
            ..Default::default()
        });
        let url = format!("http://127.0.0.1:{}", closed_port());
        let decode = WorkerSpec::Decode;
        let prefill = WorkerSpec::Prefill {
            bootstrap_port: Some(8998),
        };
        let id = e.enroll(&url, decode, None).await.unwrap().id();
        assert!(matches!(
            e.enroll(&url, decode, None).await.unwrap(),
            Enrolled::Existing(same) if same == id
        ));
        let err = e.enroll(&url, prefill, None).await.unwrap_err();
        assert!(err.to_string().contains("already registered"), "{err}");
        assert_eq!(e.engine.registry().all().len(), 1);
    }

    #[tokio::test]
    async fn an_unreachable_dp_aware_worker_waits_in_the_background_until_called_off() {
        let e = enrollment(true);
        let url = format!("http://127.0.0.1:{}", closed_port());
        let pending = e.enroll(&url, WorkerSpec::REGULAR, None).await.unwrap();
        let Enrolled::Pending(id) = pending else {
            panic!("expected a background registration, got {pending:?}");
        };
        let again = e.enroll(&url, WorkerSpec::REGULAR, None).await.unwrap();
        assert!(matches!(again, Enrolled::Pending(same) if same == id));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let job = e.job(id).expect("the job is listed");
        assert_eq!(job.state, JobState::Processing);
        assert!(
            job.message.is_some_and(|m| m.contains("dp_size")),
            "the last attempt's error is shown"
        );
        assert_eq!(e.job_by_url(&url).map(|j| j.id), Some(id));
        assert!(e.cancel(id).is_some());
        assert!(e.job(id).is_none());
        assert!(e.engine.registry().all().is_empty());
    }
}
