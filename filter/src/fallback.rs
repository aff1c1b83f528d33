use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use sglang_envoy_proto::{PrefillEndpoint, WorkersSnapshot};

/// What the filter knows to keep routing while the control plane is
/// unreachable: the last list of healthy workers it published, refreshed
/// on a timer by the root context. One per wasm VM, shared by its streams.
#[derive(Clone, Default)]
pub struct Fallback(Rc<Inner>);

#[derive(Default)]
struct Inner {
    snapshot: RefCell<Option<(SystemTime, WorkersSnapshot)>>,
    turn: Cell<usize>,
}

/// A locally chosen destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalChoice {
    /// The chosen endpoint first, then the others to retry on.
    pub endpoints: Vec<String>,
    /// PD mode: the prefill worker the filter must send the prefill half to.
    pub prefill: Option<PrefillEndpoint>,
}

impl Fallback {
    /// Stores a fresh list of workers, received at `now`.
    pub fn update(&self, now: SystemTime, snapshot: WorkersSnapshot) {
        *self.0.snapshot.borrow_mut() = Some((now, snapshot));
    }

    /// Round robin over the last known healthy servers (and, in PD mode,
    /// prefill servers), if that list is younger than `max_age`.
    pub fn choose(
        &self,
        now: SystemTime,
        max_age: Duration,
        retries: usize,
    ) -> Option<LocalChoice> {
        let guard = self.0.snapshot.borrow();
        let (at, snapshot) = guard.as_ref()?;
        let age = now.duration_since(*at).unwrap_or_default();
        if age > max_age || snapshot.serving.is_empty() {
            return None;
        }
        if snapshot.pd && snapshot.prefill.is_empty() {
            return None;
        }
        let turn = self.0.turn.get();
        self.0.turn.set(turn.wrapping_add(1));
        let n = snapshot.serving.len();
        let endpoints = (0..n.min(retries + 1))
            .map(|i| snapshot.serving[(turn + i) % n].clone())
            .collect();
        let prefill = snapshot
            .pd
            .then(|| snapshot.prefill[turn % snapshot.prefill.len()].clone());
        Some(LocalChoice { endpoints, prefill })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(serving: &[&str], pd: bool) -> WorkersSnapshot {
        WorkersSnapshot {
            pd,
            serving: serving.iter().map(|s| s.to_string()).collect(),
            prefill: Vec::new(),
        }
    }

    #[test]
    fn round_robin_over_a_recent_list_only() {
        let f = Fallback::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let age = Duration::from_secs(60);
        assert_eq!(f.choose(t0, age, 2), None, "nothing known yet");
        f.update(t0, snapshot(&["a:1", "b:2", "c:3"], false));
        let firsts: Vec<String> = (0..3)
            .map(|_| f.choose(t0, age, 2).unwrap().endpoints[0].clone())
            .collect();
        assert_eq!(firsts, ["a:1", "b:2", "c:3"]);
        assert_eq!(f.choose(t0, age, 1).unwrap().endpoints, ["a:1", "b:2"]);
        let later = t0 + Duration::from_secs(61);
        assert_eq!(f.choose(later, age, 2), None, "too old to trust");
        f.update(t0, snapshot(&["a:1"], true));
        assert_eq!(f.choose(t0, age, 2), None, "PD without prefill workers");
        let mut pd = snapshot(&["d:1", "d:2"], true);
        pd.prefill = vec![PrefillEndpoint {
            endpoint: "p:1".into(),
            host: "p".into(),
            bootstrap_port: 8998,
        }];
        f.update(t0, pd);
        let c = f.choose(t0, age, 0).unwrap();
        assert_eq!(c.endpoints.len(), 1);
        assert_eq!(c.prefill.map(|p| p.endpoint), Some("p:1".to_string()));
    }
}
