//! The KV-event subscriber: for every registered worker that publishes its
//! KV cache events (SGLang's `--kv-events-config` with the ZMQ publisher),
//! one SUB socket per DP rank feeding a shared block index
//! ([`sglang_envoy_kv_events::KvIndex`]), keyed by the worker's base URL
//! and rank. Nothing routes on the index yet; `/workers` and the metrics
//! show what it holds.
//!
//! * [`discovery`]: where a worker publishes (its `/server_info`, or flags);
//! * [`subscriber`]: one rank's SUB socket, sequence checks and applier;
//! * [`replay`]: filling a sequence gap from the replay endpoint;
//! * [`status`]: counters and the views `/workers` and `/metrics` read.
//!
//! [`KvEvents::run`] follows the registry: a new worker gets a discovery
//! task (retried with backoff while it does not answer), then its rank
//! subscriptions; a removed worker's tasks are aborted (closing their
//! sockets) and its blocks dropped from the index. A worker the health
//! checks saw go down and come back is followed afresh, as a new one: a
//! restart empties its cache without a word on the event stream (the new
//! process publishes nothing until it stores something), and its publisher
//! may have moved.

pub mod discovery;
pub mod replay;
pub mod status;
pub mod subscriber;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use sglang_envoy_kv_events::{IndexLimits, KvIndex};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, info};

use crate::workers::{Registry, Worker};
pub use discovery::{Endpoints, Overrides};
use status::{Discovery, RankStatus, WorkerStatus};
pub use status::{RankView, WorkerKvView};

/// The subscriber's settings.
#[derive(Debug, Clone)]
pub struct KvEventsOptions {
    /// Flag values applied over what workers advertise.
    pub overrides: Overrides,
    /// Memory caps of the index.
    pub limits: IndexLimits,
    /// Messages one rank may queue ahead of its applier before dropping.
    pub queue: usize,
    /// Longest a gap's replay may take.
    pub replay_timeout: Duration,
    /// Longest gap (in batches) worth replaying.
    pub max_replay: u64,
    /// Longest one `/server_info` question may take.
    pub info_timeout: Duration,
    /// First and longest wait between connection (and discovery) attempts.
    pub backoff: (Duration, Duration),
}

impl Default for KvEventsOptions {
    fn default() -> Self {
        KvEventsOptions {
            overrides: Overrides::default(),
            limits: IndexLimits::default(),
            // A scheduler step publishes one batch, so 4096 is seconds of
            // events even at thousands of steps a second.
            queue: 4096,
            replay_timeout: Duration::from_secs(2),
            // SGLang's default replay buffer (`buffer_steps`).
            max_replay: 10_000,
            info_timeout: Duration::from_secs(5),
            backoff: (Duration::from_millis(100), Duration::from_secs(10)),
        }
    }
}

/// Exponential backoff between attempts.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max: max.max(first),
            next: first,
        }
    }

    /// The wait before the next attempt; doubles up to the maximum.
    pub(crate) fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// Back to the first wait (after a success).
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

/// One followed worker.
struct Entry {
    status: Arc<WorkerStatus>,
    alive: Arc<AtomicBool>,
    task: JoinHandle<()>,
    health: Health,
}

/// What the health checks said of a followed server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    /// Not healthy yet since it was registered (it may still be loading).
    NotYet,
    /// Healthy (some unit of it).
    Up,
    /// Was healthy, and no longer is: when it comes back, it may be a new
    /// process.
    Down,
}

impl Health {
    /// The state after a check says `healthy`; also whether the server
    /// just came back from down.
    fn next(self, healthy: bool) -> (Health, bool) {
        match (self, healthy) {
            (Health::NotYet, false) => (Health::NotYet, false),
            (Health::Down, true) => (Health::Up, true),
            (_, true) => (Health::Up, false),
            (_, false) => (Health::Down, false),
        }
    }
}

/// The subscriber of the whole fleet.
pub struct KvEvents {
    index: Arc<RwLock<KvIndex<String>>>,
    workers: Mutex<HashMap<String, Entry>>,
    options: KvEventsOptions,
    client: reqwest::Client,
}

impl KvEvents {
    /// A subscriber asking workers through `client` (the control plane's
    /// client for workers).
    pub fn new(options: KvEventsOptions, client: reqwest::Client) -> Arc<Self> {
        Arc::new(KvEvents {
            index: Arc::new(RwLock::new(KvIndex::new(options.limits))),
            workers: Mutex::new(HashMap::new()),
            options,
            client,
        })
    }

    /// The block index, keyed by worker base URL and DP rank.
    pub fn index(&self) -> &Arc<RwLock<KvIndex<String>>> {
        &self.index
    }

    /// Follow `registry` until the task is dropped.
    pub async fn run(self: Arc<Self>, registry: Arc<Registry>) {
        let mut changes = registry.subscribe();
        loop {
            self.sync(&registry.all());
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Subscribe to the servers among `workers` not followed yet; forget
    /// those no longer there. Must be called within a tokio runtime.
    pub fn sync(&self, workers: &[Arc<Worker>]) {
        // Units of one server share its base URL.
        let mut servers: BTreeMap<&str, (&str, u32, bool)> = BTreeMap::new();
        for w in workers {
            let e = servers
                .entry(w.base_url.as_str())
                .or_insert((w.host.as_str(), 0, false));
            e.1 += 1;
            e.2 |= w.is_healthy();
        }
        let mut followed = self.workers.lock();
        let gone: Vec<String> = followed
            .keys()
            .filter(|k| !servers.contains_key(k.as_str()))
            .cloned()
            .collect();
        for base in gone {
            if let Some(entry) = followed.remove(&base) {
                self.stop(&base, entry);
            }
        }
        for (base, (host, units, healthy)) in servers {
            if let Some(entry) = followed.get_mut(base) {
                let (health, back) = entry.health.next(healthy);
                entry.health = health;
                if !back {
                    continue;
                }
                info!(
                    worker = base,
                    "KV events: the worker is back after being down; what it held is forgotten and its publisher found again"
                );
                if let Some(old) = followed.remove(base) {
                    self.stop(base, old);
                }
            }
            let dp = workers
                .iter()
                .find(|w| w.base_url == base)
                .and_then(|w| w.facts.dp_size)
                .unwrap_or(units);
            let health = Health::NotYet.next(healthy).0;
            followed.insert(base.to_string(), self.start(base, host, dp, health));
        }
    }

    /// Follows the server at `base`, last seen as `health`.
    fn start(&self, base: &str, host: &str, fallback_dp: u32, health: Health) -> Entry {
        let status = Arc::new(WorkerStatus::new(base.to_string()));
        let alive = Arc::new(AtomicBool::new(true));
        let task = tokio::spawn(follow(
            Follow {
                base: base.to_string(),
                host: host.to_string(),
                fallback_dp,
                status: status.clone(),
                alive: alive.clone(),
                index: self.index.clone(),
                client: self.client.clone(),
            },
            self.options.clone(),
        ));
        Entry {
            status,
            alive,
            task,
            health,
        }
    }

    fn stop(&self, base: &str, entry: Entry) {
        // Cleared before the index lock is taken: see `subscriber::Rank::edit`.
        entry.alive.store(false, Ordering::Release);
        entry.task.abort();
        self.index.write().remove_worker(base);
        info!(
            worker = base,
            "KV events: subscription closed; the worker's blocks forgotten"
        );
    }

    /// The `kv_events` view of one worker, when it is followed.
    pub fn view(&self, base_url: &str) -> Option<WorkerKvView> {
        let status = self.workers.lock().get(base_url)?.status.clone();
        Some(status::view(&status, &self.index))
    }

    /// The views of every followed worker, by base URL.
    pub fn views(&self) -> Vec<WorkerKvView> {
        let mut all: Vec<Arc<WorkerStatus>> = self
            .workers
            .lock()
            .values()
            .map(|e| e.status.clone())
            .collect();
        all.sort_by(|a, b| a.base_url.cmp(&b.base_url));
        all.iter().map(|s| status::view(s, &self.index)).collect()
    }
}

impl Drop for KvEvents {
    fn drop(&mut self) {
        for entry in self.workers.get_mut().values() {
            entry.task.abort();
        }
    }
}

/// What one worker's task needs.
struct Follow {
    base: String,
    host: String,
    fallback_dp: u32,
    status: Arc<WorkerStatus>,
    alive: Arc<AtomicBool>,
    index: Arc<RwLock<KvIndex<String>>>,
    client: reqwest::Client,
}

/// Discover the worker's endpoints, then run one subscription per rank.
/// Aborting this task drops the join set, which aborts the subscriptions.
async fn follow(f: Follow, options: KvEventsOptions) {
    let overrides = &options.overrides;
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    let endpoints = loop {
        match discovery::fetch_server_info(&f.client, &f.base, options.info_timeout).await {
            Ok(info) => break discovery::resolve(Some(&info), &f.host, f.fallback_dp, overrides),
            // With the port given by flag, the server info only refines the
            // DP size: go on without it.
            Err(_) if overrides.endpoint_port.is_some() => {
                break discovery::resolve(None, &f.host, f.fallback_dp, overrides)
            }
            Err(e) => {
                debug!(worker = %f.base, error = %e, "KV events: no server info yet");
                tokio::time::sleep(backoff.next_wait()).await;
            }
        }
    };
    let Some(endpoints) = endpoints else {
        info!(worker = %f.base, "KV events: the worker advertises no publisher; not subscribed");
        *f.status.discovery.lock() = Discovery::NotAdvertised;
        return;
    };
    info!(worker = %f.base, host = %endpoints.host, port_base = endpoints.port_base, replay_port_base = ?endpoints.replay_port_base, dp_size = endpoints.dp_size, "KV events: subscribing");
    let tuning = subscriber::Tuning {
        queue: options.queue,
        replay_timeout: options.replay_timeout,
        max_replay: options.max_replay,
        backoff: options.backoff,
    };
    let mut ranks = JoinSet::new();
    for r in 0..endpoints.dp_size {
        let Some(endpoint) = endpoints.pub_endpoint(r) else {
            continue;
        };
        let status = Arc::new(RankStatus::new(r));
        f.status.ranks.lock().push(status.clone());
        ranks.spawn(subscriber::run(
            subscriber::Rank {
                worker: f.base.clone(),
                rank: r,
                endpoint,
                replay: endpoints.replay_endpoint(r),
                topic: endpoints.topic.clone(),
                index: f.index.clone(),
                alive: f.alive.clone(),
                status,
                dropped: Arc::new(AtomicBool::new(false)),
            },
            tuning.clone(),
        ));
    }
    *f.status.discovery.lock() = Discovery::Subscribed(endpoints);
    while ranks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_server_that_was_up_and_went_down_comes_back() {
        let mut h = Health::NotYet;
        let mut backs = Vec::new();
        for healthy in [false, false, true, true, false, false, true, true] {
            let (next, back) = h.next(healthy);
            h = next;
            backs.push(back);
        }
        assert_eq!(
            backs,
            [false, false, false, false, false, false, true, false]
        );
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let waits: Vec<u128> = (0..4).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_wait(), Duration::from_millis(100));
    }
}
