//! One simulated SGLang worker process (`tests/sim-worker`), as the tests
//! start, reach, reconfigure and kill it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use serde_json::Value;

use crate::process::Proc;
use crate::stack::{get_json_with, ok_with, release_bin};
use crate::tls::WorkerTls;
use crate::{wait_until, KV_TIMEOUT_MS};
use sglang_envoy_ports::free_port;

/// What the simulator prints when its port is taken.
const PORT_TAKEN: &str = "cannot listen on";

/// How a start ended.
enum Started {
    Up,
    Exited,
    TimedOut,
}

/// One simulated SGLang worker process.
pub struct SimWorker {
    /// `http://127.0.0.1:port` (`https://` for a TLS worker)
    pub url: String,
    /// PD prefill workers: the port serving the KV cache to decode workers.
    pub bootstrap_port: Option<u16>,
    /// Reaches the worker directly (trusting a TLS worker's CA, with the
    /// client certificate it may require).
    client: reqwest::Client,
    port: u16,
    /// Its flags, TLS ones included, to start it again the same.
    args: Vec<String>,
    dir: PathBuf,
    starts: usize,
    proc: Proc,
}

impl SimWorker {
    /// Starts a simulated worker and waits for its `/health`.
    pub async fn start(dir: &Path, args: &[String]) -> anyhow::Result<SimWorker> {
        SimWorker::start_with(dir, args, None).await
    }

    /// [`SimWorker::start`], serving HTTPS with `tls` when given.
    pub async fn start_with(
        dir: &Path,
        args: &[String],
        tls: Option<&WorkerTls>,
    ) -> anyhow::Result<SimWorker> {
        SimWorker::start_first_free(dir, free_port, args, tls).await
    }

    /// [`SimWorker::start_with`] on ports drawn from `port`. A port that
    /// was free when drawn can be taken before the worker binds it (by
    /// any process binding an ephemeral port, a worker's ZMQ publisher
    /// among them); the worker then exits at once, and is started again
    /// on the next port drawn.
    async fn start_first_free(
        dir: &Path,
        mut port: impl FnMut() -> u16,
        args: &[String],
        tls: Option<&WorkerTls>,
    ) -> anyhow::Result<SimWorker> {
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let mut w = SimWorker::spawn_with(dir, port(), args, tls)?;
            match w.started(Duration::from_secs(20)).await {
                Started::Up => return Ok(w),
                Started::Exited if attempt < ATTEMPTS && w.proc.log().contains(PORT_TAKEN) => {}
                Started::Exited => bail!(
                    "simulated worker {} exited before it was healthy:\n{}",
                    w.url,
                    w.proc.log_tail(30)
                ),
                Started::TimedOut => bail!(
                    "simulated worker {} did not become healthy:\n{}",
                    w.url,
                    w.proc.log_tail(30)
                ),
            }
        }
        bail!("no port to start a simulated worker on")
    }

    /// Waits until `/health` answers 200, the process ends, or `timeout`.
    async fn started(&mut self, timeout: Duration) -> Started {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.proc.exited() {
                return Started::Exited;
            }
            // Bounded: whatever holds a taken port may accept and never answer.
            let probe = tokio::time::timeout(Duration::from_secs(2), self.is_up());
            if probe.await.unwrap_or(false) {
                return Started::Up;
            }
            if tokio::time::Instant::now() >= deadline {
                return Started::TimedOut;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts a simulated worker on `port` without waiting for it (a
    /// worker that comes up after the router).
    pub fn spawn(dir: &Path, port: u16, args: &[String]) -> anyhow::Result<SimWorker> {
        SimWorker::spawn_with(dir, port, args, None)
    }

    /// [`SimWorker::spawn`], serving HTTPS with `tls` when given.
    pub fn spawn_with(
        dir: &Path,
        port: u16,
        args: &[String],
        tls: Option<&WorkerTls>,
    ) -> anyhow::Result<SimWorker> {
        SimWorker::spawn_at(dir, "127.0.0.1", port, args, tls)
    }

    /// [`SimWorker::spawn_with`], listening on `host` (another loopback
    /// address, say, to stand for a worker that moved).
    pub fn spawn_at(
        dir: &Path,
        host: &str,
        port: u16,
        args: &[String],
        tls: Option<&WorkerTls>,
    ) -> anyhow::Result<SimWorker> {
        let mut args = args.to_vec();
        args.extend(["--host".to_string(), host.to_string()]);
        // SGLang's /health takes about a second (a one-token generate); the
        // simulator does too by default. The suite's workers answer at once
        // unless a test asks for the real delay.
        if !args.iter().any(|a| a == "--health-delay-ms") {
            args.extend(["--health-delay-ms".to_string(), "0".into()]);
        }
        let (scheme, client) = match tls {
            Some(tls) => {
                args.extend(tls.worker_args());
                ("https", tls.client()?)
            }
            None => ("http", reqwest::Client::new()),
        };
        let mut all = vec!["--port".to_string(), port.to_string()];
        all.extend_from_slice(&args);
        let proc = Proc::spawn(
            &if host == "127.0.0.1" {
                format!("worker-{port}")
            } else {
                format!("worker-{host}-{port}")
            },
            &release_bin("sglang-sim-worker"),
            &all,
            dir,
        )?;
        Ok(SimWorker {
            url: format!("{scheme}://{host}:{port}"),
            bootstrap_port: None,
            client,
            port,
            args,
            dir: dir.to_path_buf(),
            starts: 1,
            proc,
        })
    }

    /// Waits until the worker's `/health` answers 200.
    pub async fn wait_healthy(&self, timeout: Duration) -> anyhow::Result<()> {
        let health = format!("{}/health", self.url);
        if !wait_until(timeout, || ok_with(&self.client, &health)).await {
            bail!("simulated worker {} did not become healthy", self.url);
        }
        Ok(())
    }

    /// Whether the worker's `/health` answers 200 now.
    pub async fn is_up(&self) -> bool {
        ok_with(&self.client, &format!("{}/health", self.url)).await
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts the worker again (after [`SimWorker::kill`]) on the same
    /// port with the same flags, without waiting for it. Its counters and
    /// request log start empty.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.proc.kill();
        self.starts += 1;
        let mut all = vec!["--port".to_string(), self.port.to_string()];
        all.extend_from_slice(&self.args);
        self.proc = Proc::spawn(
            &format!("worker-{}-{}", self.port, self.starts),
            &release_bin("sglang-sim-worker"),
            &all,
            &self.dir,
        )?;
        Ok(())
    }

    /// Starts a PD worker (`mode` prefill or decode) whose bootstrap port
    /// (its own for prefill, the default it fetches from for decode) is
    /// `bootstrap_port`.
    pub async fn start_pd(
        dir: &Path,
        mode: &str,
        bootstrap_port: u16,
        args: &[String],
    ) -> anyhow::Result<SimWorker> {
        SimWorker::start_pd_with(dir, mode, bootstrap_port, args, None).await
    }

    /// [`SimWorker::start_pd`], serving HTTPS with `tls` when given (the
    /// bootstrap port stays plain HTTP).
    pub async fn start_pd_with(
        dir: &Path,
        mode: &str,
        bootstrap_port: u16,
        args: &[String],
        tls: Option<&WorkerTls>,
    ) -> anyhow::Result<SimWorker> {
        let mut all = vec![
            "--disaggregation-mode".to_string(),
            mode.to_string(),
            "--disaggregation-bootstrap-port".into(),
            bootstrap_port.to_string(),
            "--disaggregation-timeout-ms".into(),
            KV_TIMEOUT_MS.to_string(),
        ];
        all.extend_from_slice(args);
        let mut w = SimWorker::start_with(dir, &all, tls).await?;
        if mode == "prefill" {
            w.bootstrap_port = Some(bootstrap_port);
        }
        Ok(w)
    }

    /// `host:port`, as the control plane names the worker to Envoy.
    pub fn address(&self) -> String {
        self.url
            .split_once("://")
            .map_or(self.url.as_str(), |(_, a)| a)
            .to_string()
    }

    /// The simulator's counters (`/_sim/stats`).
    pub async fn stats(&self) -> Value {
        get_json_with(&self.client, &format!("{}/_sim/stats", self.url))
            .await
            .unwrap_or_default()
    }

    /// Requests the worker received (see the simulator's `/_sim/requests`).
    pub async fn requests(&self) -> Vec<Value> {
        get_json_with(&self.client, &format!("{}/_sim/requests", self.url))
            .await
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    }

    /// Inference requests the worker received.
    pub async fn served(&self) -> u64 {
        get_json_with(&self.client, &format!("{}/_sim/stats", self.url))
            .await
            .and_then(|v| v["requests_total"].as_u64())
            .unwrap_or(0)
    }

    /// Changes the simulator's switches (`fail_status`, `stall`, `healthy`...).
    pub async fn configure(&self, config: Value) {
        let _ = self
            .client
            .post(format!("{}/_sim/config", self.url))
            .json(&config)
            .send()
            .await;
    }

    /// Kills the worker like a crash.
    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

/// The longest request body any of `workers` received (to check that a large
/// body arrived whole).
pub async fn longest_body_received(workers: &[SimWorker]) -> usize {
    let mut longest = 0;
    for w in workers {
        for req in w.requests().await {
            longest = longest.max(req["body"].as_str().map_or(0, str::len));
        }
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fresh_dir;

    /// A port taken between being drawn and being bound costs one more
    /// start, not the test.
    #[tokio::test]
    async fn a_worker_whose_port_was_taken_starts_on_another() {
        let dir = fresh_dir(&format!("sglang-e2e-port-taken-{}", std::process::id()))
            .expect("a directory");
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let taken_port = taken.local_addr().expect("its address").port();
        let mut ports = [taken_port, free_port()].into_iter();
        let w = SimWorker::start_first_free(&dir, || ports.next().unwrap_or(0), &[], None)
            .await
            .expect("started on the second port");
        assert_ne!(w.port(), taken_port);
        assert!(w.is_up().await);
    }
}
