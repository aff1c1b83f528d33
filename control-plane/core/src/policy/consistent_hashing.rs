use std::sync::Arc;

use super::{rendezvous, CacheOutcome, Policy, RouteInput, Selection};
use crate::workers::Worker;

/// smg's `consistent_hashing` policy: a request with an `X-SMG-Routing-Key`
/// goes to the worker its key hashes to; one without goes to a random
/// worker.
///
/// Unlike `manual`, nothing is remembered: the key's worker is a function
/// of the key and the workers that can take requests (healthy, circuit
/// not open), computed by rendezvous hashing on the key's stable hash and
/// the workers' URLs (see `rendezvous.rs`). So, as in smg, a key stays on
/// its worker while that worker is available; when it is removed or
/// unhealthy, only its keys move, spread over the others, and they come
/// back with it; a new worker takes about 1/N of the keys from the others
/// (where `manual` never moves a key to a new worker). Every control plane
/// places a key alike, restarted or not.
///
/// Where this differs from smg 1.13.0, and why:
/// - smg places keys on a ring of 150 virtual nodes per worker; rendezvous
///   hashing keeps the same guarantees with even shares and no ring.
/// - Without the header, smg 1.13.0 also hashes `X-Forwarded-For`, else
///   `Cookie`, as an implicit key (seen against the simulated worker: one
///   forwarded address always reached one worker). Not here: every client
///   behind one proxy or NAT shares a forwarded address and would be
///   pinned to one worker, and a `Cookie` header changes whenever any of
///   its cookies does. Clients that want affinity send the key.
/// - smg's `X-SMG-Target-Worker` (a worker's position in its registry)
///   is not read: the front doors do not pass it, and positions are not
///   something a client can know.
pub struct ConsistentHashing;

impl Policy for ConsistentHashing {
    fn name(&self) -> &'static str {
        "consistent_hashing"
    }

    fn select(&self, workers: &[Arc<Worker>], input: &RouteInput<'_>) -> Selection {
        let index = match input.routing_key {
            Some(key) => rendezvous::owner(workers, key.placement()),
            None => rand::random_range(0..workers.len().max(1)),
        };
        Selection {
            index,
            cache: CacheOutcome::NotApplicable,
            work: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::policy::test_support::workers;
    use crate::routing_key::RoutingKey;

    fn keyed(key: &str) -> RouteInput<'static> {
        RouteInput {
            text: b"",
            routing_key: RoutingKey::from_header(key),
            exact: None,
        }
    }

    fn url_of(ws: &[Arc<Worker>], key: &str) -> String {
        ws[ConsistentHashing.select(ws, &keyed(key)).index]
            .url
            .clone()
    }

    #[test]
    fn a_key_always_reaches_one_worker_and_keys_spread() {
        let ws = workers(3);
        let mut per_worker: HashMap<String, usize> = HashMap::new();
        for k in 0..300 {
            let key = format!("user-{k}");
            let home = url_of(&ws, &key);
            for _ in 0..3 {
                assert_eq!(url_of(&ws, &key), home, "{key} moved");
            }
            *per_worker.entry(home).or_default() += 1;
        }
        assert_eq!(per_worker.len(), 3);
        // 100 expected each; the binomial's standard deviation is about 8.
        assert!(
            per_worker.values().all(|&n| (60..=140).contains(&n)),
            "{per_worker:?}"
        );
    }

    #[test]
    fn the_place_does_not_depend_on_the_workers_order() {
        let ws = workers(4);
        let mut reversed = ws.clone();
        reversed.reverse();
        for k in 0..100 {
            let key = format!("k{k}");
            assert_eq!(url_of(&ws, &key), url_of(&reversed, &key));
        }
    }

    #[test]
    fn removing_a_worker_moves_only_its_keys_about_one_in_n() {
        const KEYS: usize = 20_000;
        for n in [3, 5, 8] {
            let all = workers(n);
            let gone = all[n / 2].url.clone();
            let rest: Vec<Arc<Worker>> = all.iter().filter(|w| w.url != gone).cloned().collect();
            let mut moved = 0;
            let mut moved_to: HashMap<String, usize> = HashMap::new();
            for k in 0..KEYS {
                let key = format!("session-{k}");
                let (before, after) = (url_of(&all, &key), url_of(&rest, &key));
                if before != after {
                    assert_eq!(before, gone, "{key} moved off a worker still there");
                    moved += 1;
                    *moved_to.entry(after).or_default() += 1;
                }
            }
            // Exactly the removed worker's keys move: 1/N of them in
            // expectation (standard deviation well under 1% of KEYS).
            let fraction = moved as f64 / KEYS as f64;
            let expected = 1.0 / n as f64;
            assert!(
                (fraction - expected).abs() < 0.2 * expected,
                "{n} workers: {fraction:.3} of keys moved, expected about {expected:.3}"
            );
            // ...and they spread over every remaining worker.
            assert_eq!(moved_to.len(), n - 1, "{moved_to:?}");
        }
    }

    #[test]
    fn an_added_worker_takes_about_one_in_n_plus_one_from_each() {
        const KEYS: usize = 20_000;
        let all = workers(4);
        let before = &all[..3];
        let mut taken = 0;
        for k in 0..KEYS {
            let key = format!("chat-{k}");
            let (old, new) = (url_of(before, &key), url_of(&all, &key));
            if old != new {
                assert_eq!(new, all[3].url, "{key} moved between old workers");
                taken += 1;
            }
        }
        let fraction = taken as f64 / KEYS as f64;
        assert!((fraction - 0.25).abs() < 0.05, "{fraction:.3} taken");
    }

    #[test]
    fn without_a_key_requests_spread() {
        let ws = workers(3);
        let mut seen = [0; 3];
        for _ in 0..150 {
            seen[ConsistentHashing
                .select(&ws, &RouteInput::of_text(b"same text"))
                .index] += 1;
        }
        assert!(seen.iter().all(|&n| n > 20), "{seen:?}");
        let empty_key = RouteInput {
            text: b"",
            routing_key: RoutingKey::from_header(""),
            exact: None,
        };
        let mut seen = [0; 3];
        for _ in 0..150 {
            seen[ConsistentHashing.select(&ws, &empty_key).index] += 1;
        }
        assert!(
            seen.iter().all(|&n| n > 20),
            "an empty key is no key: {seen:?}"
        );
    }
}
