//! Going away without failing a request: what SIGTERM starts (a rolling
//! update, `docker stop`, a node drained while a PodDisruptionBudget keeps
//! the other replicas serving).
//!
//! A control plane that simply exited would drop the PD prefill halves it
//! is running: their connections close, the prefill server aborts them,
//! and each decode waits for KV that never comes (the client gets an
//! error). So on the signal it drains instead:
//!
//! 1. The gRPC port stops taking connections and tells Envoy's open ones
//!    to take no new streams (HTTP/2 GOAWAY): Envoy's next streams and
//!    calls go to the other replicas.
//! 2. Every filter session ends with `UNAVAILABLE` after the answers it
//!    already sent (`session.rs`); the filter opens its next one elsewhere
//!    at once and asks its unanswered questions there. Envoy's EDS streams
//!    end too (`xds.rs`): Envoy asks another replica for the endpoints,
//!    keeping the ones it has meanwhile.
//! 3. What is still in flight runs to its end: the calls and ext_proc
//!    streams Envoy had started here (the gRPC server ends once every
//!    connection has closed), and the prefill halves sent from here.
//!    `--shutdown-grace-period-secs` at most (sglang-router's flag, 180 s
//!    by default; Kubernetes kills a pod once its own grace period, 30 s
//!    by default, runs out); then the process exits. A second signal
//!    (Ctrl-C pressed again) ends it at once (`main.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{sleep, timeout_at, Instant};
use tonic::Status;
use tracing::{info, warn};

use crate::engine::Engine;

/// Whether this control plane is going away: started once, watched by
/// what must end for it (the gRPC server, the filter sessions, the EDS
/// streams).
#[derive(Clone, Default)]
pub struct Drain(Arc<watch::Sender<bool>>);

impl Drain {
    /// Starts the drain: every watcher is told.
    pub fn start(&self) {
        self.0.send_replace(true);
    }

    /// True once started.
    pub fn is_started(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once started: at its first poll if it already has. It
    /// checks the flag once, then only waits to be woken, so a loop can
    /// keep one pinned and poll it beside its other work for nothing.
    pub fn started(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut told = self.0.subscribe();
        async move {
            // An error is the sender gone: the process is ending anyway.
            let _ = told.wait_for(|&going| going).await;
        }
    }
}

/// What a stream refused or ended by the drain gets: `UNAVAILABLE`, which
/// Envoy and the filter answer by going to another replica.
pub fn refusal() -> Status {
    Status::unavailable("this control plane is shutting down")
}

/// How often the prefills still running are counted while draining.
const POLL: Duration = Duration::from_millis(20);

/// Resolves on Ctrl-C or SIGTERM: what `docker stop`, `docker compose down`
/// and Kubernetes send. As a container's PID 1 the process would otherwise
/// ignore SIGTERM and be killed only when the grace period ran out.
pub async fn signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// Drains: starts `going`, which ends the sessions, the EDS streams and
/// the gRPC port's connections (see `main.rs`); then waits until `served`
/// (the gRPC server) has ended and the prefill halves of `engine` have,
/// `grace` at most. Returns how many prefills were left running.
pub async fn drain(
    going: &Drain,
    engine: &Engine,
    served: impl Future<Output = ()>,
    grace: Duration,
) -> usize {
    going.start();
    let started = Instant::now();
    let deadline = started + grace;
    let mut running = engine.prefills_running();
    info!(
        prefills = running,
        "draining: sessions ended, new connections refused"
    );
    let streams_ended = timeout_at(deadline, served).await.is_ok();
    running = engine.prefills_running();
    while running > 0 && Instant::now() < deadline {
        sleep(POLL).await;
        running = engine.prefills_running();
    }
    if running > 0 || !streams_ended {
        warn!(
            prefills = running,
            streams_ended, "draining took too long: exiting with work in flight"
        );
    } else {
        info!(after = ?started.elapsed(), "drained");
    }
    running
}
