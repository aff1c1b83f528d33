//! Scenario "replicas" (issue 28, several control planes, all active):
//! this project's `cost_aware` on shapes of scenario 2, behind one Envoy
//! whose `sglang_control_plane` cluster lists 1, 2 or 3 control planes
//! ([`SETUPS`]), the shared ones with a Redis of their own as fleet
//! store. Each run starts fresh workers, a fresh Redis and fresh control
//! planes; at its end every control plane's decision histogram is read
//! from its `/metrics`, so that one sees whether sharing added work on the
//! request path and how the filter VMs' sessions spread.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::envoy;
use crate::loadgen;
use crate::params::{Contender, Profile, QUALITY_OURS, REPLICAS_SEEDS};
use crate::procs::{free_port, start_control_plane, wait_ok, Paths, Proc};
use crate::prom::{self, Histogram};
use crate::quality::{summarise, QualityRow, Workers};
use crate::shapes::{self, Shape};
use crate::workload;

/// One setup of the replicas scenario: how many control planes serve
/// behind the one Envoy, and what they share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaSetup {
    /// Name in tables.
    pub label: &'static str,
    /// Control planes, each with the same worker flags.
    pub replicas: usize,
    /// With `--fleet-store-url` (a Redis of its own per run) and a key
    /// prefix of its own.
    pub fleet_store: bool,
    /// The flag turning one kind of sharing off (`--disable-shared-tree`:
    /// the approximate tree's inserts; `--disable-shared-loads`: the
    /// requests in flight), to show what that sharing buys; `None`: all of
    /// it on.
    pub unshared: Option<&'static str>,
}

/// The setups, in order; the first is the reference of the ratios and
/// goals. A control plane without a setup's `unshared` flag skips it.
pub const SETUPS: &[ReplicaSetup] = &[
    ReplicaSetup {
        label: "1 replica",
        replicas: 1,
        fleet_store: false,
        unshared: None,
    },
    ReplicaSetup {
        label: "1 replica, store",
        replicas: 1,
        fleet_store: true,
        unshared: None,
    },
    ReplicaSetup {
        label: "2 replicas",
        replicas: 2,
        fleet_store: true,
        unshared: None,
    },
    ReplicaSetup {
        label: "3 replicas",
        replicas: 3,
        fleet_store: true,
        unshared: None,
    },
    ReplicaSetup {
        label: "3 replicas, tree not shared",
        replicas: 3,
        fleet_store: true,
        unshared: Some(NO_SHARED_TREE),
    },
    ReplicaSetup {
        label: "3 replicas, loads not shared",
        replicas: 3,
        fleet_store: true,
        unshared: Some(NO_SHARED_LOADS),
    },
];

/// The control plane's histogram of the time it takes to choose a worker.
pub const DECISION_HISTOGRAM: &str = "sgl_router_decision_duration_seconds";
/// The same decisions' CPU time (`--decision-cpu-metric`): their own
/// work, apart from the waits for a core that 3 control planes, Envoy and
/// the workers on 2 cores add to the clock's.
pub const DECISION_CPU_HISTOGRAM: &str = "sgl_router_decision_cpu_seconds";
/// The flag that measures it.
const DECISION_CPU_FLAG: &str = "--decision-cpu-metric";

/// The flag of the setup that does not share the tree.
const NO_SHARED_TREE: &str = "--disable-shared-tree";
/// The flag of the setup that does not share the requests in flight.
const NO_SHARED_LOADS: &str = "--disable-shared-loads";

/// One setup on one shape with one seed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicaRun {
    /// [`ReplicaSetup::label`].
    pub setup: String,
    /// Control planes behind the Envoy.
    pub replicas: usize,
    /// What the clients and the workers saw (its `contender` is `setup`).
    pub row: QualityRow,
    /// The decision histogram of all the control planes together.
    pub decisions: Histogram,
    /// Their CPU time's ([`DECISION_CPU_HISTOGRAM`]); `None` from a
    /// control plane without [`DECISION_CPU_FLAG`].
    #[serde(default)]
    pub cpu: Option<Histogram>,
    /// Decisions each control plane made (its histogram's `_count`), in
    /// the order the cluster lists them.
    pub per_replica: Vec<u64>,
    /// Filter VMs whose session stream each control plane held when the
    /// load started (`sgl_router_filter_sessions`).
    #[serde(default)]
    pub sessions: Vec<u64>,
    /// Envoys started until the sessions were spread evenly.
    #[serde(default)]
    pub envoy_starts: usize,
}

/// Everything the scenario ran, and the setups it could not.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReplicasResults {
    /// Every run, in the order they ran.
    pub runs: Vec<ReplicaRun>,
    /// `(setup, why)` of the setups left out.
    pub skipped: Vec<(String, String)>,
}

/// Whether the control plane at `bin` knows `flag` (its `--help` names it).
fn knows_flag(bin: &Path, flag: &str) -> bool {
    Command::new(bin)
        .arg("--help")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
}

/// A `redis-server` (Debian's; scripts/bench.sh installs it) on a free
/// loopback port, keeping nothing on disk; killed on drop.
struct Redis {
    port: u16,
    _proc: Proc,
}

impl Redis {
    async fn start(paths: &Paths, tag: &str) -> anyhow::Result<Redis> {
        let port = free_port()?;
        let args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .map(String::from)
        .to_vec();
        let mut proc = Proc::spawn(
            &format!("{tag}-redis"),
            Path::new("redis-server"),
            &args,
            &paths.run_dir,
        )?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            proc.check_alive()?;
            if Instant::now() >= deadline {
                bail!("redis-server on port {port} did not answer within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Redis { port, _proc: proc })
    }
}

/// One control plane: its process and ports.
struct ControlPlane {
    proc: Proc,
    admin: u16,
    grpc: u16,
}

/// `cost_aware`, the policy scenario 2's goals are about.
fn policy() -> &'static str {
    match QUALITY_OURS {
        Contender::Ours(p) => p,
        _ => "cost_aware",
    }
}

/// The flags of one control plane of `setup`: the same workers for all,
/// and with a store, its URL and the run's own key prefix.
fn control_plane_args(
    setup: &ReplicaSetup,
    workers: &[String],
    store: Option<(u16, &str)>,
    admin: u16,
    grpc: u16,
) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "--admin-port".into(),
        admin.to_string(),
        "--grpc-port".into(),
        grpc.to_string(),
        "--policy".into(),
        policy().into(),
        "--log-level".into(),
        "warn".into(),
    ];
    a.extend_from_slice(workers);
    if let Some((port, prefix)) = store {
        a.extend([
            "--fleet-store-url".into(),
            format!("redis://127.0.0.1:{port}/0"),
            "--fleet-store-key-prefix".into(),
            prefix.to_string(),
        ]);
    }
    if let Some(flag) = setup.unshared {
        a.push(flag.into());
    }
    a
}

/// Runs every setup on every shape of `profile.replicas` whose name
/// contains one of `only` (all when empty), each with the same seeds, the
/// order of the setups reversed every other run so that none always runs
/// first on a machine whose speed drifts.
pub async fn run(
    paths: &Paths,
    profile: &Profile,
    only: &[String],
) -> anyhow::Result<ReplicasResults> {
    let rp = &profile.replicas;
    let mut results = ReplicasResults::default();
    let mut setups: Vec<ReplicaSetup> = Vec::new();
    for s in SETUPS {
        if let Some(flag) = s.unshared.filter(|f| !knows_flag(&paths.control_plane, f)) {
            let why = format!("this control plane has no {flag}");
            eprintln!("  setup {:?} left out: {why}", s.label);
            results.skipped.push((s.label.to_string(), why));
        } else {
            setups.push(*s);
        }
    }
    let seeds = &REPLICAS_SEEDS[..rp.seeds.clamp(1, REPLICAS_SEEDS.len())];
    let wanted = |s: &Shape| {
        rp.shapes.contains(&s.name)
            && (only.is_empty() || only.iter().any(|o| s.name.contains(o.as_str())))
    };
    let mut k = 0;
    for shape in shapes::matrix(&profile.quality).into_iter().filter(wanted) {
        for (i, &seed) in seeds.iter().enumerate() {
            let schedule = Arc::new(workload::conversation_schedule(&shape.params, seed));
            eprintln!(
                "  shape {:?}, seed {i}: {} requests over {:?}, Envoy --concurrency {}",
                shape.name,
                schedule.len(),
                shape.params.duration,
                rp.envoy_concurrency
            );
            let mut order = setups.clone();
            if k % 2 == 1 {
                order.reverse();
            }
            k += 1;
            for setup in order {
                let r = cell(paths, &shape, seed, &setup, rp.envoy_concurrency, &schedule).await?;
                eprintln!(
                    "    {:<28} TTFT p50 {:>5.0} p95 {:>5.0} ms  hit {:.3}  max/min {:.2}  decision p50 {} p99 {} us (CPU p99 {} us)  per replica {:?} (VMs {:?}, {} Envoy start(s))  failed {}{}",
                    r.setup,
                    r.row.ttft_ms.p50,
                    r.row.ttft_ms.p95,
                    r.row.cache_hit_ratio,
                    r.row.max_min,
                    us(r.decisions.quantile(0.5)),
                    us(r.decisions.quantile(0.99)),
                    us(r.cpu.as_ref().and_then(|h| h.quantile(0.99))),
                    r.per_replica,
                    r.sessions,
                    r.envoy_starts,
                    r.row.failed,
                    r.row.first_failure.as_deref().map_or(String::new(), |f| format!(" ({f})"))
                );
                results.runs.push(r);
            }
        }
    }
    Ok(results)
}

/// The control plane's gauge of the filter VMs with a session to it.
const SESSIONS_GAUGE: &str = "sgl_router_filter_sessions";

/// Envoys started at most per run to get the sessions spread. Each VM's
/// stream goes to the control plane its thread's round robin picks, a
/// random one; 4 VMs over 2 or 3 control planes spread evenly on at least
/// 3 starts in 8, so 12 starts all fail well under once in a hundred.
pub const MAX_ENVOY_STARTS: usize = 12;

/// Whether VM sessions are spread as evenly as they can be: no control
/// plane holds more than one more than another.
fn even(sessions: &[u64]) -> bool {
    let max = sessions.iter().copied().max().unwrap_or(0);
    let min = sessions.iter().copied().min().unwrap_or(0);
    max - min <= 1
}

/// Each control plane's [`SESSIONS_GAUGE`].
async fn sessions(cps: &[ControlPlane]) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::with_capacity(cps.len());
    for c in cps {
        let page = get_text(&format!("http://127.0.0.1:{}/metrics", c.admin)).await?;
        out.push(prom::value(&page, SESSIONS_GAUGE).unwrap_or(0.0).max(0.0) as u64);
    }
    Ok(out)
}

/// The sessions of all `vms` filter VMs of the Envoy on `listen`, per
/// control plane, or what there is after 20 s. A VM opens its session
/// when it serves its first request, so requests that make no decision
/// (`GET /v1/models`) go in on new connections, which the kernel spreads
/// over Envoy's worker threads, until every VM has served one.
async fn open_sessions(cps: &[ControlPlane], vms: usize, listen: u16) -> anyhow::Result<Vec<u64>> {
    // No idle connection is kept: each request opens its own.
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()?;
    let models = format!("http://127.0.0.1:{listen}/v1/models");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = sessions(cps).await?;
        if now.iter().sum::<u64>() >= vms as u64 || Instant::now() >= deadline {
            return Ok(now);
        }
        for _ in 0..8 {
            let _ = fresh.get(&models).send().await;
        }
        // A VM opens its stream on its next tick (20 ms).
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts Envoy on `config` until its `vms` filter VMs hold their sessions
/// [`even`]ly over `cps` (at most [`MAX_ENVOY_STARTS`] times; then it
/// keeps the last, and the table shows the spread). With 4 VMs and 3
/// control planes one VM's choice decides whether a replica serves at all;
/// an uneven start would measure fewer replicas than the row names.
/// Returns the Envoy, the sessions per control plane and the starts.
async fn start_envoy(
    paths: &Paths,
    config: &Path,
    vms: usize,
    listen: u16,
    cps: &mut [ControlPlane],
) -> anyhow::Result<(Proc, Vec<u64>, usize)> {
    let mut starts = 0;
    loop {
        starts += 1;
        let mut envoy = envoy::spawn(paths, config, vms, "replicas-envoy")?;
        {
            let mut procs: Vec<&mut Proc> = cps.iter_mut().map(|c| &mut c.proc).collect();
            procs.push(&mut envoy);
            let models = format!("http://127.0.0.1:{listen}/v1/models");
            wait_ok(&models, Duration::from_secs(60), &mut procs).await?;
        }
        let spread = open_sessions(cps, vms, listen).await?;
        if spread.iter().sum::<u64>() != vms as u64 {
            eprintln!("    {vms} filter VMs expected, sessions {spread:?}");
        }
        if even(&spread) || starts >= MAX_ENVOY_STARTS {
            if !even(&spread) {
                eprintln!("    sessions still uneven after {starts} Envoys: {spread:?}");
            }
            return Ok((envoy, spread, starts));
        }
        drop(envoy);
        // The next count must not see the last Envoy's sessions.
        let deadline = Instant::now() + Duration::from_secs(5);
        while sessions(cps).await?.iter().sum::<u64>() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Seconds as microseconds with one decimal, or `-` without a value.
pub fn us(seconds: Option<f64>) -> String {
    seconds.map_or("-".into(), |s| format!("{:.1}", s * 1e6))
}

/// GET `url` as text.
async fn get_text(url: &str) -> anyhow::Result<String> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()?;
    Ok(client
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?)
}

/// A key prefix no other run of this process or another shares, so that
/// nothing of an earlier run (even one against the same Redis) is read.
fn key_prefix() -> String {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    format!(
        "bench-replicas-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    )
}

async fn cell(
    paths: &Paths,
    shape: &Shape,
    seed: u64,
    setup: &ReplicaSetup,
    concurrency: usize,
    schedule: &Arc<Vec<workload::Scheduled>>,
) -> anyhow::Result<ReplicaRun> {
    let p = &shape.params;
    let tag = "replicas";
    let mut workers = Workers::start(paths, p, tag).await?;
    let redis = match setup.fleet_store {
        true => Some(Redis::start(paths, tag).await?),
        false => None,
    };
    let prefix = key_prefix();
    let store = redis.as_ref().map(|r| (r.port, prefix.as_str()));
    let fleet = workers.fleet.router_args();
    let mut cps: Vec<ControlPlane> = Vec::with_capacity(setup.replicas);
    for i in 0..setup.replicas {
        let (admin, grpc) = (free_port()?, free_port()?);
        let mut args = control_plane_args(setup, &fleet, store, admin, grpc);
        if knows_flag(&paths.control_plane, DECISION_CPU_FLAG) {
            args.push(DECISION_CPU_FLAG.into());
        }
        let proc = start_control_plane(paths, &format!("{tag}-cp-{i}"), &args, admin).await?;
        cps.push(ControlPlane { proc, admin, grpc });
    }

    // The shipped template, every control plane an endpoint of its
    // cluster; admin routes off (only inference goes through this Envoy).
    let (listen, envoy_admin) = (free_port()?, free_port()?);
    let config = paths.run_dir.join(format!("{tag}-envoy.yaml"));
    let ports = envoy::Ports {
        listen,
        envoy_admin,
        grpc: cps[0].grpc,
        admin: cps[0].admin,
    };
    envoy::render(
        paths,
        &paths.root.join("envoy/envoy.yaml"),
        "off",
        ports,
        &config,
    )?;
    let rendered = std::fs::read_to_string(&config)?;
    let grpc_ports: Vec<u16> = cps.iter().map(|c| c.grpc).collect();
    std::fs::write(&config, envoy::with_control_planes(&rendered, &grpc_ports)?)?;
    let (mut envoy, sessions, envoy_starts) =
        start_envoy(paths, &config, concurrency, listen, &mut cps).await?;
    let base = format!("http://127.0.0.1:{listen}");

    let url = format!("{base}/v1/chat/completions");
    let (outcomes, _) = loadgen::open_loop(&url, Arc::clone(schedule), p.drain).await?;
    envoy.check_alive()?;
    for c in &mut cps {
        c.proc.check_alive()?;
    }
    workers.prefill.check_alive()?;
    let stats = workers.prefill.stats().await?;
    let mut row = summarise(shape, seed, QUALITY_OURS, &outcomes, &stats);
    row.contender = setup.label.to_string();

    let mut histograms = Vec::with_capacity(cps.len());
    let mut cpu = Vec::with_capacity(cps.len());
    for c in &cps {
        let page = get_text(&format!("http://127.0.0.1:{}/metrics", c.admin)).await?;
        histograms.push(
            Histogram::parse(&page, DECISION_HISTOGRAM)
                .with_context(|| format!("no {DECISION_HISTOGRAM} on control plane {}", c.admin))?,
        );
        cpu.push(Histogram::parse(&page, DECISION_CPU_HISTOGRAM));
    }
    drop(envoy);
    drop(cps);
    drop(redis);
    drop(workers);
    // Let sockets and processes go before the next run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(ReplicaRun {
        setup: setup.label.to_string(),
        replicas: setup.replicas,
        row,
        per_replica: histograms.iter().map(|h| h.count as u64).collect(),
        sessions,
        envoy_starts,
        decisions: Histogram::merge(&histograms),
        cpu: cpu
            .iter()
            .all(Option::is_some)
            .then(|| Histogram::merge(cpu.iter().flatten())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_replica_gets_the_same_workers_and_its_own_ports() {
        let workers = [
            "--worker-urls".to_string(),
            "http://w1".into(),
            "http://w2".into(),
        ];
        let shared = SETUPS[2];
        let a = control_plane_args(&shared, &workers, Some((6380, "p")), 1, 2);
        let b = control_plane_args(&shared, &workers, Some((6380, "p")), 3, 4);
        let tail = |v: &[String]| v[8..].to_vec();
        assert_eq!(tail(&a), tail(&b));
        let joined = a.join(" ");
        assert!(
            joined.contains("--worker-urls http://w1 http://w2"),
            "{joined}"
        );
        assert!(joined
            .contains("--fleet-store-url redis://127.0.0.1:6380/0 --fleet-store-key-prefix p"));
        assert!(joined.contains("--admin-port 1 --grpc-port 2"));
        assert!(!joined.contains(NO_SHARED_TREE));
        let one = control_plane_args(&SETUPS[0], &workers, None, 1, 2).join(" ");
        assert!(!one.contains("--fleet-store"), "{one}");
        let unshared = SETUPS
            .iter()
            .find(|s| s.unshared == Some(NO_SHARED_TREE))
            .unwrap();
        assert!(control_plane_args(unshared, &workers, Some((1, "q")), 1, 2)
            .contains(&NO_SHARED_TREE.to_string()));
    }

    #[test]
    fn sessions_are_even_when_no_replica_holds_two_more() {
        assert!(even(&[2, 1, 1]));
        assert!(even(&[2, 2]));
        assert!(even(&[4]));
        assert!(!even(&[3, 1]));
        assert!(!even(&[2, 2, 0]));
        assert!(!even(&[0, 4, 0]));
    }

    #[test]
    fn setups_start_from_one_plain_replica() {
        let first = SETUPS[0];
        assert_eq!((first.replicas, first.fleet_store), (1, false));
        assert!(SETUPS[1..].iter().all(|s| s.fleet_store));
        assert_ne!(key_prefix(), key_prefix());
    }
}
