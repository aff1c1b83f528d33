//! Workers named by DNS follow their names. Envoy's EDS endpoints are IP
//! addresses, so a name is resolved when its worker is added; a Kubernetes
//! pod that is rescheduled keeps its name (a headless Service's
//! `pod.service` name, a StatefulSet's) but not its IP. Every
//! `--dns-refresh-secs` the names are resolved again and a server whose name
//! now points elsewhere is moved there (see [`Registry::readdress`]).
//!
//! [`Registry::readdress`]: crate::workers::Registry::readdress

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::engine::Engine;
use crate::workers::WorkerAddress;

/// Resolves the workers' names every `every`, until the task is dropped.
pub async fn follow(engine: Arc<Engine>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate: the names were just resolved
    loop {
        tick.tick().await;
        refresh(&engine).await;
    }
}

/// Resolves every worker's name once and moves the servers whose name
/// points elsewhere now. A name that does not resolve keeps its last
/// address (a DNS hiccup must not take a worker away). Returns how many
/// servers moved.
pub async fn refresh(engine: &Engine) -> usize {
    let registry = engine.registry();
    let mut seen = HashSet::new();
    let named: Vec<_> = registry
        .all()
        .iter()
        .filter(|w| w.dns_name.is_some() && seen.insert(w.base_url.clone()))
        .map(|w| (w.base_url.clone(), w.endpoint))
        .collect();
    let mut moved = 0;
    for (base_url, current) in named {
        let address = match WorkerAddress::resolve_keeping(&base_url, Some(current)).await {
            Ok(a) if a.endpoint == current => continue,
            Ok(a) => a,
            Err(e) => {
                debug!(worker = %base_url, error = %e, "name not resolved; keeping its address");
                continue;
            }
        };
        let to = address.endpoint;
        if let Err(e) = engine.options().addresses.check(&base_url, to) {
            warn!(worker = %base_url, error = %e, "name moved to a refused address; keeping the old one");
            continue;
        }
        match registry.readdress(&base_url, address) {
            Ok(old) if old.is_empty() => {}
            Ok(old) => {
                engine.forget(&old);
                info!(worker = %base_url, from = %current, %to, "worker's name moved; following it");
                moved += 1;
            }
            Err(e) => warn!(worker = %base_url, error = %e, "worker's name moved; not followed"),
        }
    }
    moved
}
