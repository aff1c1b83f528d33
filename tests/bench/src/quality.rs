//! Scenario 2, routing quality: every contender on every workload shape of
//! [`crate::shapes::matrix`] with every in-sample seed, then some of them
//! ([`held_out_contenders`]) with the held-out seeds, each run on freshly
//! started simulated workers (empty caches, zeroed counters).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::loadgen::{self, StreamOutcome};
use crate::params::{
    Contender, QualityParams, QUALITY_HELD_OUT_SEEDS, QUALITY_OURS, QUALITY_SEEDS,
};
use crate::procs::{self, free_port, Fleet, Paths, Sims};
use crate::shapes::{self, Shape};
use crate::stats::Percentiles;
use crate::workload;

/// The result of one contender on one shape with one seed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QualityRow {
    /// Shape name ([`Shape::name`]).
    pub shape: String,
    /// Seed of the workload.
    pub seed: u64,
    /// Whether `seed` is one of [`QUALITY_HELD_OUT_SEEDS`] (never used
    /// while tuning) rather than of [`QUALITY_SEEDS`].
    #[serde(default)]
    pub held_out: bool,
    /// Contender label.
    pub contender: String,
    /// Requests sent.
    pub requests: usize,
    /// Requests that streamed to `[DONE]` with a 2xx and no error event.
    pub completed: usize,
    /// Requests that did not ([`StreamOutcome::failure`]).
    pub failed: usize,
    /// One failure reason, for the log and the report.
    pub first_failure: Option<String>,
    /// Time to first content chunk, ms (failed and cut requests count with
    /// their wait).
    pub ttft_ms: Percentiles,
    /// Time to the end of the stream, ms, of completed requests.
    pub e2e_ms: Percentiles,
    /// Cached / prompt tokens over the workers that prefill (their
    /// `/_sim/stats`).
    pub cache_hit_ratio: f64,
    /// Inference requests each prefilling worker served.
    pub per_worker: Vec<u64>,
    /// Largest over smallest of `per_worker` (infinite when one got none).
    pub max_min: f64,
    /// Offered prefill load: uncached tokens x prefill time / (prefilling
    /// workers x DP ranks x prefills at once x arrival period), the slow
    /// worker counted as one. Above 1 the workers cannot keep up.
    pub busy: f64,
}

/// The fleet of one run: the workers and how routers name them (the
/// replicas scenario starts its fleets with it too).
pub(crate) struct Workers {
    pub(crate) fleet: Fleet,
    /// Workers that prefill (all, or the prefill half in PD mode): the
    /// hit ratio and the balance are read from them.
    pub(crate) prefill: Sims,
    /// PD mode's decode workers.
    _decode: Option<Sims>,
}

impl Workers {
    pub(crate) async fn start(
        paths: &Paths,
        p: &QualityParams,
        tag: &str,
    ) -> anyhow::Result<Workers> {
        match p.pd {
            None => {
                let args: Vec<Vec<String>> = (0..p.workers).map(|i| p.sim_args(i)).collect();
                let prefill = Sims::start_each(paths, &paths.sim, &args, tag).await?;
                Ok(Workers {
                    fleet: Fleet::Regular(prefill.urls.clone()),
                    prefill,
                    _decode: None,
                })
            }
            Some((n_prefill, n_decode)) => {
                let ports: Vec<u16> = (0..n_prefill)
                    .map(|_| free_port())
                    .collect::<anyhow::Result<_>>()?;
                let role = |i: usize, mode: &str, port: u16| {
                    let mut a = p.sim_args(i);
                    a.extend([
                        "--disaggregation-mode".to_string(),
                        mode.to_string(),
                        "--disaggregation-bootstrap-port".into(),
                        port.to_string(),
                    ]);
                    a
                };
                let prefill_args: Vec<Vec<String>> = ports
                    .iter()
                    .enumerate()
                    .map(|(i, &port)| role(i, "prefill", port))
                    .collect();
                // A decode's own bootstrap port is only its default for
                // requests that name none; the routers always name one.
                let decode_args: Vec<Vec<String>> = (0..n_decode)
                    .map(|i| role(n_prefill + i, "decode", ports[0]))
                    .collect();
                let prefill =
                    Sims::start_each(paths, &paths.sim, &prefill_args, &format!("{tag}-prefill"))
                        .await?;
                let decode =
                    Sims::start_each(paths, &paths.sim, &decode_args, &format!("{tag}-decode"))
                        .await?;
                Ok(Workers {
                    fleet: Fleet::Pd {
                        prefills: prefill.urls.iter().cloned().zip(ports).collect(),
                        decodes: decode.urls.clone(),
                    },
                    prefill,
                    _decode: Some(decode),
                })
            }
        }
    }
}

/// Router flags a shape needs on top of the fleet, the same for both
/// routers.
fn router_args(p: &QualityParams, c: Contender) -> Vec<String> {
    let mut a = Vec::new();
    let ours = matches!(c, Contender::Ours(_) | Contender::OursExtProc(_));
    if p.kv_events && ours {
        a.extend([
            "--tokenizer-path".to_string(),
            crate::params::kv_model_dir().display().to_string(),
        ]);
    }
    if p.dp_size > 1 {
        a.push("--dp-aware".to_string());
    }
    if p.pd.is_some() {
        let policy = match c {
            Contender::Peer(_, x) | Contender::Ours(x) | Contender::OursExtProc(x) => x,
            Contender::Direct | Contender::EnvoyAlone => "round_robin",
        };
        a.extend([
            "--prefill-policy".to_string(),
            policy
                .split_whitespace()
                .next()
                .unwrap_or(policy)
                .to_string(),
            "--decode-policy".into(),
            "round_robin".into(),
        ]);
    }
    a
}

/// Who of `contenders` runs a shape's held-out seeds, given the shape's
/// in-sample rows: [`QUALITY_OURS`], the peer's `cache_aware` (the
/// reference of its goal's hit ratio and 0.8x rules), the peer's
/// `round_robin`, and each peer policy with the lowest mean TTFT p50 or p95
/// over the in-sample seeds (the best peer policy the goal compares with).
/// Others, tuning candidates among them, do not run them, which keeps the
/// held-out seeds to what the goals read and out of tuning.
pub fn held_out_contenders(contenders: &[Contender], in_sample: &[QualityRow]) -> Vec<Contender> {
    let mean = |c: &Contender, f: fn(&QualityRow) -> f64| {
        let label = c.label();
        let v: Vec<f64> = in_sample
            .iter()
            .filter(|r| !r.held_out && r.contender == label)
            .map(f)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let peers: Vec<&Contender> = contenders
        .iter()
        .filter(|c| matches!(c, Contender::Peer(..)))
        .collect();
    let best = |f: fn(&QualityRow) -> f64| {
        peers
            .iter()
            .filter_map(|c| mean(c, f).map(|m| (m, **c)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, c)| c)
    };
    let best50 = best(|r| r.ttft_ms.p50);
    let best95 = best(|r| r.ttft_ms.p95);
    contenders
        .iter()
        .copied()
        .filter(|&c| {
            c == QUALITY_OURS
                || c == Contender::peer("cache_aware")
                || c == Contender::peer("round_robin")
                || Some(c) == best50
                || Some(c) == best95
        })
        .collect()
}

/// Runs the matrix: for each shape, each in-sample seed with every
/// contender, then each held-out seed with [`held_out_contenders`] (in an
/// order that rotates with the seed, so that none always runs first).
/// With `only` not empty, just the shapes whose name contains one of
/// its entries.
pub async fn matrix(
    paths: &Paths,
    base: &QualityParams,
    contenders: &[Contender],
    only: &[String],
) -> anyhow::Result<Vec<QualityRow>> {
    let contenders: Vec<Contender> = contenders
        .iter()
        .copied()
        .filter(|c| !matches!(c, Contender::Direct | Contender::EnvoyAlone))
        .collect();
    let seeds = &QUALITY_SEEDS[..base.seeds.clamp(1, QUALITY_SEEDS.len())];
    let held_out = &QUALITY_HELD_OUT_SEEDS[..base.held_out_seeds.min(QUALITY_HELD_OUT_SEEDS.len())];
    let mut rows = Vec::new();
    let wanted = |s: &Shape| only.is_empty() || only.iter().any(|o| s.name.contains(o.as_str()));
    for shape in shapes::matrix(base).into_iter().filter(wanted) {
        let first = rows.len();
        let runs = seeds
            .iter()
            .enumerate()
            .map(|(i, &s)| (i, s, false))
            .chain(held_out.iter().enumerate().map(|(i, &s)| (i, s, true)));
        for (k, (i, seed, is_held_out)) in runs.enumerate() {
            let mut order = if is_held_out {
                held_out_contenders(&contenders, &rows[first..])
            } else {
                contenders.clone()
            };
            if order.is_empty() {
                continue;
            }
            let schedule = Arc::new(workload::conversation_schedule(&shape.params, seed));
            eprintln!(
                "  shape {:?}, {} seed {i}: {} requests over {:?}",
                shape.name,
                if is_held_out { "held-out" } else { "in-sample" },
                schedule.len(),
                shape.params.duration
            );
            let n = order.len();
            order.rotate_left(k % n);
            for c in order {
                let row = cell(paths, &shape, seed, is_held_out, c, &schedule).await?;
                eprintln!(
                    "    {:<20} TTFT p50 {:>5.0} p95 {:>5.0} ms  hit {:.3}  max/min {:.2} {:?}  busy {:.0}%  failed {}{}",
                    row.contender,
                    row.ttft_ms.p50,
                    row.ttft_ms.p95,
                    row.cache_hit_ratio,
                    row.max_min,
                    row.per_worker,
                    row.busy * 100.0,
                    row.failed,
                    row.first_failure.as_deref().map_or(String::new(), |f| format!(" ({f})"))
                );
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

async fn cell(
    paths: &Paths,
    shape: &Shape,
    seed: u64,
    held_out: bool,
    c: Contender,
    schedule: &Arc<Vec<workload::Scheduled>>,
) -> anyhow::Result<QualityRow> {
    let p = &shape.params;
    // Each cell's logs (its control plane's, its workers') kept apart from
    // the next seed's and shape's, to be read after the run.
    let tag = format!("quality-{}-{seed}", shape.name.replace(' ', "_"));
    let tag = tag.as_str();
    if p.kv_events {
        sglang_envoy_prompt::fixture::write_model_files(&crate::params::kv_model_dir())?;
    }
    let mut workers = Workers::start(paths, p, tag).await?;
    let n = p.routers.max(1);
    let mut routers = Vec::with_capacity(n);
    for k in 0..n {
        let tag = if n == 1 {
            tag.to_string()
        } else {
            format!("{tag}-router{k}")
        };
        routers.push(procs::start_with(paths, c, &workers.fleet, &router_args(p, c), &tag).await?);
    }
    // Readiness probes are not inference requests; counters start at 0.
    // Each router replays its share of the users, all at once.
    let runs = routers.iter().enumerate().map(|(k, r)| {
        let share: Vec<workload::Scheduled> = schedule
            .iter()
            .filter(|s| s.user % n == k)
            .cloned()
            .collect();
        let url = format!("{}/v1/chat/completions", r.base);
        async move { loadgen::open_loop(&url, Arc::new(share), p.drain).await }
    });
    // A restart's effect on the first worker's cache, which only its
    // events tell a router.
    let flush = p.flush_first_worker_at.and_then(|at| {
        let url = format!("{}/flush_cache", workers.prefill.urls.first()?);
        Some(tokio::spawn(async move {
            tokio::time::sleep(at).await;
            let _ = reqwest::Client::new().post(url).send().await;
        }))
    });
    let mut outcomes = Vec::with_capacity(schedule.len());
    for run in futures::future::join_all(runs).await {
        outcomes.extend(run?.0);
    }
    if n == 1 {
        crate::trace::write(shape.name, seed, &c.label(), schedule, &outcomes);
    }
    if let Some(f) = flush {
        f.abort();
    }
    for r in &mut routers {
        r.check_alive()?;
    }
    workers.prefill.check_alive()?;
    let stats = workers.prefill.stats().await?;
    let mut row = summarise(shape, seed, c, &outcomes, &stats);
    row.held_out = held_out;
    drop(routers);
    drop(workers);
    // Let sockets and processes go before the next contender.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(row)
}

/// One run's row from what its clients saw and its prefilling workers'
/// `/_sim/stats` (shared with the replicas scenario).
pub(crate) fn summarise(
    shape: &Shape,
    seed: u64,
    c: Contender,
    outcomes: &[StreamOutcome],
    stats: &[serde_json::Value],
) -> QualityRow {
    let p = &shape.params;
    let mut ttft: Vec<f64> = outcomes.iter().filter_map(|o| o.ttft_ms).collect();
    let done: Vec<&StreamOutcome> = outcomes
        .iter()
        .filter(|o| o.failure.is_none() && o.e2e_ms.is_some())
        .collect();
    let mut e2e: Vec<f64> = done.iter().filter_map(|o| o.e2e_ms).collect();
    let per_worker: Vec<u64> = stats
        .iter()
        .map(|s| s["requests_total"].as_u64().unwrap_or(0))
        .collect();
    let (prompt, cached) = stats.iter().fold((0u64, 0u64), |(p, c), s| {
        (
            p + s["prompt_tokens_total"].as_u64().unwrap_or(0),
            c + s["cached_tokens_total"].as_u64().unwrap_or(0),
        )
    });
    let max = per_worker.iter().copied().max().unwrap_or(0) as f64;
    let min = per_worker.iter().copied().min().unwrap_or(0) as f64;
    let busy_us = prompt.saturating_sub(cached) as f64 * p.prefill_us_per_token as f64;
    let lanes = (per_worker.len() * p.dp_size.max(1) * p.max_running_prefills.max(1)) as f64;
    QualityRow {
        shape: shape.name.to_string(),
        seed,
        held_out: false,
        contender: c.label(),
        requests: outcomes.len(),
        completed: done.len(),
        failed: outcomes.len() - done.len(),
        first_failure: outcomes.iter().find_map(|o| o.failure.clone()),
        ttft_ms: Percentiles::of(&mut ttft),
        e2e_ms: Percentiles::of(&mut e2e),
        cache_hit_ratio: if prompt > 0 {
            cached as f64 / prompt as f64
        } else {
            0.0
        },
        max_min: if min > 0.0 { max / min } else { f64::INFINITY },
        per_worker,
        busy: busy_us / 1e6 / (lanes.max(1.0) * p.duration.as_secs_f64().max(1e-9)),
    }
}
