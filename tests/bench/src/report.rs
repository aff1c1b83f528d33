//! The report: one markdown document with the machine, the results of each
//! scenario, ratios against the peer, and the goals with PASS/FAIL. Printed
//! by `sglang-envoy-bench run` and written to `docs/benchmarks.md`.

use std::fmt::Write as _;

use crate::params::{Contender, Profile};
use crate::results::{CriterionEstimate, EngineResults};
use crate::scenarios::{OverheadRow, QualityRow};

/// Facts about the run, for the header.
#[derive(Debug, Clone, Default)]
pub struct RunInfo {
    /// `full` or `quick`.
    pub profile: String,
    /// UTC date and time of the run.
    pub date: String,
    /// Lines such as `CPU: ...`, `kernel: ...`.
    pub machine: Vec<(String, String)>,
    /// Lines such as `envoy: 1.40.0`.
    pub versions: Vec<(String, String)>,
    /// The command that produced the report.
    pub command: String,
}

/// What the report is made of; absent scenarios are left out.
#[derive(Debug, Default)]
pub struct Inputs {
    /// Scenario 1 rows.
    pub overhead: Option<Vec<OverheadRow>>,
    /// Scenario 2 rows.
    pub quality: Option<Vec<QualityRow>>,
    /// Scenario 3 helper results.
    pub engine: Option<EngineResults>,
    /// Scenario 3 criterion estimates.
    pub criterion: Vec<CriterionEstimate>,
}

/// One goal's verdict.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// What is checked.
    pub goal: String,
    /// The target, in words.
    pub target: String,
    /// What was measured.
    pub measured: String,
    /// Whether it holds (None when it could not be measured).
    pub pass: Option<bool>,
}

fn mark(pass: Option<bool>) -> &'static str {
    match pass {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "n/a",
    }
}

fn find_overhead<'a>(
    rows: &'a [OverheadRow],
    c: &str,
    bytes: usize,
    conc: usize,
) -> Option<&'a OverheadRow> {
    rows.iter()
        .find(|r| r.contender == c && r.body_bytes == bytes && r.concurrency == conc)
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1024 {
        format!("{} KB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// The goals of the issue, checked against `inputs`.
pub fn verdicts(inputs: &Inputs, profile: &Profile) -> Vec<Verdict> {
    let mut out = Vec::new();
    let peer = Contender::peer("cache_aware").label();
    let ours = Contender::ours("cache_aware").label();
    let direct = Contender::Direct.label();
    if let Some(rows) = &inputs.overhead {
        let top = profile
            .overhead
            .concurrency
            .iter()
            .copied()
            .max()
            .unwrap_or(64);
        let low = profile
            .overhead
            .concurrency
            .iter()
            .copied()
            .min()
            .unwrap_or(1);
        for &b in &profile.overhead.body_bytes {
            let (o, p) = (
                find_overhead(rows, &ours, b, top),
                find_overhead(rows, &peer, b, top),
            );
            let (measured, pass) = match (o, p) {
                (Some(o), Some(p)) if p.rps > 0.0 => (
                    format!("{:.0} vs {:.0} req/s = {:.2}x", o.rps, p.rps, o.rps / p.rps),
                    Some(o.rps >= p.rps),
                ),
                _ => ("missing".into(), None),
            };
            out.push(Verdict {
                goal: format!(
                    "Overhead, {} bodies: req/s at concurrency {top}",
                    size_label(b)
                ),
                target: "ours >= peer cache_aware".into(),
                measured,
                pass,
            });
            let d = find_overhead(rows, &direct, b, low);
            let (o, p) = (
                find_overhead(rows, &ours, b, low),
                find_overhead(rows, &peer, b, low),
            );
            let (measured, pass) = match (o, p, d) {
                (Some(o), Some(p), Some(d)) => {
                    let ao = o.latency_ms.p50 - d.latency_ms.p50;
                    let ap = p.latency_ms.p50 - d.latency_ms.p50;
                    let ratio = if ap > 0.0 { ao / ap } else { f64::INFINITY };
                    (
                        format!("+{:.3} ms vs +{:.3} ms = {:.2}x", ao, ap, ratio),
                        Some(ao <= 1.5 * ap),
                    )
                }
                _ => ("missing".into(), None),
            };
            out.push(Verdict {
                goal: format!(
                    "Overhead, {} bodies: added p50 latency at concurrency {low}",
                    size_label(b)
                ),
                target: "ours <= 1.5x peer's (over direct)".into(),
                measured,
                pass,
            });
        }
    }
    if let Some(rows) = &inputs.quality {
        let reference = rows.iter().find(|r| r.contender == peer);
        for r in rows.iter().filter(|r| r.contender.starts_with("ours ")) {
            let (measured, pass) = match reference {
                Some(p) if p.ttft_ms.p95 > 0.0 => {
                    let t = r.ttft_ms.p95 / p.ttft_ms.p95;
                    let ok =
                        t <= 0.8 && r.cache_hit_ratio >= p.cache_hit_ratio && r.max_min <= 1.25;
                    (
                        format!(
                            "TTFT p95 {:.2}x ({}), hit {:.3} vs {:.3} ({}), max/min {:.2} ({})",
                            t,
                            mark(Some(t <= 0.8)),
                            r.cache_hit_ratio,
                            p.cache_hit_ratio,
                            mark(Some(r.cache_hit_ratio >= p.cache_hit_ratio)),
                            r.max_min,
                            mark(Some(r.max_min <= 1.25)),
                        ),
                        Some(ok),
                    )
                }
                _ => ("peer cache_aware missing".into(), None),
            };
            out.push(Verdict {
                goal: format!("Quality, {}", r.contender),
                target: "TTFT p95 <= 0.8x peer cache_aware, hit ratio >= peer's, max/min <= 1.25"
                    .into(),
                measured,
                pass,
            });
        }
    }
    if let Some(e) = &inputs.engine {
        let cell = e
            .decisions
            .iter()
            .find(|c| c.workers == 64 && c.prompt_bytes == 4096);
        out.push(Verdict {
            goal: "Engine: one decision, 4 KB prompt, 64 workers".into(),
            target: "p99 <= 10 us".into(),
            measured: cell.map_or("missing".into(), |c| {
                format!("p99 {:.2} us (p50 {:.2} us)", c.us.p99, c.us.p50)
            }),
            pass: cell.map(|c| c.us.p99 <= 10.0),
        });
    }
    out
}

/// The whole markdown document.
pub fn render(info: &RunInfo, inputs: &Inputs, profile: &Profile) -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "# Benchmarks\n");
    let _ = writeln!(
        w,
        "Generated by `scripts/bench.sh` ({} profile) on {}. Every parameter and the \
         workload generator live in `tests/bench/src/params.rs` and \
         `tests/bench/src/workload.rs`; seeds are fixed. The machine is small and \
         shared, so absolute numbers are noise: contenders run in the same run, \
         interleaved or back-to-back, and the ratios are what to compare.\n",
        info.profile, info.date
    );
    let _ = writeln!(w, "Command: `{}`\n", info.command);
    let _ = writeln!(w, "| machine | |\n| --- | --- |");
    for (k, v) in info.machine.iter().chain(&info.versions) {
        let _ = writeln!(w, "| {k} | {v} |");
    }
    let _ = writeln!(w);

    let verdicts = verdicts(inputs, profile);
    if !verdicts.is_empty() {
        let _ = writeln!(w, "## Goals\n");
        let _ = writeln!(
            w,
            "| goal | target | measured | result |\n| --- | --- | --- | --- |"
        );
        for v in &verdicts {
            let _ = writeln!(
                w,
                "| {} | {} | {} | **{}** |",
                v.goal,
                v.target,
                v.measured,
                mark(v.pass)
            );
        }
        let _ = writeln!(w);
    }

    if let Some(rows) = &inputs.overhead {
        render_overhead(w, rows, profile);
    }
    if let Some(rows) = &inputs.quality {
        render_quality(w, rows, profile);
    }
    if inputs.engine.is_some() || !inputs.criterion.is_empty() {
        render_engine(w, inputs, profile);
    }
    s
}

fn render_overhead(w: &mut String, rows: &[OverheadRow], profile: &Profile) {
    let p = &profile.overhead;
    let _ = writeln!(w, "## Scenario 1: overhead\n");
    let _ = writeln!(
        w,
        "One worker that answers at once (`bench-instant-worker`: reads the body, \
         answers a fixed completion; the simulated worker's tokenizer and cache \
         would cost more CPU than the routers on this machine), non-streamed chat completions (`max_tokens` {}) of about 1 KB and 16 KB, \
         {} distinct bodies per size sharing a system prompt. Closed loop: N \
         clients on keep-alive connections, each sending its next request when the \
         last answer is read; {:?} warm-up, then {:?} measured; {} round(s) per \
         cell in alternating contender order; the round shown is the nearest-rank median by req/s (of two rounds, the slower). `direct` is the \
         worker itself (the floor); `envoy alone` is `envoy/envoy.yaml` without \
         the wasm filter (Envoy's round robin over the same EDS endpoints): the \
         floor of any router living inside Envoy, so `ours` minus `envoy alone` is \
         what the filter and its gRPC call to the control plane cost. `added p50` \
         is the contender's p50 minus direct's; `vs peer` is req/s over the peer's. \
         `CPU us/req` is the router's CPU time (user + system of its processes: \
         Envoy and the control plane for ours and for `envoy alone`, the router \
         process for the peer) over the measured window, per request answered; \
         `CPU vs peer` divides it by the peer's.\n",
        p.max_tokens, p.distinct_bodies, p.warmup, p.measure, p.rounds
    );
    let _ = writeln!(
        w,
        "| body | clients | contender | req/s | p50 ms | p99 ms | added p50 ms | req/s vs peer | CPU us/req | CPU vs peer | errors |\n\
         | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let peer = Contender::peer("cache_aware").label();
    let direct = Contender::Direct.label();
    for r in rows {
        let floor = find_overhead(rows, &direct, r.body_bytes, r.concurrency);
        let pr = find_overhead(rows, &peer, r.body_bytes, r.concurrency);
        let added = match floor {
            Some(d) if r.contender != direct => {
                format!("{:+.3}", r.latency_ms.p50 - d.latency_ms.p50)
            }
            _ => "".into(),
        };
        let vs = match pr {
            Some(p) if p.rps > 0.0 => format!("{:.2}x", r.rps / p.rps),
            _ => "".into(),
        };
        let cpu = r
            .cpu_us_per_req
            .map_or(String::new(), |c| format!("{c:.0}"));
        let cpu_vs = match (r.cpu_us_per_req, pr.and_then(|p| p.cpu_us_per_req)) {
            (Some(c), Some(p)) if p > 0.0 => format!("{:.2}x", c / p),
            _ => "".into(),
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:.0} | {:.3} | {:.3} | {} | {} | {} | {} | {} |",
            size_label(r.body_bytes),
            r.concurrency,
            r.contender,
            r.rps,
            r.latency_ms.p50,
            r.latency_ms.p99,
            added,
            vs,
            cpu,
            cpu_vs,
            r.errors
        );
    }
    let _ = writeln!(w);
}

fn render_quality(w: &mut String, rows: &[QualityRow], profile: &Profile) {
    let q = &profile.quality;
    let _ = writeln!(w, "## Scenario 2: routing quality\n");
    let _ = writeln!(
        w,
        "{} simulated workers, each with one prefill at a time ({} us per uncached \
         token, 4 characters per token), {} us per generated token, a {}-token \
         prefix cache with LRU eviction. Multi-turn chat: {} long system prompts \
         of {} characters, each shared by a group of users; {} users in \
         conversation at a time, {} turns each (user messages of {}-{} \
         characters, answers of {} kept in the history), at least {:?} between a \
         user's turns, new users replacing finished ones. Poisson arrivals at {}/s \
         for {:?} (fixed seed), streamed with usage; requests still running \
         {:?} after the last arrival are cut (their TTFT counts as the wait so \
         far). Workers are restarted for each contender. TTFT is the first \
         streamed chunk with content, as the client sees it; `hit` is cached / \
         prompt tokens from the workers' counters; `busy` is the prefill work \
         the workers were given over the arrival period (above 100% queues \
         grow); `max/min` is over requests per worker.\n",
        q.workers,
        q.prefill_us_per_token,
        q.decode_us_per_token,
        q.cache_tokens,
        q.system_prompts,
        q.system_prompt_chars,
        q.active_users,
        q.turns_per_user,
        q.user_message_chars.0,
        q.user_message_chars.1,
        q.assistant_chars,
        q.min_think,
        q.rate,
        q.duration,
        q.drain
    );
    let _ = writeln!(
        w,
        "| contender | TTFT p50 ms | TTFT p95 ms | e2e p95 ms | hit | busy | max/min | per worker | done | TTFT p95 vs peer |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"
    );
    let peer = Contender::peer("cache_aware").label();
    let reference = rows.iter().find(|r| r.contender == peer);
    for r in rows {
        let vs = match reference {
            Some(p) if p.ttft_ms.p95 > 0.0 => format!("{:.2}x", r.ttft_ms.p95 / p.ttft_ms.p95),
            _ => "".into(),
        };
        let _ = writeln!(
            w,
            "| {} | {:.0} | {:.0} | {:.0} | {:.3} | {:.0}% | {:.2} | {:?} | {}/{} | {} |",
            r.contender,
            r.ttft_ms.p50,
            r.ttft_ms.p95,
            r.e2e_ms.p95,
            r.cache_hit_ratio,
            r.busy * 100.0,
            r.max_min,
            r.per_worker,
            r.completed,
            r.requests,
            vs
        );
    }
    let _ = writeln!(w);
}

fn render_engine(w: &mut String, inputs: &Inputs, profile: &Profile) {
    let e = &profile.engine;
    let _ = writeln!(w, "## Scenario 3: decision engine\n");
    let _ = writeln!(
        w,
        "In-process, no network: `Engine::route` with the cache-aware policy \
         (prefix match, load check, tree insert, fallbacks, metrics) over 8, 64 \
         and 256 healthy workers, after routing documents of {} KB (one of 16 \
         shared 4 KB system prompts plus a conversation of their own) until each \
         worker holds about {} KB (at most {} MB in all). Each prompt continues a \
         stored conversation with a new last turn. `mean` is criterion's \
         (`cargo bench -p sglang-envoy-bench`); p50/p99/max time single \
         decisions ({} per cell, `bench-engine`).\n",
        crate::params::engine_docs::DOC_CHARS / 1024,
        e.fill_chars_per_worker / 1024,
        e.fill_chars_total_max >> 20,
        e.timed_decisions
    );
    let crit = |id: &str| inputs.criterion.iter().find(|c| c.id == id);
    if let Some(r) = &inputs.engine {
        let _ = writeln!(
            w,
            "| workers | prompt | mean us (criterion) | p50 us | p99 us | max us |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for c in &r.decisions {
            let mean = crit(&format!("decision/{}w/{}", c.workers, c.prompt_bytes))
                .map_or("".into(), |c| format!("{:.2}", c.mean_ns / 1e3));
            let _ = writeln!(
                w,
                "| {} | {} | {} | {:.2} | {:.2} | {:.1} |",
                c.workers,
                size_label(c.prompt_bytes),
                mean,
                c.us.p50,
                c.us.p99,
                c.us.max
            );
        }
        let _ = writeln!(w);
        let t = &r.tree;
        let _ = writeln!(
            w,
            "Memory (counting allocator). Bare tree, {} tenants: {:.1} MB for {} \
             stored characters = **{:.2} bytes per stored character** (a \
             character held by k workers counts k times; {} distinct characters, \
             {:.2} bytes per distinct character).\n",
            t.tenants,
            t.bytes as f64 / 1e6,
            t.stored_chars,
            t.bytes as f64 / t.stored_chars.max(1) as f64,
            t.unique_chars,
            t.bytes as f64 / t.unique_chars.max(1) as f64
        );
        let _ = writeln!(
            w,
            "| engine fill | routed chars | heap MB | bytes per routed char | fill s |\n\
             | ---: | ---: | ---: | ---: | ---: |"
        );
        for f in &r.fills {
            let _ = writeln!(
                w,
                "| {} workers | {} | {:.1} | {:.2} | {:.1} |",
                f.workers,
                f.routed_chars,
                f.bytes as f64 / 1e6,
                f.bytes as f64 / f.routed_chars.max(1) as f64,
                f.seconds
            );
        }
        let _ = writeln!(w);
    }
    let tree: Vec<&CriterionEstimate> = inputs
        .criterion
        .iter()
        .filter(|c| c.id.starts_with("tree/"))
        .collect();
    if !tree.is_empty() {
        let _ = writeln!(
            w,
            "Radix tree alone (criterion, 64 tenants):\n\n| bench | mean us | median us |\n| --- | ---: | ---: |"
        );
        for c in tree {
            let _ = writeln!(
                w,
                "| {} | {:.2} | {:.2} |",
                c.id,
                c.mean_ns / 1e3,
                c.median_ns / 1e3
            );
        }
        let _ = writeln!(w);
    }
}
