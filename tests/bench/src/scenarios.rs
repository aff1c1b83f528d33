//! Scenarios 1 (overhead) and 2 (routing quality): start the contenders,
//! drive the load, collect the numbers.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::loadgen;
use crate::params::{Contender, OverheadParams, QualityParams, SEED};
use crate::procs::{self, Paths, Sims};
use crate::stats::{median, Percentiles};
use crate::workload;

/// One scenario 1 cell for one contender (its nearest-rank median round:
/// of two rounds, the slower).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OverheadRow {
    /// Contender label.
    pub contender: String,
    /// Body size asked for.
    pub body_bytes: usize,
    /// Closed-loop clients.
    pub concurrency: usize,
    /// Requests per second (nearest-rank median over rounds).
    pub rps: f64,
    /// Latency percentiles in ms, of that round.
    pub latency_ms: Percentiles,
    /// Failed requests over all rounds.
    pub errors: u64,
    /// The router's CPU time per request in that round, microseconds
    /// (user + system of its processes over the window, divided by the
    /// requests answered in it); `None` for `direct`.
    #[serde(default)]
    pub cpu_us_per_req: Option<f64>,
}

/// Runs scenario 1: one instant worker, every contender in front of it,
/// cells (body size x concurrency) in turn, contenders interleaved.
pub async fn overhead(
    paths: &Paths,
    p: &OverheadParams,
    contenders: &[Contender],
) -> anyhow::Result<Vec<OverheadRow>> {
    let mut sims = Sims::start(paths, &paths.instant_worker, 1, &[], "overhead").await?;
    let mut running = Vec::new();
    for &c in contenders {
        eprintln!("  starting {}", c.label());
        running.push((c, procs::start(paths, c, &sims.urls, "overhead").await?));
    }
    let mut rows = Vec::new();
    for &bytes in &p.body_bytes {
        let bodies = Arc::new(workload::overhead_bodies(
            SEED,
            bytes,
            p.distinct_bodies,
            p.max_tokens,
        ));
        for &conc in &p.concurrency {
            let mut rounds: Vec<Vec<loadgen::ClosedLoopResult>> = vec![Vec::new(); running.len()];
            for round in 0..p.rounds.max(1) {
                let mut order: Vec<usize> = (0..running.len()).collect();
                if round % 2 == 1 {
                    order.reverse();
                }
                for i in order {
                    let (c, r) = &mut running[i];
                    r.check_alive()?;
                    let url = format!("{}/v1/chat/completions", r.base);
                    let cpu = || r.cpu_seconds();
                    let res = loadgen::closed_loop(
                        &url,
                        Arc::clone(&bodies),
                        conc,
                        p.warmup,
                        p.measure,
                        &cpu,
                    )
                    .await
                    .with_context(|| format!("{} c={conc}", c.label()))?;
                    let cpu = res
                        .cpu_s
                        .filter(|_| res.rps > 0.0)
                        .map(|cpu| {
                            format!(
                                "  cpu {:.0} us/req",
                                cpu * 1e6 / (res.rps * p.measure.as_secs_f64())
                            )
                        })
                        .unwrap_or_default();
                    eprintln!(
                        "  {:>6} B  c={:<3} {:<20} {:>9.0} req/s  p50 {:.3} ms  p99 {:.3} ms  errors {}{cpu}",
                        bytes,
                        conc,
                        c.label(),
                        res.rps,
                        res.latency_ms.p50,
                        res.latency_ms.p99,
                        res.errors
                    );
                    rounds[i].push(res);
                }
            }
            for (i, (c, _)) in running.iter().enumerate() {
                let rs = &rounds[i];
                let mut rps: Vec<f64> = rs.iter().map(|r| r.rps).collect();
                let mid = median(&mut rps);
                let pick = rs
                    .iter()
                    .min_by(|a, b| (a.rps - mid).abs().total_cmp(&(b.rps - mid).abs()))
                    .cloned()
                    .context("no round")?;
                rows.push(OverheadRow {
                    contender: c.label(),
                    body_bytes: bytes,
                    concurrency: conc,
                    rps: mid,
                    latency_ms: pick.latency_ms,
                    errors: rs.iter().map(|r| r.errors).sum(),
                    cpu_us_per_req: pick.cpu_s.and_then(|cpu| {
                        let answered = pick.rps * p.measure.as_secs_f64();
                        (answered > 0.0).then(|| cpu * 1e6 / answered)
                    }),
                });
            }
        }
    }
    sims.check_alive()?;
    Ok(rows)
}

/// Scenario 2 result of one contender.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QualityRow {
    /// Contender label.
    pub contender: String,
    /// Requests sent.
    pub requests: usize,
    /// Requests that streamed to the end with a 2xx.
    pub completed: usize,
    /// Time to first content chunk, ms (cut requests count with their wait).
    pub ttft_ms: Percentiles,
    /// Time to the end of the stream, ms, of completed requests.
    pub e2e_ms: Percentiles,
    /// Cached / prompt tokens over all workers (their `/_sim/stats`).
    pub cache_hit_ratio: f64,
    /// The same from the usage the client received.
    pub client_hit_ratio: f64,
    /// Inference requests each worker served.
    pub per_worker: Vec<u64>,
    /// Largest over smallest of `per_worker` (infinite when one got none).
    pub max_min: f64,
    /// Offered prefill load: uncached tokens x prefill time / (workers x
    /// arrival period). Above 1 the workers cannot keep up.
    pub busy: f64,
    /// Wall time from the first request to the last answer, s.
    pub span_s: f64,
}

/// Runs scenario 2 for every contender, each on freshly started workers.
pub async fn quality(
    paths: &Paths,
    p: &QualityParams,
    contenders: &[Contender],
) -> anyhow::Result<Vec<QualityRow>> {
    let schedule = Arc::new(workload::conversation_schedule(p, SEED));
    eprintln!(
        "  schedule: {} requests over {:?} ({:.1}/s)",
        schedule.len(),
        p.duration,
        schedule.len() as f64 / p.duration.as_secs_f64()
    );
    let mut rows = Vec::new();
    for &c in contenders {
        if matches!(c, Contender::Direct | Contender::EnvoyAlone) {
            continue;
        }
        let tag = "quality";
        // Fresh workers: empty caches and zeroed counters for each contender.
        let mut sims = Sims::start(paths, &paths.sim, p.workers, &p.sim_args(), tag).await?;
        let mut r = procs::start(paths, c, &sims.urls, tag).await?;
        // Readiness probes are not inference requests; counters start at 0.
        let url = format!("{}/v1/chat/completions", r.base);
        let (outcomes, span) = loadgen::open_loop(&url, Arc::clone(&schedule), p.drain).await?;
        r.check_alive()?;
        sims.check_alive()?;
        let stats = sims.stats().await?;
        let row = summarise(c, p, &outcomes, span, &stats);
        eprintln!(
            "  {:<20} TTFT p50 {:.0} p95 {:.0} ms  e2e p95 {:.0} ms  hit {:.3}  max/min {:.2} {:?}  busy {:.0}%  done {}/{}",
            row.contender,
            row.ttft_ms.p50,
            row.ttft_ms.p95,
            row.e2e_ms.p95,
            row.cache_hit_ratio,
            row.max_min,
            row.per_worker,
            row.busy * 100.0,
            row.completed,
            row.requests
        );
        rows.push(row);
        drop(r);
        drop(sims);
        // Let sockets and processes go before the next contender.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(rows)
}

fn summarise(
    c: Contender,
    p: &QualityParams,
    outcomes: &[loadgen::StreamOutcome],
    span: Duration,
    stats: &[serde_json::Value],
) -> QualityRow {
    let mut ttft: Vec<f64> = outcomes.iter().filter_map(|o| o.ttft_ms).collect();
    let done: Vec<&loadgen::StreamOutcome> = outcomes
        .iter()
        .filter(|o| o.e2e_ms.is_some() && (200..300).contains(&o.status))
        .collect();
    let mut e2e: Vec<f64> = done.iter().filter_map(|o| o.e2e_ms).collect();
    let (cp, cc) = done.iter().fold((0u64, 0u64), |(p, c), o| {
        (p + o.prompt_tokens, c + o.cached_tokens)
    });
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
    QualityRow {
        contender: c.label(),
        requests: outcomes.len(),
        completed: done.len(),
        ttft_ms: Percentiles::of(&mut ttft),
        e2e_ms: Percentiles::of(&mut e2e),
        cache_hit_ratio: ratio(cached as f64, prompt as f64),
        client_hit_ratio: ratio(cc as f64, cp as f64),
        max_min: if min > 0.0 { max / min } else { f64::INFINITY },
        per_worker,
        busy: busy_us / 1e6 / (p.workers as f64 * p.duration.as_secs_f64().max(1e-9)),
        span_s: span.as_secs_f64(),
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}
