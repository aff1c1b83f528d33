//! The worker list shared by several control planes through Redis (or
//! Valkey), `--fleet-store-url`: a worker added or removed through any
//! replica's admin API reaches every replica within a second, and a
//! restarted replica comes back with the list as it stands.
//!
//! What is stored: a hash `{prefix}:workers` (normalised URL → the worker
//! as the state file stores it: role, bootstrap port, id) and a counter
//! `{prefix}:version`, raised by every change. Each replica
//! - pushes the changes made through its own admin API (kept in an outbox
//!   while the store is unreachable, the latest per URL);
//! - reads the counter every [`POLL`], and the hash when it moved, and
//!   registers or removes workers to match it;
//! - adds the workers its flags name when it first reaches the store,
//!   without overwriting what is there (a worker its state file names is
//!   not added: the store says whether it was removed meanwhile);
//! - seeds the store with its whole list when the counter is gone (a new
//!   store, or a Redis restarted without its data), so no replica takes an
//!   empty store for an empty fleet.
//!
//! The store is off the request path. While it is down every replica keeps
//! routing on the list it has, as a single control plane does; changes made
//! meanwhile reach the others when it is back. Workers found by Kubernetes
//! discovery are not stored: every replica watches the cluster itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands as _;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::enrollment::Enrollment;
use crate::metrics::Metrics;
use crate::store_link::{timed, StoreError, StoreLink};
use crate::workers::{persist, persist::StoredWorker, Registry};

/// How often each replica reads the store's version.
const POLL: Duration = Duration::from_millis(250);
/// Changes kept for the store while it is unreachable (one per URL).
const OUTBOX_CAP: usize = 4096;

/// A change to the worker list made through this replica's admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    Added(StoredWorker),
    Removed,
}

/// This replica's side of the shared worker list.
pub struct FleetStore {
    client: redis::Client,
    prefix: String,
    /// The workers this replica's flags name.
    flags: Vec<StoredWorker>,
    workers_key: String,
    version_key: String,
    /// Changes not yet in the store, by normalised URL.
    outbox: Mutex<HashMap<String, Change>>,
    /// Wakes the sync loop when the outbox gets a change.
    wake: Notify,
}

impl FleetStore {
    /// A store at `url` (`redis://host:port/db`), keys under `prefix`;
    /// `flags` are the workers this replica's flags name.
    pub fn new(
        url: &str,
        prefix: &str,
        flags: Vec<StoredWorker>,
    ) -> Result<Arc<Self>, redis::RedisError> {
        Ok(Arc::new(FleetStore {
            client: redis::Client::open(url)?,
            prefix: prefix.to_string(),
            flags,
            workers_key: format!("{prefix}:workers"),
            version_key: format!("{prefix}:version"),
            outbox: Mutex::new(HashMap::new()),
            wake: Notify::new(),
        }))
    }

    /// The server at `url` was added through this replica's admin API.
    pub fn added(&self, worker: StoredWorker) {
        self.note(worker.url.clone(), Change::Added(worker));
    }

    /// The server at `url` (normalised) was removed through this
    /// replica's admin API.
    pub fn removed(&self, url: &str) {
        self.note(url.to_string(), Change::Removed);
    }

    fn note(&self, url: String, change: Change) {
        {
            let mut outbox = self.outbox.lock();
            if outbox.len() >= OUTBOX_CAP && !outbox.contains_key(&url) {
                warn!(worker = %url, "fleet store: too many changes waiting for the store; this one stays local");
                return;
            }
            outbox.insert(url, change);
        }
        self.wake.notify_one();
    }

    /// Keeps this replica's worker list and the store's in step, for as
    /// long as the process runs; `metrics` says whether it answers.
    pub async fn run(
        self: Arc<Self>,
        registry: Arc<Registry>,
        enrollment: Arc<Enrollment>,
        metrics: Arc<Metrics>,
    ) {
        let mut sync = StoreSync {
            link: StoreLink::new(self.client.clone()),
            store: self,
            registry,
            enrollment,
            metrics,
            joined: false,
            seen: None,
        };
        loop {
            let result = sync.round().await;
            sync.report(result);
            let wake = sync.store.wake.notified();
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = wake => {}
            }
        }
    }
}

/// The sync loop's state: the connection and what it has done so far.
struct StoreSync {
    store: Arc<FleetStore>,
    registry: Arc<Registry>,
    enrollment: Arc<Enrollment>,
    metrics: Arc<Metrics>,
    link: StoreLink,
    /// This replica's flags' workers were offered to the store.
    joined: bool,
    /// The store's version last applied here.
    seen: Option<i64>,
}

impl StoreSync {
    /// Logs when the store is lost or found again, not every round.
    fn report(&mut self, result: Result<(), StoreError>) {
        self.metrics.fleet_store(&self.store.prefix, result.is_ok());
        self.link.report(
            &result,
            "the worker list is shared",
            "routing on this replica's worker list",
        );
    }

    /// One exchange: connect if needed, join, push the outbox, and apply
    /// the store's list if it changed.
    async fn round(&mut self) -> Result<(), StoreError> {
        let mut conn = self.link.conn().await?;
        let mut version: Option<i64> = timed(conn.get(&self.store.version_key)).await?;
        let mut wrote = true;
        if version.is_none() {
            // A new store, or one restarted empty: what this replica has.
            // Its counter starts again, so a version seen before says
            // nothing about it.
            self.seen = None;
            let mut all = persist::snapshot(&self.registry);
            all.extend(self.store.flags.iter().cloned());
            self.offer(&mut conn, &all).await?;
            self.joined = true;
        } else if !self.joined {
            self.offer(&mut conn, &self.store.flags).await?;
            self.joined = true;
        } else {
            wrote = false;
        }
        wrote |= self.push_outbox(&mut conn).await?;
        if wrote {
            // Its own writes raised the counter: read where it stands now.
            version = timed(conn.get(&self.store.version_key)).await?;
        }
        if version.is_some() && version != self.seen {
            let stored: HashMap<String, String> =
                timed(conn.hgetall(&self.store.workers_key)).await?;
            self.apply(stored).await;
            self.seen = version;
        }
        Ok(())
    }

    /// Adds `workers` to the store where it has none of their URL.
    async fn offer(
        &self,
        conn: &mut MultiplexedConnection,
        workers: &[StoredWorker],
    ) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        for w in workers {
            if let Ok(json) = serde_json::to_string(w) {
                pipe.hset_nx(&self.store.workers_key, &w.url, json).ignore();
            }
        }
        pipe.incr(&self.store.version_key, 1).ignore();
        timed(pipe.query_async::<()>(conn)).await
    }

    /// Writes the changes made here since the last round; whether there
    /// were any.
    async fn push_outbox(&self, conn: &mut MultiplexedConnection) -> Result<bool, StoreError> {
        let changes: Vec<(String, Change)> = self
            .store
            .outbox
            .lock()
            .iter()
            .map(|(u, c)| (u.clone(), c.clone()))
            .collect();
        if changes.is_empty() {
            return Ok(false);
        }
        let mut pipe = redis::pipe();
        for (url, change) in &changes {
            match change {
                Change::Added(w) => {
                    if let Ok(json) = serde_json::to_string(w) {
                        pipe.hset(&self.store.workers_key, url, json).ignore();
                    }
                }
                Change::Removed => {
                    pipe.hdel(&self.store.workers_key, url).ignore();
                }
            }
        }
        pipe.incr(&self.store.version_key, 1).ignore();
        timed(pipe.query_async::<()>(conn)).await?;
        // Only what was written leaves the outbox: a change made to the
        // same URL meanwhile stays for the next round.
        let mut outbox = self.store.outbox.lock();
        for (url, change) in changes {
            if outbox.get(&url) == Some(&change) {
                outbox.remove(&url);
            }
        }
        Ok(true)
    }

    /// Registers the stored workers this replica lacks and removes those
    /// the store no longer has, leaving alone the URLs with a change of
    /// this replica's still on its way.
    async fn apply(&self, stored: HashMap<String, String>) {
        let waiting: Vec<String> = self.store.outbox.lock().keys().cloned().collect();
        let mut wanted: Vec<StoredWorker> = Vec::with_capacity(stored.len());
        for (url, json) in stored {
            match serde_json::from_str::<StoredWorker>(&json) {
                Ok(w) => wanted.push(w),
                Err(e) => warn!(worker = %url, error = %e, "fleet store: unreadable entry skipped"),
            }
        }
        let here = persist::snapshot(&self.registry);
        for w in &wanted {
            if waiting.contains(&w.url)
                || here.iter().any(|h| h.url == w.url)
                || self.enrollment.job_by_url(&w.url).is_some()
            {
                continue;
            }
            let Some(spec) = w.spec() else {
                warn!(worker = %w.url, kind = %w.worker_type, "fleet store: unknown worker type skipped");
                continue;
            };
            match self.enrollment.enroll(&w.url, spec, w.id).await {
                Ok(e) => {
                    info!(worker = %w.url, id = %e.id(), "worker added: another control plane added it")
                }
                Err(e) => {
                    warn!(worker = %w.url, error = %e, "fleet store: cannot add a stored worker")
                }
            }
        }
        for h in here {
            if waiting.contains(&h.url) || wanted.iter().any(|w| w.url == h.url) {
                continue;
            }
            match self.enrollment.withdraw(&h.url) {
                Ok(_) => {
                    info!(worker = %h.url, "worker removed: another control plane removed it")
                }
                Err(e) => warn!(worker = %h.url, error = %e, "fleet store: cannot remove a worker"),
            }
        }
    }
}
