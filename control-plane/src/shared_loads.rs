//! The requests in flight shared by several control planes through the
//! fleet store (`--fleet-store-url`, unless `--disable-shared-loads`).
//!
//! Each replica counts only the requests it routed. With three of them,
//! each sees about a third of every worker's queue, and the load-aware
//! policies pile work on workers the others already keep busy (measured:
//! TTFT p95 up to 4x one replica's on the same workload). The workers' own
//! load reports (`--load-monitor-interval`) see everyone's requests, but
//! only as of their last read, and they do not say how much prefill work
//! is queued. So every [`ROUND`] each replica writes its own counts per
//! unit (requests in flight, their estimated prefill work) to a key of its
//! own that expires after [`TTL`], and reads the others': each unit's
//! [`Worker::set_peer_load`] then holds the sum of the others' figures.
//!
//! A replica that dies stops refreshing its key, and Redis drops it within
//! [`TTL`]: its requests stop counting without any clock being compared.
//! While the store is down, the others' figures are zeroed: each replica
//! routes on its own counts, as a single control plane does.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands as _;

use crate::metrics::Metrics;
use crate::store_link::{timed, StoreError, StoreLink};
use crate::workers::{Registry, Worker};

/// How often a replica writes its counts and reads the others'.
pub const ROUND: Duration = Duration::from_millis(50);
/// How long a replica's counts stand without being refreshed.
pub const TTL: Duration = Duration::from_millis(1000);

/// One replica's counts: unit URL → (requests in flight, prefill work).
type Counts = HashMap<String, (usize, u64)>;

/// This replica's side of the shared counts.
pub struct SharedLoads {
    link: StoreLink,
    /// The set of replicas that wrote counts (`{prefix}:loads`).
    members: String,
    /// This replica's id and the key of its counts.
    replica: String,
    own_key: String,
    prefix: String,
}

impl SharedLoads {
    /// The shared counts on the store at `url`, keys under `prefix`, this
    /// process's under its `replica` id.
    pub fn new(url: &str, prefix: &str, replica: &str) -> Result<Self, redis::RedisError> {
        let replica = replica.to_string();
        Ok(SharedLoads {
            link: StoreLink::new(redis::Client::open(url)?),
            members: format!("{prefix}:loads"),
            own_key: format!("{prefix}:loads:{replica}"),
            replica,
            prefix: prefix.to_string(),
        })
    }

    /// Shares `registry`'s counts for as long as the process runs.
    pub async fn run(mut self, registry: Arc<Registry>, metrics: Arc<Metrics>) {
        loop {
            tokio::time::sleep(ROUND).await;
            let units = registry.all();
            let result = self.round(&units).await;
            match &result {
                Ok(others) => {
                    metrics.fleet_store_peers(*others);
                }
                Err(_) => {
                    // Unknown now: each unit back to this replica's counts.
                    for w in units.iter() {
                        w.set_peer_load(0, 0);
                    }
                }
            }
            self.link.report(
                &result,
                "requests in flight are shared",
                "routing on this replica's counts",
            );
        }
    }

    /// One exchange: write this replica's counts, read the others', and
    /// set each unit's; how many other replicas had counts.
    async fn round(&mut self, units: &[Arc<Worker>]) -> Result<usize, StoreError> {
        let mut conn = self.link.conn().await?;
        let own: Counts = units
            .iter()
            .map(|w| (w.url.clone(), (w.load(), w.own_work())))
            .filter(|(_, (load, work))| *load > 0 || *work > 0)
            .collect();
        let json = serde_json::to_string(&own).unwrap_or_default();
        let (members,): (Vec<String>,) = timed(
            redis::pipe()
                .pset_ex(&self.own_key, json, TTL.as_millis() as u64)
                .ignore()
                .sadd(&self.members, &self.replica)
                .ignore()
                .smembers(&self.members)
                .query_async(&mut conn),
        )
        .await?;
        let others: Vec<&String> = members.iter().filter(|m| **m != self.replica).collect();
        let keys: Vec<String> = others
            .iter()
            .map(|m| format!("{}:loads:{m}", self.prefix))
            .collect();
        let values: Vec<Option<String>> = if keys.is_empty() {
            Vec::new()
        } else {
            timed(conn.mget(&keys)).await?
        };
        let mut sum: Counts = HashMap::new();
        let mut live = 0;
        let mut gone = Vec::new();
        for (member, value) in others.iter().zip(values) {
            let Some(counts) = value.and_then(|v| serde_json::from_str::<Counts>(&v).ok()) else {
                // Expired: that replica stopped (or never wrote readable
                // counts); it leaves the set.
                gone.push(member.as_str());
                continue;
            };
            live += 1;
            for (url, (load, work)) in counts {
                let entry = sum.entry(url).or_default();
                entry.0 = entry.0.saturating_add(load);
                entry.1 = entry.1.saturating_add(work);
            }
        }
        if !gone.is_empty() {
            timed(conn.srem::<_, _, ()>(&self.members, gone)).await?;
        }
        for w in units {
            let (load, work) = sum.get(&w.url).copied().unwrap_or_default();
            w.set_peer_load(load, work);
        }
        Ok(live)
    }
}
