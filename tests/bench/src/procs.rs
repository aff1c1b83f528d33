//! Starting and stopping what is benchmarked: simulated workers, the peer
//! (sglang-router), and this project's stack (control plane + Envoy with the
//! wasm filter, started like `scripts/quickstart.sh` does). Every process is
//! killed when its handle is dropped.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use crate::envoy;
use crate::params::{Contender, Peer};

/// Where the binaries and the venvs are.
#[derive(Debug, Clone)]
pub struct Paths {
    /// Repository root.
    pub root: PathBuf,
    /// `sglang-sim-worker`.
    pub sim: PathBuf,
    /// `bench-instant-worker` (scenario 1's worker).
    pub instant_worker: PathBuf,
    /// `sglang-envoy-control-plane`.
    pub control_plane: PathBuf,
    /// The filter's `.wasm`.
    pub wasm: PathBuf,
    /// The `envoy` binary.
    pub envoy: PathBuf,
    /// The Python of the venv with sglang-router.
    pub peer_python: PathBuf,
    /// Python of the venv with smg, the second peer.
    pub smg_python: PathBuf,
    /// Logs and rendered configs.
    pub run_dir: PathBuf,
}

/// A free loopback port, below the kernel's ephemeral range where the
/// connections of a run take theirs (`sglang-envoy-ports`).
pub fn free_port() -> anyhow::Result<u16> {
    match sglang_envoy_ports::free_port() {
        0 => anyhow::bail!("no free loopback port"),
        port => Ok(port),
    }
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`, 100 on Linux).
fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// A child process, killed on drop.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `bin args`, output to `dir/name.log`.
    pub fn spawn(name: &str, bin: &Path, args: &[String], dir: &Path) -> anyhow::Result<Proc> {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            log,
        })
    }

    /// CPU time (user + system, all threads) the process has used, in
    /// seconds, from `/proc/PID/stat`.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
        // Fields after the command name, which is in parentheses and may
        // hold spaces: state is field 3, utime 14 and stime 15.
        let rest = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        Some(ticks as f64 / clock_ticks_per_second())
    }

    /// Fails when the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); log {}:\n{}",
                self.name,
                self.log.display(),
                self.tail()
            );
        }
        Ok(())
    }

    /// The last lines of its log.
    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `url` until it answers 2xx, or fail after `timeout`; fails early when
/// one of `procs` dies.
pub async fn wait_ok(url: &str, timeout: Duration, procs: &mut [&mut Proc]) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(r) = client.get(url).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        for p in procs.iter_mut() {
            p.check_alive()?;
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = procs
                .iter()
                .map(|p| format!("--- {}:\n{}", p.name, p.tail()))
                .collect();
            bail!("timed out waiting for {url}\n{}", logs.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// GET `url` as JSON.
pub async fn get_json(url: &str) -> anyhow::Result<Value> {
    let client = reqwest::Client::builder().no_proxy().build()?;
    let r = client.get(url).send().await?.error_for_status()?;
    Ok(r.json().await?)
}

/// Simulated SGLang workers.
pub struct Sims {
    /// `http://127.0.0.1:port` of each.
    pub urls: Vec<String>,
    procs: Vec<Proc>,
}

impl Sims {
    /// Starts `n` workers (`bin args --port P`) and waits for their `/health`.
    pub async fn start(
        paths: &Paths,
        bin: &Path,
        n: usize,
        args: &[String],
        tag: &str,
    ) -> anyhow::Result<Sims> {
        Sims::start_each(paths, bin, &vec![args.to_vec(); n], tag).await
    }

    /// Starts one worker per entry of `args`, each with its own flags.
    pub async fn start_each(
        paths: &Paths,
        bin: &Path,
        args: &[Vec<String>],
        tag: &str,
    ) -> anyhow::Result<Sims> {
        let mut urls = Vec::new();
        let mut procs = Vec::new();
        for (i, args) in args.iter().enumerate() {
            let port = free_port()?;
            let mut all = vec!["--port".to_string(), port.to_string()];
            all.extend_from_slice(args);
            let mut p = Proc::spawn(&format!("{tag}-worker-{i}"), bin, &all, &paths.run_dir)?;
            let url = format!("http://127.0.0.1:{port}");
            wait_ok(
                &format!("{url}/health"),
                Duration::from_secs(20),
                &mut [&mut p],
            )
            .await?;
            urls.push(url);
            procs.push(p);
        }
        Ok(Sims { urls, procs })
    }

    /// Each worker's `/_sim/stats`.
    pub async fn stats(&self) -> anyhow::Result<Vec<Value>> {
        let mut out = Vec::new();
        for u in &self.urls {
            out.push(get_json(&format!("{u}/_sim/stats")).await?);
        }
        Ok(out)
    }

    /// Fails when a worker has died.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        self.procs.iter_mut().try_for_each(Proc::check_alive)
    }
}

/// A running contender: where clients send requests.
pub struct Running {
    /// `http://127.0.0.1:port` clients use.
    pub base: String,
    procs: Vec<Proc>,
}

impl Running {
    /// CPU time (user + system) its processes have used so far, in
    /// seconds: the router's own cost (Envoy and the control plane for this
    /// project, the router process for the peer); `None` for `direct`,
    /// which is no router, or when `/proc` cannot be read.
    pub fn cpu_seconds(&self) -> Option<f64> {
        if self.procs.is_empty() {
            return None;
        }
        self.procs.iter().map(Proc::cpu_seconds).sum()
    }

    /// Fails when one of its processes has died.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        self.procs.iter_mut().try_for_each(Proc::check_alive)
    }
}

/// The workers a router is put in front of.
#[derive(Debug, Clone)]
pub enum Fleet {
    /// Regular workers (`--worker-urls`).
    Regular(Vec<String>),
    /// Prefill/decode disaggregation: prefill workers with their bootstrap
    /// ports, and decode workers.
    Pd {
        /// `(url, bootstrap port)` of each prefill worker.
        prefills: Vec<(String, u16)>,
        /// Decode worker URLs.
        decodes: Vec<String>,
    },
}

impl Fleet {
    /// The routers' flags naming the workers: the same spelling for this
    /// project's control plane and the peer (`--worker-urls URL...`, or
    /// `--pd-disaggregation --prefill URL PORT ... --decode URL ...`).
    pub fn router_args(&self) -> Vec<String> {
        match self {
            Fleet::Regular(urls) => {
                let mut a = vec!["--worker-urls".to_string()];
                a.extend(urls.iter().cloned());
                a
            }
            Fleet::Pd { prefills, decodes } => {
                let mut a = vec!["--pd-disaggregation".to_string()];
                for (url, port) in prefills {
                    a.extend(["--prefill".into(), url.clone(), port.to_string()]);
                }
                for url in decodes {
                    a.extend(["--decode".into(), url.clone()]);
                }
                a
            }
        }
    }
}

/// Starts `contender` in front of `workers` and waits until a request
/// through it reaches a worker. `Direct` is the first worker itself.
pub async fn start(
    paths: &Paths,
    contender: Contender,
    workers: &[String],
    tag: &str,
) -> anyhow::Result<Running> {
    start_in_front(paths, contender, &Fleet::Regular(workers.to_vec()), tag).await
}

/// [`start`] in front of any [`Fleet`]; `Direct` needs regular workers.
pub async fn start_in_front(
    paths: &Paths,
    contender: Contender,
    fleet: &Fleet,
    tag: &str,
) -> anyhow::Result<Running> {
    start_with(paths, contender, fleet, &[], tag).await
}

/// [`start_in_front`] with `extra` flags for the router (the same spelling
/// for both routers, e.g. `--dp-aware`).
pub async fn start_with(
    paths: &Paths,
    contender: Contender,
    fleet: &Fleet,
    extra: &[String],
    tag: &str,
) -> anyhow::Result<Running> {
    let fleet_args = || {
        let mut a = fleet.router_args();
        a.extend_from_slice(extra);
        a
    };
    match contender {
        Contender::Direct => match fleet {
            Fleet::Regular(workers) => Ok(Running {
                base: workers.first().cloned().context("no worker")?,
                procs: Vec::new(),
            }),
            Fleet::Pd { .. } => bail!("`direct` has no meaning in front of a PD fleet"),
        },
        Contender::Peer(peer, policy) => start_peer(paths, peer, policy, &fleet_args(), tag).await,
        Contender::EnvoyAlone => {
            let tag = format!("{tag}-alone");
            start_ours(paths, ENVOY_ALONE, "round_robin", &fleet_args(), &tag).await
        }
        Contender::Ours(policy) => {
            start_ours(paths, "envoy/envoy.yaml", policy, &fleet_args(), tag).await
        }
        Contender::OursExtProc(policy) => {
            let tag = format!("{tag}-extproc");
            start_ours(
                paths,
                "envoy/envoy-ext-proc.yaml",
                policy,
                &fleet_args(),
                &tag,
            )
            .await
        }
    }
}

/// One prefill and one decode simulated worker, the prefill serving its
/// KV on a bootstrap port (which is also the decode's default).
pub struct PdSims {
    /// The fleet, for [`start_in_front`].
    pub fleet: Fleet,
    prefill: Sims,
    decode: Sims,
}

impl PdSims {
    /// Starts `paths.sim` twice with `args` and the role flags.
    pub async fn start(paths: &Paths, args: &[String], tag: &str) -> anyhow::Result<PdSims> {
        let bootstrap = free_port()?;
        let role = |mode: &str| {
            let mut a = args.to_vec();
            a.extend([
                "--disaggregation-mode".to_string(),
                mode.to_string(),
                "--disaggregation-bootstrap-port".into(),
                bootstrap.to_string(),
            ]);
            a
        };
        let prefill = Sims::start(
            paths,
            &paths.sim,
            1,
            &role("prefill"),
            &format!("{tag}-prefill"),
        )
        .await?;
        let decode = Sims::start(
            paths,
            &paths.sim,
            1,
            &role("decode"),
            &format!("{tag}-decode"),
        )
        .await?;
        Ok(PdSims {
            fleet: Fleet::Pd {
                prefills: vec![(prefill.urls[0].clone(), bootstrap)],
                decodes: decode.urls.clone(),
            },
            prefill,
            decode,
        })
    }

    /// Each worker's `/_sim/stats`: prefill first.
    pub async fn stats(&self) -> anyhow::Result<Vec<Value>> {
        let mut out = self.prefill.stats().await?;
        out.extend(self.decode.stats().await?);
        Ok(out)
    }

    /// Fails when a worker has died.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        self.prefill.check_alive()?;
        self.decode.check_alive()
    }
}

/// Stands for `envoy/envoy.yaml` with the wasm filter cut out (and its
/// admin routes, which name the filter, dropped by render.sh).
const ENVOY_ALONE: &str = "envoy alone";

/// `template` without its wasm filter.
fn without_filter(template: &str) -> anyhow::Result<String> {
    let (from, to) = (
        "          - name: sglang.router",
        "          - name: envoy.filters.http.router",
    );
    let a = template
        .find(from)
        .context("envoy.yaml changed: no filter to cut")?;
    let b = a + template[a..]
        .find(to)
        .context("envoy.yaml changed: no end of the cut")?;
    Ok(format!("{}{}", &template[..a], &template[b..]))
}

async fn start_peer(
    paths: &Paths,
    peer: Peer,
    policy: &str,
    fleet_args: &[String],
    tag: &str,
) -> anyhow::Result<Running> {
    let (port, metrics) = (free_port()?, free_port()?);
    // Both take sglang-router's flags; smg's own are under `launch`.
    let (python, launch): (&PathBuf, &[&str]) = match peer {
        Peer::SglangRouter => (&paths.peer_python, &["-m", "sglang_router.launch_router"]),
        Peer::Smg => (&paths.smg_python, &["-m", "smg", "launch"]),
    };
    let mut args: Vec<String> = launch
        .iter()
        .chain(&["--host", "127.0.0.1", "--port"])
        .map(|s| s.to_string())
        .collect();
    args.push(port.to_string());
    args.push("--policy".into());
    args.push(policy.into());
    args.extend(
        [
            "--prometheus-host",
            "127.0.0.1",
            "--log-level",
            "warn",
            "--worker-startup-check-interval",
            "1",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args.push("--prometheus-port".into());
    args.push(metrics.to_string());
    args.extend_from_slice(fleet_args);
    let mut p = Proc::spawn(
        &format!("{tag}-{}-{policy}", peer.name()),
        python,
        &args,
        &paths.run_dir,
    )?;
    let base = format!("http://127.0.0.1:{port}");
    wait_ok(
        &format!("{base}/v1/models"),
        Duration::from_secs(90),
        &mut [&mut p],
    )
    .await?;
    Ok(Running {
        base,
        procs: vec![p],
    })
}

/// This project's control plane `name` with `args`, once its admin port
/// `admin` answers `/health`.
pub async fn start_control_plane(
    paths: &Paths,
    name: &str,
    args: &[String],
    admin: u16,
) -> anyhow::Result<Proc> {
    let mut cp = Proc::spawn(name, &paths.control_plane, args, &paths.run_dir)?;
    wait_ok(
        &format!("http://127.0.0.1:{admin}/health"),
        Duration::from_secs(30),
        &mut [&mut cp],
    )
    .await?;
    Ok(cp)
}

async fn start_ours(
    paths: &Paths,
    template_path: &str,
    policy: &str,
    fleet_args: &[String],
    tag: &str,
) -> anyhow::Result<Running> {
    let (admin, grpc) = (free_port()?, free_port()?);
    // A policy may carry its own flags: "cost_aware --cost-queue-weight 1".
    let mut words = policy.split_whitespace();
    let mut args = vec![
        "--admin-port".to_string(),
        admin.to_string(),
        "--grpc-port".into(),
        grpc.to_string(),
        "--policy".into(),
        words.next().unwrap_or(policy).into(),
        "--log-level".into(),
        "warn".into(),
    ];
    args.extend(words.map(str::to_string));
    let policy = policy.split_whitespace().collect::<Vec<_>>().join("_");
    let policy = policy.as_str();
    args.extend_from_slice(fleet_args);
    let mut cp = start_control_plane(paths, &format!("{tag}-cp-{policy}"), &args, admin).await?;

    let (port, envoy_admin) = (free_port()?, free_port()?);
    // Rendered by envoy/render.sh, the one place the placeholders are
    // filled (as scripts/lib.sh render_envoy_config does); "envoy alone"
    // is the shipped template without the wasm filter, its admin routes
    // dropped by render.sh's ADMIN_ROUTES=off.
    let (template, admin_routes) = if template_path == ENVOY_ALONE {
        let path = "envoy/envoy.yaml";
        let full = std::fs::read_to_string(paths.root.join(path))
            .with_context(|| format!("reading {path}"))?;
        let alone = paths
            .run_dir
            .join(format!("{tag}-envoy-alone-template.yaml"));
        std::fs::write(&alone, without_filter(&full)?)?;
        (alone, "off")
    } else {
        (paths.root.join(template_path), "on")
    };
    let config_path = paths.run_dir.join(format!("{tag}-envoy-{policy}.yaml"));
    let ports = envoy::Ports {
        listen: port,
        envoy_admin,
        grpc,
        admin,
    };
    envoy::render(paths, &template, admin_routes, ports, &config_path)?;
    let mut envoy = envoy::spawn(paths, &config_path, 2, &format!("{tag}-envoy-{policy}"))?;
    let base = format!("http://127.0.0.1:{port}");
    wait_ok(
        &format!("{base}/v1/models"),
        Duration::from_secs(60),
        &mut [&mut cp, &mut envoy],
    )
    .await?;
    Ok(Running {
        base,
        procs: vec![envoy, cp],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_of_a_busy_and_an_idle_process() {
        let dir = std::env::temp_dir();
        let spin = ["-c".to_string(), "while :; do :; done".to_string()];
        let busy = Proc::spawn("cpu-busy", Path::new("sh"), &spin, &dir).unwrap();
        let idle = Proc::spawn("cpu-idle", Path::new("sleep"), &["5".into()], &dir).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        let (b, i) = (busy.cpu_seconds().unwrap(), idle.cpu_seconds().unwrap());
        // A shell spinning keeps a core busy; `sleep` uses none.
        assert!(b > 0.05, "busy {b}");
        assert!(i < 0.05, "idle {i}");
    }

    #[test]
    fn router_args_name_the_fleet() {
        let regular = Fleet::Regular(vec!["http://a".into(), "http://b".into()]);
        assert_eq!(
            regular.router_args(),
            ["--worker-urls", "http://a", "http://b"]
        );
        let pd = Fleet::Pd {
            prefills: vec![("http://p".into(), 8998)],
            decodes: vec!["http://d".into()],
        };
        assert_eq!(
            pd.router_args(),
            [
                "--pd-disaggregation",
                "--prefill",
                "http://p",
                "8998",
                "--decode",
                "http://d"
            ]
        );
    }

    /// The cut follows the shipped config (the bench's own cut of the admin
    /// routes broke once when their end marker changed; render.sh drops
    /// them now).
    #[test]
    fn envoy_alone_is_the_shipped_config_without_the_filter() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../envoy/envoy.yaml");
        let full = std::fs::read_to_string(path).unwrap();
        let alone = without_filter(&full).unwrap();
        assert!(!alone.contains("name: sglang.router"));
        // render.sh drops the admin routes (they name the filter).
        assert!(alone.contains("# BEGIN admin-routes") && alone.contains("# END admin-routes"));
        for kept in ["envoy.filters.http.router", "path: /v1/chat/completions"] {
            assert!(alone.contains(kept), "{kept}");
        }
    }
}
