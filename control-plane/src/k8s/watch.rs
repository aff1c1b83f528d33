//! The pod watch: every pod event becomes the worker changes it implies
//! ([`Reconciler`], no I/O), which [`run`] applies through the enrollment,
//! as the admin API would. Only workers this watch added are ever removed
//! by it; workers from flags or the admin API are left alone.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tracing::{info, warn};

use super::pods::{workers_of, Found, Rules};
use crate::enrollment::Enrollment;

/// A change to the worker set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Register this worker.
    Add(Found),
    /// Unregister the worker at this URL.
    Remove(String),
}

/// What the watch has made of the pods so far.
#[derive(Debug)]
pub struct Reconciler {
    rules: Rules,
    /// Pods (`namespace/name`) that are workers, and as what.
    known: HashMap<String, Vec<Found>>,
    /// During a (re)list: the pods seen so far.
    relisting: Option<HashSet<String>>,
}

impl Reconciler {
    /// Nothing known yet.
    pub fn new(rules: Rules) -> Self {
        Reconciler {
            rules,
            known: HashMap::new(),
            relisting: None,
        }
    }

    /// The changes `event` implies.
    pub fn on_event(&mut self, event: Event<Pod>) -> Vec<Change> {
        match event {
            Event::Init => {
                self.relisting = Some(HashSet::new());
                Vec::new()
            }
            Event::InitApply(pod) => {
                let key = key_of(&pod);
                if let Some(seen) = &mut self.relisting {
                    seen.insert(key.clone());
                }
                self.apply(key, workers_of(&pod, &self.rules))
            }
            // Pods gone while the watch was away are gone from the list.
            Event::InitDone => {
                let seen = self.relisting.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .known
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                gone.into_iter()
                    .flat_map(|k| self.apply(k, Vec::new()))
                    .collect()
            }
            Event::Apply(pod) => {
                let found = workers_of(&pod, &self.rules);
                self.apply(key_of(&pod), found)
            }
            Event::Delete(pod) => self.apply(key_of(&pod), Vec::new()),
        }
    }

    /// Pod `key` is now the workers `found` (none: no worker).
    fn apply(&mut self, key: String, found: Vec<Found>) -> Vec<Change> {
        let before = self.known.remove(&key).unwrap_or_default();
        let mut changes: Vec<Change> = before
            .iter()
            .filter(|old| !found.contains(old))
            .map(|old| Change::Remove(old.url.clone()))
            .collect();
        changes.extend(
            found
                .iter()
                .filter(|new| !before.contains(new))
                .cloned()
                .map(Change::Add),
        );
        if !found.is_empty() {
            self.known.insert(key, found);
        }
        changes
    }
}

fn key_of(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Watches the pods of `namespace` (all namespaces when `None`) for as
/// long as the control plane runs, and applies the changes. Errors of the
/// watch are logged and retried with backoff (kube's default).
pub async fn run(
    client: kube::Client,
    namespace: Option<String>,
    rules: Rules,
    enrollment: Arc<Enrollment>,
) {
    let pods: Api<Pod> = match &namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let mut reconciler = Reconciler::new(rules);
    let mut events = watcher::watcher(pods, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                warn!(error = %e, "Kubernetes pod watch failed; retrying");
                continue;
            }
        };
        for change in reconciler.on_event(event) {
            apply(&enrollment, change).await;
        }
    }
}

async fn apply(enrollment: &Arc<Enrollment>, change: Change) {
    match change {
        Change::Add(found) => {
            info!(worker = %found.url, role = found.spec.role().as_str(), "pod discovered");
            if let Err(e) = enrollment.enroll(&found.url, found.spec, None).await {
                warn!(worker = %found.url, error = %e, "discovered pod refused");
            }
        }
        Change::Remove(url) => {
            info!(worker = %url, "pod gone");
            if let Err(e) = enrollment.withdraw(&url) {
                warn!(worker = %url, error = %e, "removing a discovered pod");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::pods::test_pod;
    use crate::workers::WorkerSpec;

    fn pod(name: &str, app: &str, ip: &str, ready: bool) -> Pod {
        test_pod("ns", name, &[("app", app)], ip, ready)
    }

    fn add(url: &str) -> Change {
        Change::Add(Found {
            url: url.into(),
            spec: WorkerSpec::REGULAR,
        })
    }

    fn reconciler() -> Reconciler {
        Reconciler::new(Rules {
            selector: vec![("app".into(), "sglang".into())],
            pd: None,
            ports: vec![8000],
        })
    }

    #[test]
    fn pods_come_and_go_as_they_match_are_ready_and_exist() {
        let mut r = reconciler();
        let a = "http://10.0.0.1:8000";
        assert_eq!(
            r.on_event(Event::Apply(pod("a", "sglang", "10.0.0.1", false))),
            []
        );
        assert_eq!(
            r.on_event(Event::Apply(pod("a", "sglang", "10.0.0.1", true))),
            [add(a)]
        );
        assert_eq!(
            r.on_event(Event::Apply(pod("a", "sglang", "10.0.0.1", true))),
            [],
            "no change, no event"
        );
        assert_eq!(
            r.on_event(Event::Apply(pod("a", "other", "10.0.0.1", true))),
            [Change::Remove(a.into())],
            "relabelled out"
        );
        r.on_event(Event::Apply(pod("a", "sglang", "10.0.0.1", true)));
        assert_eq!(
            r.on_event(Event::Apply(pod("a", "sglang", "10.0.0.1", false))),
            [Change::Remove(a.into())],
            "not ready"
        );
        r.on_event(Event::Apply(pod("a", "sglang", "10.0.0.1", true)));
        assert_eq!(
            r.on_event(Event::Apply(pod("a", "sglang", "10.0.0.9", true))),
            [Change::Remove(a.into()), add("http://10.0.0.9:8000")],
            "a new IP is another worker"
        );
        assert_eq!(
            r.on_event(Event::Delete(pod("a", "sglang", "10.0.0.9", true))),
            [Change::Remove("http://10.0.0.9:8000".into())]
        );
    }

    #[test]
    fn a_relist_drops_the_pods_that_went_while_the_watch_was_away() {
        let mut r = reconciler();
        r.on_event(Event::Apply(pod("a", "sglang", "10.0.0.1", true)));
        r.on_event(Event::Apply(pod("b", "sglang", "10.0.0.2", true)));
        assert_eq!(r.on_event(Event::Init), []);
        assert_eq!(
            r.on_event(Event::InitApply(pod("b", "sglang", "10.0.0.2", true))),
            []
        );
        assert_eq!(
            r.on_event(Event::InitApply(pod("c", "sglang", "10.0.0.3", true))),
            [add("http://10.0.0.3:8000")]
        );
        assert_eq!(
            r.on_event(Event::InitDone),
            [Change::Remove("http://10.0.0.1:8000".into())]
        );
    }
}
