//! Reads each server's own load report, per DP rank, and hands it to its
//! units ([`EngineLoad`](crate::workers::EngineLoad)), so that policies see
//! traffic this router did not send (another router, a batch job calling a
//! worker directly, retries from another gateway).
//!
//! SGLang serves two shapes (`python/sglang/srt/entrypoints/`):
//! `GET /v1/loads` (0.5.8 and later, `v1_loads.py`: `{"loads": [{"dp_rank",
//! "num_running_reqs", "num_waiting_reqs", ...}]}`) and the older
//! `GET /get_load` (`[{"dp_rank", "num_reqs", "num_waiting_reqs",
//! "num_tokens"}]`, `num_reqs` counting running and waiting), which newer
//! versions keep as a deprecated shim. A server that answers 404 to the
//! first is asked the second from then on. A server whose report fails is
//! routed on the router's own counts until one succeeds again.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use parking_lot::Mutex;
use reqwest::StatusCode;
use serde::Deserialize;
use tracing::debug;

use crate::workers::{error_chain, Registry, Worker};

/// One rank's entry in `/v1/loads`.
#[derive(Debug, Deserialize)]
struct V1Load {
    #[serde(default)]
    dp_rank: u32,
    #[serde(default)]
    num_running_reqs: usize,
    #[serde(default)]
    num_waiting_reqs: usize,
}

/// `/v1/loads`' answer (its other fields are not read).
#[derive(Debug, Deserialize)]
struct V1Loads {
    loads: Vec<V1Load>,
}

/// One rank's entry in `/get_load`.
#[derive(Debug, Deserialize)]
struct OldLoad {
    #[serde(default)]
    dp_rank: u32,
    /// Running and waiting.
    #[serde(default)]
    num_reqs: usize,
}

/// Polls every registered server at one interval.
pub struct LoadMonitor {
    registry: Arc<Registry>,
    client: reqwest::Client,
    interval: Duration,
    /// Servers (base URLs) without `/v1/loads`, asked `/get_load`.
    old_shape: Mutex<HashSet<String>>,
}

impl LoadMonitor {
    /// A monitor of `registry`'s servers every `interval`, through the
    /// control plane's client for workers.
    pub fn new(registry: Arc<Registry>, client: reqwest::Client, interval: Duration) -> Self {
        LoadMonitor {
            registry,
            client,
            interval,
            old_shape: Mutex::new(HashSet::new()),
        }
    }

    /// Polls until the task is dropped.
    pub async fn run(self) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.poll_all().await;
        }
    }

    /// One poll of every server, all at once.
    pub async fn poll_all(&self) {
        let all = self.registry.all();
        let mut servers: BTreeMap<&str, Vec<&Arc<Worker>>> = BTreeMap::new();
        for w in all.iter() {
            servers.entry(w.base_url.as_str()).or_default().push(w);
        }
        join_all(servers.into_iter().map(|(base, units)| async move {
            match self.fetch(base).await {
                Ok(ranks) => record(&units, &ranks),
                Err(why) => {
                    debug!(worker = base, %why, "no load report; routing on the router's own counts");
                    units.iter().for_each(|u| u.engine.forget());
                }
            }
        }))
        .await;
    }

    /// Running plus waiting requests per DP rank, as `base` reports them.
    async fn fetch(&self, base: &str) -> Result<Vec<(u32, usize)>, String> {
        if !self.old_shape.lock().contains(base) {
            let r = self.get(&format!("{base}/v1/loads?include=core")).await?;
            if r.status() != StatusCode::NOT_FOUND {
                let v: V1Loads = ok_json(r).await?;
                return Ok(v
                    .loads
                    .iter()
                    .map(|l| (l.dp_rank, l.num_running_reqs + l.num_waiting_reqs))
                    .collect());
            }
            self.old_shape.lock().insert(base.to_string());
        }
        let r = self.get(&format!("{base}/get_load")).await?;
        let v: Vec<OldLoad> = ok_json(r).await?;
        Ok(v.iter().map(|l| (l.dp_rank, l.num_reqs)).collect())
    }

    async fn get(&self, url: &str) -> Result<reqwest::Response, String> {
        self.client
            .get(url)
            // A busy worker (or a loaded host) may take a while to answer;
            // an answer up to a second late still beats the router's own
            // counts, and polls never overlap (the next waits for this one).
            .timeout(self.interval.max(Duration::from_secs(1)))
            .send()
            .await
            .map_err(|e| error_chain(&e))
    }
}

/// The JSON of a 2xx answer.
async fn ok_json<T: serde::de::DeserializeOwned>(r: reqwest::Response) -> Result<T, String> {
    if !r.status().is_success() {
        return Err(format!("answered {}", r.status()));
    }
    r.json().await.map_err(|e| error_chain(&e))
}

/// Gives each unit its rank's load (a server routed as one unit gets the
/// sum of its ranks); a unit whose rank is missing has no report.
fn record(units: &[&Arc<Worker>], ranks: &[(u32, usize)]) {
    for u in units {
        let load = match u.dp_rank {
            Some(rank) => ranks.iter().find(|(r, _)| *r == rank).map(|(_, n)| *n),
            None => Some(ranks.iter().map(|(_, n)| n).sum()),
        };
        match load {
            Some(n) => u.engine.record(n),
            None => u.engine.forget(),
        }
    }
}
