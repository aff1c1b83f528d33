//! Scenario 1 (overhead: whole answers, SSE streams, PD mode): start the
//! contenders, drive the load, collect the numbers. Scenario 2 is in
//! [`crate::quality`].

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::loadgen::{self, Reading};
use crate::params::{Contender, OverheadParams, SEED};
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

/// The streaming case of scenario 1 for one contender (its nearest-rank
/// median round by req/s).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamRow {
    /// Contender label.
    pub contender: String,
    /// Closed-loop clients.
    pub concurrency: usize,
    /// Chunk events per answer.
    pub chunks: usize,
    /// Streams read to `[DONE]` per second.
    pub rps: f64,
    /// Chunk events delivered per second (of the streams counted in `rps`).
    pub chunks_per_s: f64,
    /// Time from sending to `[DONE]`, ms.
    pub latency_ms: Percentiles,
    /// Failed streams (an error status, or no `[DONE]`) over all rounds.
    pub errors: u64,
    /// The router's CPU time per stream, microseconds; `None` for `direct`.
    pub cpu_us_per_req: Option<f64>,
    /// The router's CPU time per chunk event delivered, microseconds.
    pub cpu_us_per_chunk: Option<f64>,
    /// What the first failed stream saw.
    pub first_error: Option<String>,
}

/// Scenario 1's PD case for one contender.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PdRow {
    /// Contender label.
    pub contender: String,
    /// Closed-loop clients.
    pub concurrency: usize,
    /// Requests per second (nearest-rank median over rounds).
    pub rps: f64,
    /// Latency percentiles in ms, of that round.
    pub latency_ms: Percentiles,
    /// Failed requests over all rounds.
    pub errors: u64,
    /// The router's CPU time per request, microseconds.
    pub cpu_us_per_req: Option<f64>,
    /// Why there is no number, or what the failed requests saw.
    pub note: Option<String>,
}

/// Everything scenario 1 measures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OverheadResults {
    /// Whole answers: body size x concurrency x contender.
    pub cells: Vec<OverheadRow>,
    /// SSE answers, one row per contender.
    pub streaming: Vec<StreamRow>,
    /// PD mode, one row per contender.
    pub pd: Vec<PdRow>,
}

/// The rounds of one cell, per contender, or why a contender dropped out.
type Rounds = Vec<Result<Vec<loadgen::ClosedLoopResult>, String>>;

/// Runs one cell (`bodies` at `conc` clients, answers read as `answer`)
/// against every running contender, `p.rounds` times in alternating order
/// (A B C, C B A, ...). A contender whose process died drops out with the
/// reason.
async fn interleaved(
    running: &mut [(Contender, procs::Running)],
    bodies: &Arc<Vec<Vec<u8>>>,
    conc: usize,
    p: &OverheadParams,
    answer: Reading,
    what: &str,
) -> anyhow::Result<Rounds> {
    let mut rounds: Rounds = vec![Ok(Vec::new()); running.len()];
    for round in 0..p.rounds.max(1) {
        let mut order: Vec<usize> = (0..running.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (c, r) = &mut running[i];
            if rounds[i].is_err() {
                continue;
            }
            if let Err(e) = r.check_alive() {
                rounds[i] = Err(format!("{e:#}"));
                continue;
            }
            let url = format!("{}/v1/chat/completions", r.base);
            let cpu = || r.cpu_seconds();
            let res = loadgen::closed_loop_reading(
                &url,
                Arc::clone(bodies),
                conc,
                p.warmup,
                p.measure,
                &cpu,
                answer,
            )
            .await
            .with_context(|| format!("{} {what} c={conc}", c.label()))?;
            let window = p.measure.as_secs_f64();
            let mut cpu = String::new();
            if let Some(s) = res.cpu_s.filter(|_| res.rps > 0.0) {
                let _ = write!(cpu, "  cpu {:.0} us/req", s * 1e6 / (res.rps * window));
                if res.chunks_per_s > 0.0 {
                    let _ = write!(
                        cpu,
                        " {:.2} us/chunk",
                        s * 1e6 / (res.chunks_per_s * window)
                    );
                }
            }
            let chunks = if answer == Reading::Sse {
                format!(" {:>9.0} chunks/s", res.chunks_per_s)
            } else {
                String::new()
            };
            let first = res
                .first_error
                .as_deref()
                .map(|e| format!("  first error: {e}"))
                .unwrap_or_default();
            eprintln!(
                "  {what:>8} c={:<3} {:<26} {:>9.0} req/s{chunks}  p50 {:.3} ms  p99 {:.3} ms  errors {}{cpu}{first}",
                conc,
                c.label(),
                res.rps,
                res.latency_ms.p50,
                res.latency_ms.p99,
                res.errors
            );
            if let Ok(done) = &mut rounds[i] {
                done.push(res);
            }
        }
    }
    Ok(rounds)
}

/// The nearest-rank median of `rounds` by req/s, and the round nearest to
/// it (of two rounds, the slower).
fn median_round(rounds: &[loadgen::ClosedLoopResult]) -> Option<(f64, &loadgen::ClosedLoopResult)> {
    let mut rps: Vec<f64> = rounds.iter().map(|r| r.rps).collect();
    let mid = median(&mut rps);
    let pick = rounds
        .iter()
        .min_by(|a, b| (a.rps - mid).abs().total_cmp(&(b.rps - mid).abs()))?;
    Some((mid, pick))
}

/// Router CPU microseconds per unit, from a round's CPU seconds and its
/// units per second over `window` seconds.
fn cpu_us_per(cpu_s: Option<f64>, per_s: f64, window: f64) -> Option<f64> {
    let units = per_s * window;
    cpu_s.filter(|_| units > 0.0).map(|cpu| cpu * 1e6 / units)
}

/// Runs scenario 1: one instant worker, every contender in front of it,
/// cells (body size x concurrency) in turn, contenders interleaved; then
/// the streaming case on the same processes; then the PD case (its own
/// workers and routers, for the contenders of `pd_contenders`).
pub async fn overhead(
    paths: &Paths,
    p: &OverheadParams,
    contenders: &[Contender],
    pd_contenders: &[Contender],
) -> anyhow::Result<OverheadResults> {
    let worker_args = ["--sse-chunks".to_string(), p.stream.chunks.to_string()];
    let mut sims = Sims::start(paths, &paths.instant_worker, 1, &worker_args, "overhead").await?;
    let mut running = Vec::new();
    for &c in contenders {
        eprintln!("  starting {}", c.label());
        running.push((c, procs::start(paths, c, &sims.urls, "overhead").await?));
    }
    let window = p.measure.as_secs_f64();
    let mut out = OverheadResults::default();
    for &bytes in &p.body_bytes {
        let bodies = Arc::new(workload::overhead_bodies(
            SEED,
            bytes,
            p.distinct_bodies,
            p.max_tokens,
        ));
        for &conc in &p.concurrency {
            let what = format!("{bytes} B");
            let rounds = interleaved(&mut running, &bodies, conc, p, Reading::Whole, &what).await?;
            for ((c, _), rs) in running.iter().zip(&rounds) {
                let rs = rs.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
                let (mid, pick) = median_round(rs).context("no round")?;
                out.cells.push(OverheadRow {
                    contender: c.label(),
                    body_bytes: bytes,
                    concurrency: conc,
                    rps: mid,
                    latency_ms: pick.latency_ms,
                    errors: rs.iter().map(|r| r.errors).sum(),
                    cpu_us_per_req: cpu_us_per(pick.cpu_s, pick.rps, window),
                });
            }
        }
    }

    let s = &p.stream;
    eprintln!(
        "==> scenario 1: streaming ({}-chunk SSE answers, c={})",
        s.chunks, s.concurrency
    );
    let bodies = Arc::new(workload::stream_bodies(
        SEED,
        s.body_bytes,
        p.distinct_bodies,
        s.chunks as u32,
    ));
    let rounds = interleaved(
        &mut running,
        &bodies,
        s.concurrency,
        p,
        Reading::Sse,
        "stream",
    )
    .await?;
    for ((c, _), rs) in running.iter().zip(&rounds) {
        let rs = rs.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        let (mid, pick) = median_round(rs).context("no round")?;
        out.streaming.push(StreamRow {
            contender: c.label(),
            concurrency: s.concurrency,
            chunks: s.chunks,
            rps: mid,
            chunks_per_s: pick.chunks_per_s,
            latency_ms: pick.latency_ms,
            errors: rs.iter().map(|r| r.errors).sum(),
            cpu_us_per_req: cpu_us_per(pick.cpu_s, pick.rps, window),
            cpu_us_per_chunk: cpu_us_per(pick.cpu_s, pick.chunks_per_s, window),
            first_error: rs.iter().find_map(|r| r.first_error.clone()),
        });
    }
    sims.check_alive()?;
    drop(running);
    drop(sims);

    if !pd_contenders.is_empty() {
        out.pd = pd(paths, p, pd_contenders).await?;
    }
    Ok(out)
}

/// The first line of `e`, at most 300 characters (a note in a table).
fn short(e: &str) -> String {
    let line = e.lines().next().unwrap_or_default();
    let mut s: String = line.chars().take(300).collect();
    if s.len() < line.len() {
        s.push_str("...");
    }
    s
}

/// Scenario 1's PD case: one prefill and one decode simulated worker,
/// every contender in PD mode in front of them, interleaved rounds. A
/// contender that cannot start or dies gets a row with the reason.
async fn pd(
    paths: &Paths,
    p: &OverheadParams,
    contenders: &[Contender],
) -> anyhow::Result<Vec<PdRow>> {
    let d = &p.pd;
    eprintln!(
        "==> scenario 1: PD (1 prefill + 1 decode simulated worker, c={})",
        d.concurrency
    );
    let mut sims = procs::PdSims::start(paths, &d.sim_args(), "pd").await?;
    let mut rows = Vec::new();
    let mut running = Vec::new();
    for &c in contenders {
        eprintln!("  starting {} in PD mode", c.label());
        match procs::start_in_front(paths, c, &sims.fleet, "pd").await {
            Ok(r) => running.push((c, r)),
            Err(e) => {
                eprintln!("  {} did not start in PD mode: {e:#}", c.label());
                rows.push(PdRow {
                    contender: c.label(),
                    concurrency: d.concurrency,
                    rps: 0.0,
                    latency_ms: Percentiles::default(),
                    errors: 0,
                    cpu_us_per_req: None,
                    note: Some(format!("did not start: {}", short(&format!("{e:#}")))),
                });
            }
        }
    }
    let bodies = Arc::new(workload::overhead_bodies(
        SEED,
        d.body_bytes,
        p.distinct_bodies,
        d.max_tokens,
    ));
    let window = p.measure.as_secs_f64();
    let rounds = interleaved(
        &mut running,
        &bodies,
        d.concurrency,
        p,
        Reading::Whole,
        "PD",
    )
    .await?;
    for ((c, _), rs) in running.iter().zip(&rounds) {
        let row = match rs {
            Err(e) => PdRow {
                contender: c.label(),
                concurrency: d.concurrency,
                rps: 0.0,
                latency_ms: Percentiles::default(),
                errors: 0,
                cpu_us_per_req: None,
                note: Some(format!("exited: {}", short(e))),
            },
            Ok(rs) => {
                let (mid, pick) = median_round(rs).context("no round")?;
                let errors: u64 = rs.iter().map(|r| r.errors).sum();
                let first = rs.iter().find_map(|r| r.first_error.clone());
                PdRow {
                    contender: c.label(),
                    concurrency: d.concurrency,
                    rps: mid,
                    latency_ms: pick.latency_ms,
                    errors,
                    cpu_us_per_req: cpu_us_per(pick.cpu_s, pick.rps, window),
                    note: first.map(|e| {
                        let what = if mid > 0.0 {
                            "some requests failed"
                        } else {
                            "every request failed"
                        };
                        format!("{what}: {}", short(&e))
                    }),
                }
            }
        };
        rows.push(row);
    }
    // Keep the contenders' order.
    rows.sort_by_key(|r| contenders.iter().position(|c| c.label() == r.contender));
    if let Err(e) = sims.check_alive() {
        eprintln!("  a PD worker died: {e:#}");
    }
    match sims.stats().await {
        Ok(stats) => eprintln!(
            "  PD workers served (prefill, decode): {:?}",
            stats
                .iter()
                .map(|s| s["requests_total"].as_u64().unwrap_or(0))
                .collect::<Vec<_>>()
        ),
        Err(e) => eprintln!("  PD worker stats: {e:#}"),
    }
    Ok(rows)
}
