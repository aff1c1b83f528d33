//! The runtime the gRPC port is served on: by default a thread of its own,
//! apart from the runtime that runs everything else (health checks, the
//! admin API, the shared store's reads and writes). What a question starts
//! runs there too: PD prefill requests (`pd/prefill.rs`) and prefill waits;
//! so do the other control planes' tree inserts (`shared_tree.rs`), which
//! cost each decision 20% more when applied from another thread.
//!
//! Why: the gRPC port's work is many small messages (a filter session's
//! questions, answers and ends; ext_proc's exchanges), each a few
//! microseconds of deciding. On tokio's work-stealing runtime most of the
//! control plane's CPU went to its threads waking each other around those
//! messages (docs/request-cost.md): a message woke one thread, the task it
//! readied woke another to steal it. One thread that owns every gRPC
//! connection reads what has arrived, decides, and writes the answers
//! together, with no thread to wake; Envoy then reads several answers in
//! one go as well.
//!
//! The cost is that decisions share that thread: it is sized by
//! `--grpc-threads` (0 serves gRPC on the main runtime, as before).

use std::future::Future;
use std::io;
use std::thread;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Where the gRPC servers run.
pub enum GrpcRuntime {
    /// On the runtime the caller runs on.
    Shared,
    /// On a runtime of their own, driven by `thread`; it stops when `stop`
    /// is dropped (with this value).
    Own {
        handle: Handle,
        _stop: oneshot::Sender<()>,
    },
}

impl GrpcRuntime {
    /// A runtime of `threads` threads for the gRPC port; 0 shares the
    /// caller's runtime.
    pub fn start(threads: usize) -> io::Result<Self> {
        if threads == 0 {
            return Ok(GrpcRuntime::Shared);
        }
        let runtime = build(threads)?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        // A current-thread runtime runs its tasks only while something
        // blocks on it: this thread does, until the control plane stops.
        // (A multi-thread runtime has threads of its own; this one then
        // only keeps it alive.)
        thread::Builder::new().name("grpc".into()).spawn(move || {
            let _ = runtime.block_on(stopped);
        })?;
        Ok(GrpcRuntime::Own {
            handle,
            _stop: stop,
        })
    }

    /// A handle to this runtime, to run other tasks on its threads: the
    /// caller's runtime when shared (call from within it).
    pub fn handle(&self) -> Handle {
        match self {
            GrpcRuntime::Shared => Handle::current(),
            GrpcRuntime::Own { handle, .. } => handle.clone(),
        }
    }

    /// Runs `server` on this runtime; its result comes through the handle.
    pub fn spawn<F>(&self, server: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self {
            GrpcRuntime::Shared => tokio::spawn(server),
            GrpcRuntime::Own { handle, .. } => handle.spawn(server),
        }
    }
}

/// One thread: a current-thread runtime (no work stealing, no thread to
/// wake); more: a work-stealing runtime of that many.
fn build(threads: usize) -> io::Result<Runtime> {
    let mut builder = if threads == 1 {
        Builder::new_current_thread()
    } else {
        let mut b = Builder::new_multi_thread();
        b.worker_threads(threads).thread_name("grpc");
        b
    };
    builder.enable_all().build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_server_on_its_own_thread_runs_and_reports_through_its_handle() {
        let main_thread = thread::current().id();
        for threads in [0, 1, 2] {
            let runtime = GrpcRuntime::start(threads).unwrap();
            let ran_on = runtime
                .spawn(async {
                    (
                        thread::current().id(),
                        thread::current().name().map(String::from),
                    )
                })
                .await
                .unwrap();
            if threads == 0 {
                assert_eq!(ran_on.0, main_thread, "shared: the caller's runtime");
            } else {
                assert_ne!(ran_on.0, main_thread, "{threads} thread(s) of its own");
                assert_eq!(ran_on.1.as_deref(), Some("grpc"));
            }
        }
    }
}
