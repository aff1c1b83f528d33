use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use super::{lowest_at_random, CacheOutcome, Policy, RouteInput, Selection};
use crate::routing_key::RoutingKey;
use crate::workers::Worker;

/// Workers remembered per routing key (sglang-router's `MAX_CANDIDATE_WORKERS`):
/// the one a key was first sent to, and the one it moved to while the
/// first was unhealthy.
const MAX_CANDIDATES: usize = 2;

/// Settings of the manual policy (sglang-router 0.3.2's meaning).
#[derive(Debug, Clone, Copy)]
pub struct ManualConfig {
    /// A key unused this long is forgotten at the next upkeep; zero keeps
    /// keys forever.
    pub max_idle: Duration,
    /// How new keys, and requests without a key, get their worker.
    pub assignment: AssignmentMode,
}

/// How the `manual` policy picks a worker for a routing key it has not
/// seen (or whose workers are all unhealthy), and for requests without a
/// key (sglang-router 0.3.2's `--assignment-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum AssignmentMode {
    /// Uniformly random healthy worker.
    Random,
    /// The healthy worker with the fewest requests in flight (ties at random).
    MinLoad,
    /// The healthy worker with the fewest distinct routing keys among its
    /// requests in flight (ties at random).
    MinGroup,
}

/// What the policy remembers of one routing key.
struct Assignment {
    /// Units that served the key, oldest first; a unit is named by its URL
    /// (`http://host:port`, `@rank` for a DP rank), so a worker removed and
    /// registered again keeps its keys, as in sglang-router.
    candidates: Vec<Box<str>>,
    last_used: Instant,
}

impl Assignment {
    /// The first remembered unit that is among `workers` (the healthy ones).
    fn find(&self, workers: &[Arc<Worker>]) -> Option<usize> {
        self.candidates
            .iter()
            .find_map(|url| workers.iter().position(|w| w.url.as_str() == &**url))
    }

    /// Remembers `url`, forgetting the oldest candidate beyond the limit.
    fn push(&mut self, url: &str) {
        if self.candidates.len() >= MAX_CANDIDATES {
            self.candidates.remove(0);
        }
        self.candidates.push(url.into());
    }
}

/// sglang-router's `manual` policy: sticky sessions on the client's
/// `X-SMG-Routing-Key` header.
///
/// A key seen for the first time gets a worker by the assignment mode and
/// keeps it: adding workers never moves a key. While none of a key's
/// remembered workers is healthy, the key gets a new one (remembered too,
/// at most two per key), and goes back to the first once it is healthy
/// again. Requests without a key are assigned by the mode, never
/// remembered. Keys unused for `max_idle` are forgotten.
pub struct Manual {
    config: ManualConfig,
    keys: DashMap<RoutingKey, Assignment>,
}

impl Manual {
    /// A policy that knows no key yet.
    pub fn new(config: ManualConfig) -> Self {
        Manual {
            config,
            keys: DashMap::new(),
        }
    }

    /// Routing keys remembered.
    pub fn keys(&self) -> usize {
        self.keys.len()
    }

    /// A worker for a key without a healthy one, or a request without a key.
    fn assign(&self, workers: &[Arc<Worker>]) -> usize {
        let n = workers.len();
        let pick = match self.config.assignment {
            AssignmentMode::Random => return rand::random_range(0..n),
            AssignmentMode::MinLoad => lowest_at_random(n, |i| Some(workers[i].routing_load())),
            AssignmentMode::MinGroup => lowest_at_random(n, |i| Some(workers[i].routing_keys())),
        };
        pick.unwrap_or(0)
    }

    fn select_keyed(&self, workers: &[Arc<Worker>], key: RoutingKey) -> usize {
        let now = Instant::now();
        match self.keys.entry(key) {
            Entry::Occupied(mut entry) => {
                let assignment = entry.get_mut();
                assignment.last_used = now;
                match assignment.find(workers) {
                    Some(index) => index,
                    None => {
                        let index = self.assign(workers);
                        assignment.push(&workers[index].url);
                        index
                    }
                }
            }
            Entry::Vacant(entry) => {
                let index = self.assign(workers);
                entry.insert(Assignment {
                    candidates: vec![workers[index].url.as_str().into()],
                    last_used: now,
                });
                index
            }
        }
    }
}

impl Policy for Manual {
    fn name(&self) -> &'static str {
        "manual"
    }

    fn select(&self, workers: &[Arc<Worker>], input: &RouteInput<'_>) -> Selection {
        let index = match input.routing_key {
            Some(key) => self.select_keyed(workers, key),
            None => self.assign(workers),
        };
        Selection {
            index,
            cache: CacheOutcome::NotApplicable,
            work: 0,
        }
    }

    /// Forgets keys idle for longer than `max_idle`.
    fn maintain(&self, _registered: &[Arc<Worker>]) {
        if self.config.max_idle.is_zero() {
            return;
        }
        let now = Instant::now();
        let before = self.keys.len();
        self.keys
            .retain(|_, a| now.duration_since(a.last_used) < self.config.max_idle);
        let evicted = before.saturating_sub(self.keys.len());
        if evicted > 0 {
            tracing::info!(
                evicted,
                kept = self.keys.len(),
                "manual policy: idle routing keys forgotten"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::{set_load, workers};

    fn manual(assignment: AssignmentMode) -> Manual {
        Manual::new(ManualConfig {
            max_idle: Duration::from_secs(3600),
            assignment,
        })
    }

    fn keyed(key: &str) -> RouteInput<'static> {
        RouteInput {
            text: b"",
            routing_key: RoutingKey::from_header(key),
            exact: None,
        }
    }

    fn pick(p: &Manual, ws: &[Arc<Worker>], key: &str) -> String {
        ws[p.select(ws, &keyed(key)).index].url.clone()
    }

    #[test]
    fn a_key_sticks_to_its_worker_and_keys_spread() {
        let p = manual(AssignmentMode::Random);
        let ws = workers(3);
        let mut used = std::collections::HashSet::new();
        for k in 0..60 {
            let key = format!("user-{k}");
            let first = pick(&p, &ws, &key);
            for _ in 0..5 {
                assert_eq!(pick(&p, &ws, &key), first, "{key} moved");
            }
            used.insert(first);
        }
        assert_eq!(used.len(), 3, "60 keys all went to {used:?}");
        assert_eq!(p.keys(), 60);
    }

    #[test]
    fn without_a_key_requests_spread_and_nothing_is_remembered() {
        let p = manual(AssignmentMode::Random);
        let ws = workers(2);
        let mut seen = [0; 2];
        for _ in 0..100 {
            seen[p.select(&ws, &RouteInput::of_text(b"x")).index] += 1;
        }
        assert!(seen[0] > 20 && seen[1] > 20, "{seen:?}");
        assert_eq!(p.keys(), 0);
        let empty = RouteInput {
            text: b"",
            routing_key: RoutingKey::from_header(""),
            exact: None,
        };
        p.select(&ws, &empty);
        assert_eq!(p.keys(), 0, "an empty header is no key");
    }

    #[test]
    fn an_unhealthy_workers_keys_move_and_come_back() {
        let p = manual(AssignmentMode::Random);
        let all = workers(3);
        let home = pick(&p, &all, "k");
        // The engine passes the healthy workers only.
        let without = |url: &str| -> Vec<Arc<Worker>> {
            all.iter().filter(|w| w.url != url).cloned().collect()
        };
        let healthy = without(&home);
        let second = pick(&p, &healthy, "k");
        assert_ne!(second, home);
        for _ in 0..5 {
            assert_eq!(pick(&p, &healthy, "k"), second, "sticks to the fallback");
        }
        assert_eq!(pick(&p, &all, "k"), home, "back home once healthy again");
        // Home and fallback both down: a third worker, and the oldest
        // candidate (home) is forgotten.
        let only: Vec<Arc<Worker>> = all
            .iter()
            .filter(|w| w.url != home && w.url != second)
            .cloned()
            .collect();
        let third = pick(&p, &only, "k");
        assert_ne!(third, home);
        assert_ne!(third, second);
        assert_eq!(pick(&p, &all, "k"), second, "at most two candidates");
    }

    #[test]
    fn new_workers_never_take_existing_keys() {
        let p = manual(AssignmentMode::Random);
        let all = workers(4);
        let before: Vec<String> = (0..20)
            .map(|k| pick(&p, &all[..2], &format!("k{k}")))
            .collect();
        let after: Vec<String> = (0..20).map(|k| pick(&p, &all, &format!("k{k}"))).collect();
        assert_eq!(before, after);
    }

    #[test]
    fn min_load_and_min_group_assign_the_emptiest_worker() {
        let ws = workers(3);
        set_load(&ws[0], 2);
        set_load(&ws[2], 1);
        let p = manual(AssignmentMode::MinLoad);
        assert_eq!(p.select(&ws, &keyed("a")).index, 1);
        assert_eq!(p.select(&ws, &RouteInput::of_text(b"")).index, 1);

        let p = manual(AssignmentMode::MinGroup);
        let busy = RoutingKey::from_header("busy").unwrap();
        ws[1].hold_key(busy);
        ws[2].hold_key(busy);
        ws[2].hold_key(RoutingKey::from_header("other").unwrap());
        assert_eq!(
            p.select(&ws, &keyed("b")).index,
            0,
            "fewest keys in flight, whatever the load"
        );
    }

    #[test]
    fn idle_keys_are_forgotten() {
        let ws = workers(2);
        let p = Manual::new(ManualConfig {
            max_idle: Duration::from_millis(30),
            assignment: AssignmentMode::Random,
        });
        pick(&p, &ws, "old");
        std::thread::sleep(Duration::from_millis(60));
        pick(&p, &ws, "fresh");
        p.maintain(&ws);
        assert_eq!(p.keys(), 1);
        let keep = manual(AssignmentMode::Random);
        let forever = Manual::new(ManualConfig {
            max_idle: Duration::ZERO,
            ..keep.config
        });
        pick(&forever, &ws, "k");
        forever.maintain(&ws);
        assert_eq!(forever.keys(), 1, "max idle 0 keeps keys");
    }
}
