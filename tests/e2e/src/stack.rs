use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::bail;
use serde_json::Value;

use crate::envoy_config::{render_template, EnvoyEnv};
pub use crate::front_door::FrontDoor;
use crate::process::Proc;
pub use crate::sim_worker::SimWorker;
pub use crate::stack_options::{PdOptions, StackOptions, KV_TIMEOUT_MS};
use crate::{repo_root, wait_until};
use sglang_envoy_ports::free_port;

static STACKS: AtomicUsize = AtomicUsize::new(0);

/// A binary built by `scripts/test.sh` (`target/release`).
pub fn release_bin(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    target.join("release").join(name)
}

fn envoy_bin() -> PathBuf {
    std::env::var_os("SGLANG_ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/envoy"))
}

/// The wasm filter as `cargo build --release --target wasm32-wasip1` leaves it.
pub fn filter_wasm() -> PathBuf {
    repo_root().join("target/wasm32-wasip1/release/sglang_envoy_filter.wasm")
}

/// Envoy and the wasm filter, when both are built; `None` (the caller
/// skips its check) when either is missing, which CI never allows.
pub fn built_envoy_and_filter() -> Option<(PathBuf, PathBuf)> {
    let (envoy, wasm) = (envoy_bin(), filter_wasm());
    if envoy.exists() && wasm.exists() {
        return Some((envoy, wasm));
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must have Envoy ({}) and the filter ({})",
        envoy.display(),
        wasm.display()
    );
    None
}

/// The venv's Python (with the `openai` package), for client-compatibility tests.
pub fn venv_python() -> PathBuf {
    envoy_bin().with_file_name("python")
}

/// Envoy + control plane + simulated workers.
pub struct Stack {
    /// The simulated workers, in registration order.
    pub workers: Vec<SimWorker>,
    /// PD mode: the prefill workers.
    pub prefills: Vec<SimWorker>,
    /// PD mode: the decode workers.
    pub decodes: Vec<SimWorker>,
    /// `http://127.0.0.1:port` of Envoy's client listener.
    pub base: String,
    /// `http://127.0.0.1:port` of the control plane's admin API.
    pub admin: String,
    /// `http://127.0.0.1:port` of Envoy's own admin interface (stats).
    pub envoy_admin: String,
    /// `http://127.0.0.1:port` of the control plane's gRPC port (TLS in
    /// the picker setup).
    pub grpc: String,
    /// `http://127.0.0.1:port` where gRPC health answers in plaintext: the
    /// gRPC port, or in the picker setup a port of its own.
    pub grpc_health: String,
    cp: Proc,
    cp_args: Vec<String>,
    cp_starts: usize,
    cp_hosts_file: Option<PathBuf>,
    cp_env: Vec<(String, String)>,
    envoy: Proc,
    envoy_concurrency: usize,
    /// Where logs and the rendered config live; last, so that the
    /// processes writing there are gone before it is removed.
    pub dir: crate::ScratchDir,
}

/// Starts the control plane with `args`, in a mount namespace of its own
/// with `hosts` as its `/etc/hosts` when given.
fn spawn_control_plane(
    name: &str,
    args: &[String],
    dir: &Path,
    hosts: Option<&Path>,
    env: &[(String, String)],
) -> anyhow::Result<Proc> {
    let bin = release_bin("sglang-envoy-control-plane");
    let Some(hosts) = hosts else {
        return Proc::spawn_env(name, &bin, args, dir, env);
    };
    // The bind mount is private to the namespace (unshare's default
    // propagation), so the machine's /etc/hosts is untouched.
    // --map-root-user: a user namespace lets a user who is not root mount
    // too, where the kernel allows unprivileged user namespaces.
    let mut all: Vec<String> = [
        "--map-root-user",
        "--mount",
        "sh",
        "-c",
        "mount --bind \"$0\" /etc/hosts && exec \"$@\"",
    ]
    .map(String::from)
    .to_vec();
    all.push(hosts.display().to_string());
    all.push(bin.display().to_string());
    all.extend_from_slice(args);
    Proc::spawn_env(name, Path::new("unshare"), &all, dir, env)
}

/// Whether this machine lets the tests give a process its own `/etc/hosts`
/// ([`StackOptions::cp_hosts_file`]): `unshare` and the right to mount.
pub fn hosts_file_supported() -> bool {
    std::process::Command::new("unshare")
        .args([
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            "mount --bind /etc/hosts /etc/hosts",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

async fn ok(url: &str) -> bool {
    ok_with(&reqwest::Client::new(), url).await
}

pub(crate) async fn ok_with(client: &reqwest::Client, url: &str) -> bool {
    matches!(client.get(url).send().await, Ok(r) if r.status().is_success())
}

async fn get_json(url: &str) -> Option<Value> {
    get_json_with(&reqwest::Client::new(), url).await
}

pub(crate) async fn get_json_with(client: &reqwest::Client, url: &str) -> Option<Value> {
    client.get(url).send().await.ok()?.json().await.ok()
}

impl Stack {
    /// Starts everything and waits until Envoy routes to the workers.
    pub async fn start(opts: StackOptions) -> anyhow::Result<Stack> {
        let n = STACKS.fetch_add(1, Ordering::Relaxed);
        let dir = crate::fresh_dir(&format!("sglang-e2e-{}-{n}", std::process::id()))?;

        let mut workers = Vec::new();
        let (mut prefills, mut decodes) = (Vec::new(), Vec::new());
        let mut pd_args = Vec::new();
        if let Some(pd) = &opts.pd {
            pd_args.push("--pd-disaggregation".to_string());
            for _ in 0..pd.prefills {
                let mut args = opts.worker_args.clone();
                args.extend(pd.prefill_args.iter().cloned());
                let w = SimWorker::start_pd_with(
                    &dir,
                    "prefill",
                    free_port(),
                    &args,
                    opts.worker_tls.as_ref(),
                )
                .await?;
                pd_args.push("--prefill".into());
                pd_args.push(w.url.clone());
                pd_args.push(match (pd.bootstrap_none, w.bootstrap_port) {
                    (false, Some(p)) => p.to_string(),
                    _ => "none".into(),
                });
                prefills.push(w);
            }
            let default_port = match (pd.bootstrap_none, prefills.first()) {
                (true, Some(p)) => p.bootstrap_port.unwrap_or_else(free_port),
                _ => free_port(),
            };
            for _ in 0..pd.decodes {
                let mut args = opts.worker_args.clone();
                args.extend(pd.decode_args.iter().cloned());
                let w = SimWorker::start_pd_with(
                    &dir,
                    "decode",
                    default_port,
                    &args,
                    opts.worker_tls.as_ref(),
                )
                .await?;
                pd_args.push("--decode".into());
                pd_args.push(w.url.clone());
                decodes.push(w);
            }
        } else {
            for _ in 0..opts.workers {
                workers.push(
                    SimWorker::start_with(&dir, &opts.worker_args, opts.worker_tls.as_ref())
                        .await?,
                );
            }
        }

        let (admin_port, grpc_port) = (free_port(), opts.cp_grpc_port.unwrap_or_else(free_port));
        let mut args = vec![
            "--admin-port".to_string(),
            admin_port.to_string(),
            "--grpc-port".into(),
            grpc_port.to_string(),
            "--policy".into(),
            opts.policy.clone(),
            "--log-level".into(),
            "debug".into(),
        ];
        if !opts
            .cp_args
            .iter()
            .any(|a| a == "--health-check-interval-secs")
        {
            // Quick checks keep the suite quick; tests of the schedule
            // itself set the interval.
            args.push("--health-check-interval-secs".into());
            args.push("1".into());
        }
        if !workers.is_empty() {
            args.push("--worker-urls".into());
            args.extend(workers.iter().map(|w| w.url.clone()));
        }
        args.extend(pd_args);
        let grpc_health_port = free_port();
        let shape = opts.picker_shape();
        let picker = shape.is_some();
        if let Some(shape) = shape {
            // As an endpoint picker runs: TLS on the gRPC port when Envoy's
            // cluster speaks it, plaintext health on a port of its own, the
            // destination its gateway takes.
            args.extend(shape.control_plane_args());
            args.push("--grpc-health-port".into());
            args.push(grpc_health_port.to_string());
        }
        // Like an operator's deployment: the registry survives restarts.
        args.push("--state-file".into());
        args.push(dir.join("workers.json").display().to_string());
        args.extend(opts.cp_args.iter().cloned());
        let cp = spawn_control_plane(
            "control-plane",
            &args,
            &dir,
            opts.cp_hosts_file.as_deref(),
            &opts.cp_env,
        )?;
        let admin = format!("http://127.0.0.1:{admin_port}");
        let cp_health = format!("{admin}/health");
        if !wait_until(Duration::from_secs(20), || ok(&cp_health)).await {
            bail!("control plane did not start:\n{}", cp.log());
        }

        let (port, envoy_admin) = (free_port(), free_port());
        let wasm = filter_wasm();
        let config_path = dir.join("envoy.yaml");
        if let Some(config) = &opts.envoy_config {
            let routed = if decodes.is_empty() {
                &workers
            } else {
                &decodes
            };
            let env = EnvoyEnv {
                dir: dir.to_path_buf(),
                listen_port: port,
                admin_port: envoy_admin,
                cp_grpc_port: grpc_port,
                cp_admin_port: admin_port,
                wasm: wasm.clone(),
                workers: routed.iter().map(SimWorker::address).collect(),
            };
            std::fs::write(&config_path, (config.0)(&env)?)?;
        } else {
            let ports = [port, envoy_admin, grpc_port, admin_port];
            render_template(&opts, &config_path, &wasm, ports)?;
        }
        let envoy = spawn_envoy("envoy", &dir, opts.envoy_concurrency)?;
        let stack = Stack {
            workers,
            prefills,
            decodes,
            // --tls-cert-path: Envoy's listener speaks TLS (render.sh).
            base: if opts.cp_args.iter().any(|a| a == "--tls-cert-path") {
                format!("https://127.0.0.1:{port}")
            } else {
                format!("http://127.0.0.1:{port}")
            },
            admin,
            dir,
            envoy_admin: format!("http://127.0.0.1:{envoy_admin}"),
            grpc: format!("http://127.0.0.1:{grpc_port}"),
            grpc_health: if picker {
                format!("http://127.0.0.1:{grpc_health_port}")
            } else {
                format!("http://127.0.0.1:{grpc_port}")
            },
            cp,
            cp_args: args,
            cp_starts: 1,
            cp_hosts_file: opts.cp_hosts_file.clone(),
            cp_env: opts.cp_env.clone(),
            envoy,
            envoy_concurrency: opts.envoy_concurrency,
        };
        // Ready when a request through Envoy reaches a worker (or, with no
        // workers, when the admin route answers).
        let probe = if stack.workers.is_empty() && stack.decodes.is_empty() {
            stack.url("/health")
        } else {
            stack.url("/v1/models")
        };
        // Workers that require SGLang's `--api-key` answer it only with the key.
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(i) = opts.worker_args.iter().position(|a| a == "--api-key") {
            let key = opts.worker_args.get(i + 1).cloned().unwrap_or_default();
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {key}").parse()?,
            );
        }
        // A TLS listener's certificate is the test's to check, not the probe's.
        let prober = reqwest::Client::builder()
            .default_headers(headers)
            .danger_accept_invalid_certs(stack.base.starts_with("https"))
            .build()?;
        if !wait_until(Duration::from_secs(30), || ok_with(&prober, &probe)).await {
            // The stack is dropped with this error, before any panic, so
            // its directory goes too: the logs that explain it go here.
            bail!(
                "Envoy did not become ready:\n{}\n---- last lines of the control plane ----\n{}",
                stack.envoy.log(),
                stack.cp.log_tail(40)
            );
        }
        Ok(stack)
    }

    /// `workers` simulated workers and every other option at its default.
    pub async fn with_workers(workers: usize) -> Stack {
        Stack::start(StackOptions {
            workers,
            ..Default::default()
        })
        .await
        .expect("the stack starts")
    }

    /// GETs a JSON document through Envoy (`Null` when there is none).
    pub async fn get_json(&self, path: &str) -> Value {
        get_json(&self.url(path)).await.unwrap_or_default()
    }

    /// Waits until `/workers` lists the worker at `url` with `healthy`
    /// as given; false if it still is not after `timeout`.
    pub async fn wait_marked(&self, url: &str, healthy: bool, timeout: Duration) -> bool {
        wait_until(timeout, || async {
            self.get_json("/workers").await["workers"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|w| w["url"] == url && w["healthy"] == healthy)
        })
        .await
    }

    /// A URL on Envoy's client port.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A URL on the control plane's admin port (where changes to the
    /// workers are served without a token).
    pub fn admin_url(&self, path: &str) -> String {
        format!("{}{path}", self.admin)
    }

    /// POSTs a raw JSON body through Envoy (a minute at most: a test that
    /// would hang fails instead).
    pub async fn post(&self, path: &str, body: &str) -> reqwest::Response {
        reqwest::Client::new()
            .post(self.url(path))
            .timeout(Duration::from_secs(60))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("Envoy did not answer")
    }

    /// POSTs a raw JSON body through Envoy on a task of its own, for a
    /// request that must be in flight while the test does something else.
    pub fn post_spawned(
        &self,
        path: &str,
        body: String,
    ) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
        let request = reqwest::Client::new()
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body);
        tokio::spawn(request.send())
    }

    /// Waits, 5 s at most for each, until this stack's control plane lists
    /// every worker of `other` as healthy (taken from the fleet store they
    /// share); panics naming the first it never listed.
    pub async fn wait_fleet_of(&self, other: &Stack) {
        let fleet = other
            .workers
            .iter()
            .chain(&other.prefills)
            .chain(&other.decodes);
        for w in fleet {
            assert!(
                self.wait_marked(&w.url, true, Duration::from_secs(5)).await,
                "a control plane never took {} from the store:\n{}",
                w.url,
                self.control_plane_log()
            );
        }
    }

    /// `(worker url, load)` from `/get_loads` through Envoy.
    pub async fn loads(&self) -> Vec<(String, u64)> {
        loads_at(&self.url("/get_loads")).await
    }

    /// Waits until every worker's load is zero.
    pub async fn wait_loads_zero(&self, timeout: Duration) -> bool {
        wait_until(timeout, || async {
            let loads = self.loads().await;
            !loads.is_empty() && loads.iter().all(|(_, l)| *l == 0)
        })
        .await
    }

    /// The control plane's Prometheus text.
    pub async fn metrics(&self) -> String {
        let r = reqwest::get(format!("{}/metrics", self.admin)).await;
        match r {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// A metric of the control plane, summed over its labels (0 when absent).
    pub async fn metric(&self, name: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| l.starts_with(name))
            .filter(|l| l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// One counter or gauge of Envoy's stats (`None` when Envoy has none
    /// by that name).
    pub async fn envoy_stat(&self, name: &str) -> Option<u64> {
        let text = reqwest::get(format!("{}/stats?filter=^{name}$", self.envoy_admin))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(": ")?
                .trim()
                .parse()
                .ok()
        })
    }

    /// Waits until the wasm filter has fetched the control plane's list of
    /// healthy workers (it asks every `workers_refresh_ms`, 1 s) after this
    /// call began, so that its outage fallback knows what the control plane
    /// knew then; false if that has not happened within `timeout`. Returns
    /// true at once for the ext_proc front doors, which have no such list.
    ///
    /// The fetches are the only unary calls to the control plane's cluster
    /// while the filter's session is up and no request is too big for it,
    /// and each VM (one per Envoy worker thread) has at most one in flight:
    /// two more completed calls per VM than at the start mean a fetch that
    /// began after it. With one worker thread (the default) that is exact;
    /// with more, it is the same count spread over the threads.
    pub async fn wait_worker_list_fetched(&self, timeout: Duration) -> bool {
        if FrontDoor::current() != FrontDoor::Wasm {
            return true;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let threads = self.envoy_concurrency.max(1) as f64;
        // Ends go on the session only while it is up; without it they are
        // unary calls too.
        let session = wait_until(timeout, || async {
            self.metric("sgl_router_filter_sessions").await >= threads
        })
        .await;
        if !session {
            return false;
        }
        let completed = || async {
            self.envoy_stat("cluster.sglang_control_plane.upstream_rq_completed")
                .await
        };
        let Some(start) = completed().await else {
            return false;
        };
        let needed = start + 2 * self.envoy_concurrency.max(1) as u64;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        wait_until(left, || async { completed().await.unwrap_or(0) >= needed }).await
    }

    /// Envoy's log so far (`E2E_ENVOY_LOG` sets its level, `warn` by
    /// default; the wasm filter's warnings are in it).
    pub fn envoy_log(&self) -> String {
        self.envoy.log()
    }

    /// `(worker url, load)` from `/get_loads` on the control plane's own
    /// admin port (answers while Envoy is gone).
    pub async fn admin_loads(&self) -> Vec<(String, u64)> {
        loads_at(&self.admin_url("/get_loads")).await
    }

    /// Kills Envoy like a crash (SIGKILL).
    pub fn kill_envoy(&mut self) {
        self.envoy.kill();
    }

    /// Stops Envoy and starts a fresh one on the same configuration: its
    /// filter VMs have served nothing yet. Waits until its admin says it
    /// is ready (which sends nothing through the filter).
    pub async fn restart_envoy(&mut self) -> anyhow::Result<()> {
        self.envoy.kill();
        self.envoy = spawn_envoy("envoy-2", &self.dir, self.envoy_concurrency)?;
        let ready = format!("{}/ready", self.envoy_admin);
        if !wait_until(Duration::from_secs(30), || ok(&ready)).await {
            bail!("Envoy did not restart:\n{}", self.envoy.log());
        }
        Ok(())
    }

    /// Sends signal `name` (`STOP`, `CONT`) to the control plane.
    pub fn signal_control_plane(&self, name: &str) -> bool {
        self.cp.signal(name)
    }

    /// Waits, `timeout` at most, for the control plane to exit on its own
    /// (after a signal); true if it did.
    pub async fn control_plane_exits(&mut self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.cp.exited() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Kills the control plane like a crash.
    pub fn kill_control_plane(&mut self) {
        self.cp.kill();
    }

    /// Starts the control plane again with the same flags (after
    /// [`Stack::kill_control_plane`]) and waits for its admin API.
    pub async fn restart_control_plane(&mut self) -> anyhow::Result<()> {
        self.cp.kill();
        self.cp_starts += 1;
        self.cp = spawn_control_plane(
            &format!("control-plane-{}", self.cp_starts),
            &self.cp_args,
            &self.dir,
            self.cp_hosts_file.as_deref(),
            &self.cp_env,
        )?;
        let health = format!("{}/health", self.admin);
        if !wait_until(Duration::from_secs(20), || ok(&health)).await {
            bail!("control plane did not restart:\n{}", self.cp.log());
        }
        Ok(())
    }

    /// The control plane's log so far.
    pub fn control_plane_log(&self) -> String {
        self.cp.log()
    }
}

/// Envoy (as `name`) on the configuration written in `dir`.
fn spawn_envoy(name: &str, dir: &Path, concurrency: usize) -> anyhow::Result<Proc> {
    Proc::spawn(
        name,
        &envoy_bin(),
        &[
            "-c".into(),
            dir.join("envoy.yaml").display().to_string(),
            "--concurrency".into(),
            concurrency.to_string(),
            "--disable-hot-restart".into(),
            "--log-level".into(),
            std::env::var("E2E_ENVOY_LOG").unwrap_or("warn".into()),
        ],
        dir,
    )
}

/// `(worker url, load)` from the `/get_loads` document at `url`.
async fn loads_at(url: &str) -> Vec<(String, u64)> {
    get_json(url)
        .await
        .and_then(|v| v["workers"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|w| {
            (
                w["worker"].as_str().unwrap_or_default().to_string(),
                w["load"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect()
}
