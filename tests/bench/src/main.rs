//! `sglang-envoy-bench`: runs scenarios 1 (overhead: whole answers, SSE
//! streams, PD mode) and 2 (routing quality) against every contender, reads scenario 3's results (written by
//! `bench-engine` and the criterion benches), runs the replicas scenario
//! (several control planes) when asked, prints one report with ratios
//! and goals, and writes it to a file. `scripts/bench.sh` is the way to
//! call it: it installs, builds and runs the engine benches first.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use sglang_envoy_bench::params::{
    Profile, OVERHEAD, PD, PEER_PACKAGE, QUALITY, QUALITY_CANDIDATES, SMG_PACKAGE,
};
use sglang_envoy_bench::procs::Paths;
use sglang_envoy_bench::report::{self, Inputs, RunInfo};
use sglang_envoy_bench::results::{read_criterion, EngineResults};
use sglang_envoy_bench::{quality, replicas, scenarios};

/// A scenario of the issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// 1: router overhead in front of an instant worker (whole answers
    /// and SSE streams), and in PD mode in front of simulated workers.
    Overhead,
    /// 2: routing quality on a multi-turn chat workload.
    Quality,
    /// 3: the decision engine (results read from files).
    Engine,
    /// Several control planes behind one Envoy (issue 28); not in the
    /// default list: it takes about 35 minutes and answers another
    /// question than the comparison with the peers.
    Replicas,
}

/// Benchmarks sglang-envoy against sglang-router.
#[derive(Debug, Parser)]
#[command(name = "sglang-envoy-bench")]
struct Cli {
    /// Short smoke run (numbers not meant to be quoted).
    #[arg(long)]
    quick: bool,
    /// Scenarios to run (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "overhead,quality,engine"
    )]
    scenarios: Vec<Scenario>,
    /// Only contenders whose label contains one of these (comma-separated),
    /// e.g. `cache_aware` or `ours`, or is exactly one written after `=`
    /// (`=ours cost_aware`: the shipped policy without the tuning
    /// candidates whose labels start the same); `direct` always runs in
    /// scenario 1.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Repository root.
    #[arg(long)]
    root: Option<PathBuf>,
    /// Cargo target directory (default ROOT/target).
    #[arg(long)]
    target_dir: Option<PathBuf>,
    /// The Envoy binary (default ROOT/.venv/bin/envoy).
    #[arg(long)]
    envoy: Option<PathBuf>,
    /// Python of the venv with sglang-router (default ROOT/.venv-bench/bin/python).
    #[arg(long)]
    peer_python: Option<PathBuf>,
    /// Python of the venv with smg (default ROOT/.venv-smg/bin/python).
    #[arg(long)]
    smg_python: Option<PathBuf>,
    /// Logs, configs and raw results (default ROOT/.run/bench).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// `bench-engine` results (default RUN_DIR/engine.json).
    #[arg(long)]
    engine_json: Option<PathBuf>,
    /// Write the report here too (e.g. docs/benchmarks.md).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Scenario 2: only the shapes whose name contains one of these.
    #[arg(long, value_delimiter = ',')]
    shapes: Vec<String>,
    /// Replace scenario 2 and its goals (when scenario 2 ran) and the
    /// replicas section (when it ran; appended if absent) in this report,
    /// written by an earlier full run, keeping everything else.
    #[arg(long)]
    update: Option<PathBuf>,
    /// Scenario 2: run each cell with only the first N in-sample seeds
    /// (default: all of them), to fit a matrix into a shorter run.
    #[arg(long)]
    seeds: Option<usize>,
    /// Scenario 2: run only the first N held-out seeds (default: all).
    #[arg(long)]
    held_out_seeds: Option<usize>,
}

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(cmd).args(args).output().ok()?;
    if !o.status.success() {
        return None;
    }
    let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn memory() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            let kb: f64 = t
                .lines()
                .find(|l| l.starts_with("MemTotal"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(format!("{:.1} GiB", kb / 1024.0 / 1024.0))
        })
        .unwrap_or_else(|| "unknown".into())
}

fn run_info(cli: &Cli, paths: &Paths) -> RunInfo {
    let unknown = || "unknown".to_string();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    // "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
    let envoy = output(&paths.envoy.display().to_string(), &["--version"])
        .and_then(|v| {
            let after = v
                .split("version:")
                .nth(1)?
                .split_whitespace()
                .next()?
                .to_string();
            after.split('/').nth(1).map(str::to_string)
        })
        .unwrap_or_else(unknown);
    let peer = output(
        &paths.peer_python.display().to_string(),
        &[
            "-c",
            "import importlib.metadata as m; print(m.version('sglang-router'))",
        ],
    )
    .unwrap_or_else(unknown);
    let smg = output(
        &paths.smg_python.display().to_string(),
        &[
            "-c",
            "import importlib.metadata as m; print(m.version('smg'))",
        ],
    )
    .unwrap_or_else(unknown);
    let root = paths.root.display().to_string();
    let commit =
        output("git", &["-C", &root, "rev-parse", "--short", "HEAD"]).unwrap_or_else(unknown);
    let dirty = output(
        "git",
        &["-C", &root, "status", "--porcelain", "--untracked-files=no"],
    )
    .map_or("", |_| " (with uncommitted changes)");
    let mut command = String::from("scripts/bench.sh");
    if cli.quick {
        command.push_str(" --quick");
    }
    if let Some(n) = cli.seeds {
        command.push_str(&format!(" --seeds {n}"));
    }
    if let Some(n) = cli.held_out_seeds {
        command.push_str(&format!(" --held-out-seeds {n}"));
    }
    RunInfo {
        profile: if cli.quick { "quick" } else { "full" }.into(),
        date: output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(unknown),
        machine: vec![
            ("CPU".into(), cpu_model()),
            ("cores (nproc)".into(), cores.to_string()),
            ("memory".into(), memory()),
            (
                "kernel".into(),
                output("uname", &["-sr"]).unwrap_or_else(unknown),
            ),
        ],
        versions: vec![
            ("this project".into(), format!("{commit}{dirty}")),
            (
                "rustc".into(),
                output("rustc", &["--version"]).unwrap_or_else(unknown),
            ),
            ("envoy".into(), envoy),
            (
                "peer".into(),
                format!("sglang-router {peer} (pinned {PEER_PACKAGE})"),
            ),
            (
                "second peer".into(),
                format!("smg {smg} (pinned {SMG_PACKAGE})"),
            ),
        ],
        command,
    }
}

fn paths(cli: &Cli) -> anyhow::Result<Paths> {
    let root = match &cli.root {
        Some(r) => r.clone(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
    };
    let root = root.canonicalize().context("repository root")?;
    let target = cli
        .target_dir
        .clone()
        .unwrap_or_else(|| root.join("target"));
    let run_dir = cli
        .run_dir
        .clone()
        .unwrap_or_else(|| root.join(".run/bench"));
    std::fs::create_dir_all(&run_dir)?;
    Ok(Paths {
        sim: target.join("release/sglang-sim-worker"),
        instant_worker: target.join("release/bench-instant-worker"),
        control_plane: target.join("release/sglang-envoy-control-plane"),
        wasm: target.join("wasm32-wasip1/release/sglang_envoy_filter.wasm"),
        envoy: cli
            .envoy
            .clone()
            .unwrap_or_else(|| root.join(".venv/bin/envoy")),
        peer_python: cli
            .peer_python
            .clone()
            .unwrap_or_else(|| root.join(".venv-bench/bin/python")),
        smg_python: cli
            .smg_python
            .clone()
            .unwrap_or_else(|| root.join(".venv-smg/bin/python")),
        run_dir,
        root,
    })
}

fn save<T: serde::Serialize>(dir: &Path, name: &str, v: &T) -> anyhow::Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(v)?)
        .with_context(|| format!("writing {}", path.display()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let paths = paths(&cli)?;
    let mut profile = Profile::select(cli.quick);
    if let Some(n) = cli.seeds {
        profile.quality.seeds = n.clamp(1, profile.quality.seeds.max(1));
        profile.replicas.seeds = n.clamp(1, profile.replicas.seeds.max(1));
    }
    if let Some(n) = cli.held_out_seeds {
        profile.quality.held_out_seeds = n.min(profile.quality.held_out_seeds);
    }
    let keep = |c: &&sglang_envoy_bench::params::Contender| {
        cli.only.is_empty()
            || **c == sglang_envoy_bench::params::Contender::Direct
            || **c == sglang_envoy_bench::params::Contender::EnvoyAlone
            || cli.only.iter().any(|o| match o.strip_prefix('=') {
                Some(exact) => c.label() == exact,
                None => c.label().contains(o.as_str()),
            })
    };
    let mut inputs = Inputs::default();

    if cli.scenarios.contains(&Scenario::Overhead) {
        eprintln!("==> scenario 1: overhead");
        let contenders: Vec<_> = OVERHEAD.iter().filter(keep).copied().collect();
        let pd: Vec<_> = PD.iter().filter(keep).copied().collect();
        let results = scenarios::overhead(&paths, &profile.overhead, &contenders, &pd).await?;
        save(&paths.run_dir, "overhead.json", &results)?;
        inputs.overhead = Some(results.cells);
        inputs.streaming = Some(results.streaming);
        inputs.pd = Some(results.pd);
    }
    if cli.scenarios.contains(&Scenario::Quality) {
        eprintln!("==> scenario 2: routing quality");
        // Tuning candidates run only when `--only` names them.
        let candidates = QUALITY_CANDIDATES.iter().filter(|_| !cli.only.is_empty());
        let contenders: Vec<_> = QUALITY
            .iter()
            .chain(candidates)
            .filter(keep)
            .copied()
            .collect();
        let rows = quality::matrix(&paths, &profile.quality, &contenders, &cli.shapes).await?;
        save(&paths.run_dir, "quality.json", &rows)?;
        inputs.quality = Some(rows);
    }
    if cli.scenarios.contains(&Scenario::Engine) {
        let path = cli
            .engine_json
            .clone()
            .unwrap_or_else(|| paths.run_dir.join("engine.json"));
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let e: EngineResults = serde_json::from_str(&text)
                    .with_context(|| format!("reading {}", path.display()))?;
                inputs.engine = Some(e);
            }
            Err(_) => eprintln!(
                "no {} (run bench-engine first); scenario 3 left out",
                path.display()
            ),
        }
        let target = cli
            .target_dir
            .clone()
            .unwrap_or_else(|| paths.root.join("target"));
        inputs.criterion = read_criterion(&target.join("criterion"));
    }

    if cli.scenarios.contains(&Scenario::Replicas) {
        eprintln!("==> replicas: several control planes behind one Envoy");
        let results = replicas::run(&paths, &profile, &cli.shapes).await?;
        save(&paths.run_dir, "replicas.json", &results)?;
        inputs.replicas = Some(results);
    }

    let info = run_info(&cli, &paths);
    let doc = report::render(&info, &inputs, &profile);
    println!("{doc}");
    if let Some(path) = &cli.update {
        let mut text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        if inputs.quality.is_none() && inputs.replicas.is_none() {
            anyhow::bail!("--update needs scenario 2 or the replicas scenario");
        }
        if inputs.quality.is_some() {
            text = report::splice_quality(&text, &info, &inputs, &profile)?;
            eprintln!("updated scenario 2 in {}", path.display());
        }
        if let Some(section) = report::replicas::section(&doc) {
            text = report::replicas::splice(&text, section);
            eprintln!("updated the replicas section in {}", path.display());
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(out) = &cli.out {
        let docs = paths.root.join("docs/benchmarks.md");
        let mut doc = doc;
        // A full run rewrites docs/benchmarks.md but does not run the
        // replicas scenario: keep the section an earlier run put there.
        let same = matches!((out.canonicalize(), docs.canonicalize()), (Ok(a), Ok(b)) if a == b);
        if same && report::replicas::section(&doc).is_none() {
            let old = std::fs::read_to_string(&docs).unwrap_or_default();
            if let Some(section) = report::replicas::section(&old) {
                doc = report::replicas::splice(&doc, section);
            }
        }
        std::fs::write(out, &doc).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}
