//! The goals of the issues the benchmark answers, each checked against the
//! run's results: a verdict with what was measured.

use super::Inputs;
use crate::params::{Contender, Profile};
use crate::scenarios::{OverheadRow, PdRow, StreamRow};

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

impl Verdict {
    /// Its row in the report's goals table.
    pub fn row(&self) -> String {
        format!(
            "| {} | {} | {} | **{}** |",
            self.goal,
            self.target,
            self.measured,
            mark(self.pass)
        )
    }
}

pub(super) fn mark(pass: Option<bool>) -> &'static str {
    match pass {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "n/a",
    }
}

pub(super) fn find_overhead<'a>(
    rows: &'a [OverheadRow],
    c: &str,
    bytes: usize,
    conc: usize,
) -> Option<&'a OverheadRow> {
    rows.iter()
        .find(|r| r.contender == c && r.body_bytes == bytes && r.concurrency == conc)
}

pub(super) fn size_label(bytes: usize) -> String {
    if bytes >= 1024 {
        format!("{} KB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// Concurrencies the overhead goals name (the issue's): throughput at the
/// highest and at a middle load, added latency with one client.
const GOAL_HIGH: usize = 64;
const GOAL_MID: usize = 16;
const GOAL_ONE: usize = 1;

/// `measured` and `pass`, failed and said so when the contender had errors
/// in the cell.
fn unless_errors(
    measured: String,
    pass: Option<bool>,
    who: &str,
    errors: u64,
) -> (String, Option<bool>) {
    if errors == 0 {
        (measured, pass)
    } else {
        (
            format!("{measured}; {who} had {errors} errors"),
            Some(false),
        )
    }
}

/// `ours` req/s at least `factor` times `reference`'s in one cell.
fn rps_goal(
    goal: String,
    ours: Option<&OverheadRow>,
    reference: Option<&OverheadRow>,
    factor: f64,
) -> Verdict {
    let who = ours.map_or_else(String::new, |o| o.contender.clone());
    let (measured, pass) = match (ours, reference) {
        (Some(o), Some(p)) if p.rps > 0.0 => unless_errors(
            format!("{:.0} vs {:.0} req/s = {:.2}x", o.rps, p.rps, o.rps / p.rps),
            Some(o.rps >= factor * p.rps),
            &who,
            o.errors,
        ),
        _ => ("missing".into(), None),
    };
    Verdict {
        goal,
        target: format!(
            "{who} >= {factor:.1}x {}",
            reference.map_or("peer cache_aware", |r| r.contender.as_str())
        ),
        measured,
        pass,
    }
}

/// The overhead goals (whole answers) for body size `b`.
fn overhead_verdicts(rows: &[OverheadRow], b: usize, out: &mut Vec<Verdict>) {
    let ours = Contender::ours("cache_aware").label();
    let ext = Contender::OursExtProc("cache_aware").label();
    let alone = Contender::EnvoyAlone.label();
    let direct = Contender::Direct.label();
    let size = size_label(b);
    let cell = |c: &str, conc| find_overhead(rows, c, b, conc);
    // Each goal compares with the better of the two peers on what it
    // measures (a peer that did not run is left out).
    let peers = [
        Contender::peer("cache_aware"),
        Contender::smg("cache_aware"),
    ]
    .map(|c| c.label());
    let best_peer = |conc, better: fn(&OverheadRow, &OverheadRow) -> bool| {
        peers
            .iter()
            .filter_map(|p| cell(p, conc))
            .reduce(|a, b| if better(b, a) { b } else { a })
    };
    let fastest = |conc| best_peer(conc, |a, b| a.rps > b.rps);
    let quickest = best_peer(GOAL_ONE, |a, b| a.latency_ms.p50 < b.latency_ms.p50);
    let cheapest = best_peer(GOAL_HIGH, |a, b| {
        a.cpu_us_per_req.unwrap_or(f64::INFINITY) < b.cpu_us_per_req.unwrap_or(f64::INFINITY)
    });

    for (conc, factor) in [(GOAL_HIGH, 1.2), (GOAL_MID, 1.0)] {
        out.push(rps_goal(
            format!("Overhead, {size} bodies, wasm: req/s at concurrency {conc}"),
            cell(&ours, conc),
            fastest(conc),
            factor,
        ));
    }

    let peer = quickest.map_or(peers[0].clone(), |r| r.contender.clone());
    let (measured, pass) = match (cell(&ours, GOAL_ONE), quickest, cell(&direct, GOAL_ONE)) {
        (Some(o), Some(p), Some(d)) => {
            let ao = o.latency_ms.p50 - d.latency_ms.p50;
            let ap = p.latency_ms.p50 - d.latency_ms.p50;
            let ratio = if ap > 0.0 { ao / ap } else { f64::INFINITY };
            unless_errors(
                format!("+{ao:.3} ms vs +{ap:.3} ms = {ratio:.2}x"),
                Some(ao <= 1.2 * ap),
                &ours,
                o.errors,
            )
        }
        _ => ("missing".into(), None),
    };
    out.push(Verdict {
        goal: format!("Overhead, {size} bodies, wasm: added p50 latency at concurrency {GOAL_ONE}"),
        target: format!("{ours} <= 1.2x {peer}'s (over direct)"),
        measured,
        pass,
    });

    let cpu = |c: &str| cell(c, GOAL_HIGH).and_then(|r| r.cpu_us_per_req);
    let peer = cheapest.map_or(peers[0].clone(), |r| r.contender.clone());
    let (measured, pass) = match (cell(&ours, GOAL_HIGH), cpu(&ours), cpu(&peer), cpu(&alone)) {
        (Some(o), Some(co), Some(cp), Some(ca)) if cp > 0.0 && ca > 0.0 => unless_errors(
            format!(
                "{co:.1} vs {cp:.1} us/req = {:.2}x peer; envoy alone {ca:.1} us/req = {:.2}x",
                co / cp,
                co / ca
            ),
            Some(co <= cp && co <= 1.3 * ca),
            &ours,
            o.errors,
        ),
        _ => ("missing".into(), None),
    };
    out.push(Verdict {
        goal: format!(
            "Overhead, {size} bodies, wasm: router CPU per request at concurrency {GOAL_HIGH}"
        ),
        target: format!("{ours} <= {peer}'s and <= 1.3x envoy alone's"),
        measured,
        pass,
    });

    out.push(rps_goal(
        format!("Overhead, {size} bodies, ext_proc: req/s at concurrency {GOAL_HIGH}"),
        cell(&ext, GOAL_HIGH),
        fastest(GOAL_HIGH),
        1.0,
    ));
}

/// The streaming goal: CPU per SSE chunk through the wasm filter at most
/// 1.1x Envoy's alone.
pub(super) fn streaming_verdict(rows: &[StreamRow]) -> Verdict {
    let ours = Contender::ours("cache_aware").label();
    let alone = Contender::EnvoyAlone.label();
    let find = |c: &str| rows.iter().find(|r| r.contender == c);
    let (measured, pass) = match (find(&ours), find(&alone)) {
        (Some(o), Some(a)) => match (o.cpu_us_per_chunk, a.cpu_us_per_chunk) {
            (Some(co), Some(ca)) if ca > 0.0 => unless_errors(
                format!("{co:.2} vs {ca:.2} us/chunk = {:.2}x", co / ca),
                Some(co <= 1.1 * ca),
                &ours,
                o.errors,
            ),
            _ => unless_errors("no chunk delivered".into(), None, &ours, o.errors),
        },
        _ => ("missing".into(), None),
    };
    Verdict {
        goal: format!(
            "Streaming, {}-chunk SSE answers, wasm: router CPU per chunk",
            rows.first().map_or(0, |r| r.chunks)
        ),
        target: format!("{ours} <= 1.1x envoy alone's"),
        measured,
        pass,
    }
}

/// The PD goal: this project's req/s in PD mode at least the peer's.
pub(super) fn pd_verdict(rows: &[PdRow]) -> Verdict {
    let ours = Contender::ours("cache_aware").label();
    let find = |c: &str| rows.iter().find(|r| r.contender == c);
    // The faster of the peers that answered cleanly; else the first peer,
    // whose note says why it has no number.
    let peers = [
        Contender::peer("cache_aware"),
        Contender::smg("cache_aware"),
    ]
    .map(|c| c.label());
    let clean = peers
        .iter()
        .filter_map(|p| find(p))
        .filter(|p| p.rps > 0.0 && p.errors == 0)
        .max_by(|a, b| a.rps.total_cmp(&b.rps));
    let reference = clean.or_else(|| find(&peers[0]));
    let peer = reference.map_or(peers[0].clone(), |r| r.contender.clone());
    let conc = rows.first().map_or(0, |r| r.concurrency);
    let (measured, pass) = match (find(&ours), reference) {
        (Some(o), Some(p)) if p.rps > 0.0 && p.errors == 0 => unless_errors(
            format!("{:.0} vs {:.0} req/s = {:.2}x", o.rps, p.rps, o.rps / p.rps),
            Some(o.rps >= p.rps),
            &ours,
            o.errors,
        ),
        (Some(o), Some(p)) => {
            // The peer has no clean number: nothing to compare against,
            // but errors of ours still fail.
            let why = p.note.as_deref().unwrap_or("no request answered");
            let (m, pass) = unless_errors(
                format!("{:.0} req/s vs peer: {why}", o.rps),
                None,
                &ours,
                o.errors,
            );
            (m, pass.filter(|_| o.errors > 0))
        }
        _ => ("missing".into(), None),
    };
    Verdict {
        goal: format!(
            "PD mode (1 prefill + 1 decode simulated worker), wasm: req/s at concurrency {conc}"
        ),
        target: format!("{ours} >= {peer} (--pd-disaggregation)"),
        measured,
        pass,
    }
}

/// The goals of the issue, checked against `inputs`.
pub fn verdicts(inputs: &Inputs, profile: &Profile) -> Vec<Verdict> {
    let mut out = Vec::new();
    if let Some(rows) = &inputs.overhead {
        for &b in &profile.overhead.body_bytes {
            overhead_verdicts(rows, b, &mut out);
        }
    }
    if let Some(rows) = inputs.streaming.as_deref().filter(|r| !r.is_empty()) {
        out.push(streaming_verdict(rows));
    }
    if let Some(rows) = inputs.pd.as_deref().filter(|r| !r.is_empty()) {
        out.push(pd_verdict(rows));
    }
    if let Some(rows) = &inputs.quality {
        out.extend(super::quality::verdicts(rows, profile));
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
