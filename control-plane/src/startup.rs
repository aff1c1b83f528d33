//! Startup: the workers named by the flags and the state file, registered
//! before the control plane serves.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tracing::{info, warn};

use crate::config::Args;
use crate::enrollment::{Enrolled, Enrollment};
use crate::workers::{persist, HealthChecker, WorkerAddress, WorkerId, WorkerSpec};

/// Registers the initial workers and waits until those that are up are
/// known to be: a restarted control plane must not answer "no healthy
/// workers" for the few milliseconds its first probes take (the others are
/// admitted as soon as they answer). The probes run at once, so this takes
/// at most one health-check timeout. Workers not reachable yet are
/// registered by `enrollment` once they are.
pub async fn register_initial_workers(
    args: &Args,
    enrollment: &Arc<Enrollment>,
    health: &HealthChecker,
) -> anyhow::Result<()> {
    let mut registered = Vec::new();
    for InitialWorker {
        url,
        spec,
        id,
        from_flags,
    } in initial_workers(args)?
    {
        match enrollment.enroll(&url, spec, id).await {
            Ok(Enrolled::Pending(_)) => {
                info!(worker = %url, "worker not reachable yet; it is registered once it is")
            }
            Ok(Enrolled::Registered(_, units)) => registered.extend(units.into_iter().take(1)),
            Ok(Enrolled::Existing(_)) => {}
            // A stored worker that is no longer valid (or the other mode's)
            // must not keep the router from starting.
            Err(e) if !from_flags => {
                warn!(worker = %url, error = %e, "stored worker not restored")
            }
            Err(e) => return Err(e).with_context(|| format!("cannot register worker {url}")),
        }
    }
    let up = futures::future::join_all(registered.iter().map(|w| health.admit(w))).await;
    info!(
        healthy = up.iter().filter(|ok| **ok).count(),
        workers = registered.len(),
        "workers registered"
    );
    Ok(())
}

/// How long a worker named at startup may take to come up.
pub fn startup_timeout(args: &Args) -> Duration {
    Duration::from_secs(args.worker_startup_timeout_secs)
}

/// A worker to register at startup.
struct InitialWorker {
    url: String,
    spec: WorkerSpec,
    /// Its id in the state file, if it is there.
    id: Option<WorkerId>,
    /// Named by the flags (else only by the state file).
    from_flags: bool,
}

/// The workers the flags name (`--worker-urls`, `--prefill`, `--decode`),
/// as written there.
pub fn flag_workers(args: &Args) -> anyhow::Result<Vec<(String, WorkerSpec)>> {
    let mut initial: Vec<(String, WorkerSpec)> = args
        .worker_urls
        .iter()
        .map(|u| (u.clone(), WorkerSpec::REGULAR))
        .collect();
    for (url, bootstrap_port) in args.prefill_workers().map_err(anyhow::Error::msg)? {
        let spec = WorkerSpec::Prefill { bootstrap_port };
        initial.push((url, spec));
    }
    for url in &args.decode {
        let spec = WorkerSpec::Decode;
        initial.push((url.clone(), spec));
    }
    Ok(initial)
}

/// The workers to register at startup: the flags', then the state file's
/// others.
fn initial_workers(args: &Args) -> anyhow::Result<Vec<InitialWorker>> {
    let initial = flag_workers(args)?;
    let stored = match &args.state_file {
        Some(path) => persist::load(path)?,
        None => Vec::new(),
    };
    let same = |a: &str, b: &str| match (WorkerAddress::normalise(a), WorkerAddress::normalise(b)) {
        (Ok(a), Ok(b)) => a.0 == b.0,
        _ => a == b,
    };
    let mut out: Vec<_> = initial
        .into_iter()
        .map(|(url, spec)| {
            // A flag's worker keeps the id the state file gave it.
            let id = stored
                .iter()
                .find(|s| same(&s.url, &url))
                .and_then(|s| s.id);
            InitialWorker {
                url,
                spec,
                id,
                from_flags: true,
            }
        })
        .collect();
    for s in stored {
        if out.iter().any(|w| same(&w.url, &s.url)) {
            continue;
        }
        match s.spec() {
            Some(spec) => out.push(InitialWorker {
                url: s.url,
                spec,
                id: s.id,
                from_flags: false,
            }),
            None => {
                warn!(worker = %s.url, kind = %s.worker_type, "unknown worker type in state file; skipped")
            }
        }
    }
    Ok(out)
}
