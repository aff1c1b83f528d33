//! Background upkeep: tree eviction, the state file, circuit timers, DNS,
//! and releasing the load of requests whose end was never reported.

use std::sync::Arc;
use std::time::Duration;

use tracing::{error, warn};

use crate::config::Args;
use crate::engine::Engine;
use crate::workers::{persist, Registry};

/// Starts every upkeep task `args` asks for.
pub fn spawn(args: &Args, engine: &Arc<Engine>) {
    let registry = engine.registry().clone();
    if let Some(path) = args.state_file.clone() {
        tokio::spawn(persist_changes(registry.clone(), path));
    }
    tokio::spawn(evict(
        engine.clone(),
        Duration::from_secs(args.eviction_interval_secs),
    ));
    tokio::spawn(tick_circuits(registry));
    if args.dns_refresh_secs > 0 {
        tokio::spawn(crate::dns::follow(
            engine.clone(),
            Duration::from_secs(args.dns_refresh_secs),
        ));
    }
    tokio::spawn(reap(
        engine.clone(),
        Duration::from_secs(args.request_timeout_secs),
    ));
}

/// Trims every policy's approximate trees every `every`.
async fn evict(engine: Arc<Engine>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        for (_, policy) in engine.policies().each() {
            // Each policy sees the units it routes over, no others.
            let all = engine.registry().all();
            let units: Vec<_> = all
                .iter()
                .filter(|w| Arc::ptr_eq(engine.policies().of(w.role()), &policy))
                .cloned()
                .collect();
            // Eviction walks the tree; keep it off the async workers.
            let _ = tokio::task::spawn_blocking(move || policy.maintain(&units)).await;
        }
    }
}

/// Writes the worker set to `path` whenever it changes.
///
/// The first write waits for a change, so a restart whose workers are still
/// coming up (DP-aware registration) does not overwrite the file with fewer.
async fn persist_changes(registry: Arc<Registry>, path: std::path::PathBuf) {
    let mut changes = registry.subscribe();
    let mut last = Some(persist::snapshot(&registry));
    loop {
        if changes.changed().await.is_err() {
            return;
        }
        let now = persist::snapshot(&registry);
        if last.as_ref() != Some(&now) {
            match persist::save(&path, &now) {
                Ok(()) => last = Some(now),
                Err(e) => error!(error = %e, "cannot save the worker state"),
            }
        }
    }
}

/// Lets open circuits whose time is up take requests again.
async fn tick_circuits(registry: Arc<Registry>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        registry.tick_circuits();
    }
}

/// Releases the load of requests whose end was never reported.
async fn reap(engine: Arc<Engine>, timeout: Duration) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tick.tick().await;
        let n = engine.reap(timeout);
        if n > 0 {
            warn!(
                released = n,
                "released load of requests whose end was never reported"
            );
        }
    }
}
