//! Scenario 2 in the report: the matrix table (mean and spread over seeds
//! of each shape and contender, in-sample and held-out seeds side by side)
//! and the goals of `cost_aware` per shape, once on the in-sample seeds and
//! once on the held-out ones.

use std::fmt::Write as _;

use super::goals::{mark, Verdict};
use crate::params::{quality_rivals, Contender, Profile, QUALITY_OURS};
use crate::quality::QualityRow;
use crate::shapes::{self, Shape};

/// Which seeds of scenario 2 a cell or a goal reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seeds {
    /// [`crate::params::QUALITY_SEEDS`], the ones `cost_aware` was tuned on.
    InSample,
    /// [`crate::params::QUALITY_HELD_OUT_SEEDS`], never used while tuning.
    HeldOut,
}

impl Seeds {
    fn holds(self, r: &QualityRow) -> bool {
        r.held_out == (self == Seeds::HeldOut)
    }

    fn name(self) -> &'static str {
        match self {
            Seeds::InSample => "in-sample seeds",
            Seeds::HeldOut => "held-out seeds",
        }
    }
}

/// One shape and contender over every seed of one kind.
#[derive(Debug, Clone)]
pub(super) struct Cell {
    pub contender: String,
    pub p50: Spread,
    pub p95: Spread,
    pub hit: Spread,
    pub max_min: Spread,
    pub busy: Spread,
    pub failed: usize,
    pub requests: usize,
    pub first_failure: Option<String>,
}

/// Mean, smallest and largest of one number over the seeds.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    fn of(values: impl Iterator<Item = f64>) -> Spread {
        let v: Vec<f64> = values.collect();
        if v.is_empty() {
            return Spread::default();
        }
        Spread {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }

    fn ms(&self) -> String {
        format!("{:.0} ({:.0}-{:.0})", self.mean, self.min, self.max)
    }

    fn ratio(&self) -> String {
        format!("{:.3} ({:.3}-{:.3})", self.mean, self.min, self.max)
    }
}

/// The contenders of `shape`, in the order they first appear (any seeds).
fn contenders<'a>(rows: &'a [QualityRow], shape: &str) -> Vec<&'a str> {
    let mut names: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.shape == shape) {
        if !names.contains(&r.contender.as_str()) {
            names.push(&r.contender);
        }
    }
    names
}

/// The cells of `shape` over `seeds`, in the order contenders first appear;
/// a contender with no row on those seeds has no cell.
pub(super) fn cells(rows: &[QualityRow], shape: &str, seeds: Seeds) -> Vec<Cell> {
    contenders(rows, shape)
        .into_iter()
        .filter_map(|name| {
            let rs: Vec<&QualityRow> = rows
                .iter()
                .filter(|r| r.shape == shape && r.contender == name && seeds.holds(r))
                .collect();
            if rs.is_empty() {
                return None;
            }
            Some(Cell {
                contender: name.to_string(),
                p50: Spread::of(rs.iter().map(|r| r.ttft_ms.p50)),
                p95: Spread::of(rs.iter().map(|r| r.ttft_ms.p95)),
                hit: Spread::of(rs.iter().map(|r| r.cache_hit_ratio)),
                max_min: Spread::of(rs.iter().map(|r| r.max_min)),
                busy: Spread::of(rs.iter().map(|r| r.busy)),
                failed: rs.iter().map(|r| r.failed).sum(),
                requests: rs.iter().map(|r| r.requests).sum(),
                first_failure: rs.iter().find_map(|r| r.first_failure.clone()),
            })
        })
        .collect()
}

/// The goal of one shape on `seeds` (`cells` are of those seeds only):
/// `cost_aware`'s TTFT p50 and p95 (means over the seeds) at most the best
/// of the peer's policies, p95 at most 0.8x the peer's `cache_aware` where
/// prompts are shared, hit ratio at least the peer `cache_aware`'s minus
/// 0.01, and none of its requests failed. The same rules for both kinds of
/// seeds; on held-out seeds the best peer policy is the best of those that
/// ran them.
pub(super) fn verdict(shape: &Shape, cells: &[Cell], seeds: Seeds) -> Verdict {
    let ours = QUALITY_OURS.label();
    let peer_ca = Contender::peer("cache_aware").label();
    let best_peer = match seeds {
        Seeds::InSample => "the best peer policy's",
        Seeds::HeldOut => "the best peer policy's (of those run on held-out seeds)",
    };
    let target = if shape.shared {
        format!("cost_aware TTFT p50 and p95 <= {best_peer}, p95 <= 0.8x peer cache_aware, hit >= peer cache_aware's - 0.01, no request failed")
    } else {
        format!("cost_aware TTFT p50 and p95 <= {best_peer}, hit >= peer cache_aware's - 0.01, no request failed")
    };
    let goal = format!("Quality, {}, {}", shape.name, seeds.name());
    let find = |label: &str| cells.iter().find(|c| c.contender == label);
    let rivals: Vec<&Cell> = quality_rivals().filter_map(|c| find(&c.label())).collect();
    let (Some(us), Some(ca)) = (find(&ours), find(&peer_ca)) else {
        return Verdict {
            goal,
            target,
            measured: "cost_aware or peer cache_aware missing".into(),
            pass: None,
        };
    };
    let best = |f: fn(&Cell) -> f64| {
        rivals
            .iter()
            .min_by(|a, b| f(a).total_cmp(&f(b)))
            .map(|c| (f(c), short(&c.contender)))
            .unwrap_or((f64::INFINITY, String::new()))
    };
    let (b50, w50) = best(|c| c.p50.mean);
    let (b95, w95) = best(|c| c.p95.mean);
    let ok50 = us.p50.mean <= b50;
    let ok95 = us.p95.mean <= b95;
    let vs_ca = us.p95.mean / ca.p95.mean.max(1e-9);
    let ok_ca = !shape.shared || vs_ca <= 0.8;
    let ok_hit = us.hit.mean >= ca.hit.mean - 0.01;
    // Its own failures fail the goal; a rival's count against the rival
    // (their waits are in its percentiles) and are shown in the table.
    let failed = us.failed;
    let ok_failed = failed == 0;
    let mut measured = format!(
        "p50 {:.0} vs {:.0} ({w50}) {}; p95 {:.0} vs {:.0} ({w95}) {}",
        us.p50.mean,
        b50,
        mark(Some(ok50)),
        us.p95.mean,
        b95,
        mark(Some(ok95)),
    );
    if shape.shared {
        let _ = write!(measured, "; {vs_ca:.2}x cache_aware {}", mark(Some(ok_ca)));
    }
    let _ = write!(
        measured,
        "; hit {:.3} vs {:.3} {}; failed {failed} {}",
        us.hit.mean,
        ca.hit.mean,
        mark(Some(ok_hit)),
        mark(Some(ok_failed))
    );
    Verdict {
        goal,
        target,
        measured,
        pass: Some(ok50 && ok95 && ok_ca && ok_hit && ok_failed),
    }
}

/// `peer round_robin` -> `round_robin` (sglang-router's, the first peer);
/// `smg round_robin` stays.
fn short(label: &str) -> String {
    label.strip_prefix("peer ").unwrap_or(label).to_string()
}

/// The goals of every shape that ran: on its in-sample seeds, then on its
/// held-out seeds (when the profile runs some or rows of them are there;
/// n/a when they are missing).
pub(super) fn verdicts(rows: &[QualityRow], profile: &Profile) -> Vec<Verdict> {
    let mut out = Vec::new();
    for s in shapes::matrix(&profile.quality)
        .iter()
        .filter(|s| rows.iter().any(|r| r.shape == s.name))
    {
        out.push(verdict(
            s,
            &cells(rows, s.name, Seeds::InSample),
            Seeds::InSample,
        ));
        let any_held_out = rows.iter().any(|r| r.shape == s.name && r.held_out);
        if profile.quality.held_out_seeds > 0 || any_held_out {
            out.push(verdict(
                s,
                &cells(rows, s.name, Seeds::HeldOut),
                Seeds::HeldOut,
            ));
        }
    }
    out
}

/// The section of the report.
pub(super) fn render(w: &mut String, rows: &[QualityRow], profile: &Profile) {
    let q = &profile.quality;
    let _ = writeln!(w, "## Scenario 2: routing quality\n");
    let _ = writeln!(
        w,
        "A matrix of workload shapes, each run by every contender with {} seed(s) \
         (workload text, users and arrivals change with the seed), each run on \
         freshly started simulated workers. Each cell shows the mean over the \
         seeds and, in brackets, the smallest and largest.\n\n\
         `cost_aware` and its parameters were tuned on these seeds (in-sample). \
         Each shape then runs {} held-out seed(s), never used while tuning, \
         with fewer contenders: `ours cost_aware`, the peer's `cache_aware` and \
         `round_robin`, and any other peer policy with the best in-sample mean \
         TTFT p50 or p95 in that shape. The `held-out` columns show those runs \
         (empty: the contender did not run them; `max/min` and `busy` are \
         in-sample only), and each shape has a goal on each kind of seeds.\n\n\
         The base shape (\"many groups\"): {} simulated workers, {} us per uncached \
         prompt token (4 characters per token), {} us per generated token, a \
         {}-token prefix cache with LRU eviction. Multi-turn chat: {} system \
         prompts of {} characters, each shared by a group of users; {} users in \
         conversation at a time, {} turns each (user messages of {}-{} \
         characters, answers of {} kept in the history), at least {:?} between a \
         user's turns, new users replacing finished ones. Poisson arrivals at \
         {}/s for {:?}, streamed with usage; requests still running {:?} after \
         the last arrival are cut.\n\n\
         What the simulator assumes, and so every number here: a worker runs \
         one prefill at a time (except in \"4 prefills\"), prefill time is linear \
         in the uncached tokens (no chunked prefill, no batching gain), decoding \
         has no concurrency limit (so TTFT is prefill queueing plus prefill), and \
         the cache is matched when a prefill starts.\n\n\
         TTFT is the first streamed chunk with content, as the client sees it; a \
         failed request (no answer, non-2xx, an error event, no `[DONE]`, cut at \
         the end) counts with its wait and in `failed`. `hit` is cached / prompt \
         tokens from the counters of the workers that prefill; `busy` is the \
         prefill work they were given over the arrival period, per prefill lane; \
         `max/min` is over requests per prefilling worker.\n",
        q.seeds,
        q.held_out_seeds,
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
    let _ = writeln!(w, "| shape | what changes |\n| --- | --- |");
    for s in shapes::matrix(q) {
        let _ = writeln!(w, "| {} | {} |", s.name, s.what);
    }
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "| shape | contender | TTFT p50 ms | TTFT p95 ms | hit | max/min | busy | failed \
         | held-out TTFT p50 ms | held-out TTFT p95 ms | held-out hit | held-out failed |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for s in shapes::matrix(q) {
        let in_sample = cells(rows, s.name, Seeds::InSample);
        let held_out = cells(rows, s.name, Seeds::HeldOut);
        for name in contenders(rows, s.name) {
            let ins = find(&in_sample, name).map_or_else(
                || " |  |  |  |  | ".to_string(),
                |c| {
                    format!(
                        "{} | {} | {} | {:.2} | {:.0}% | {}",
                        c.p50.ms(),
                        c.p95.ms(),
                        c.hit.ratio(),
                        c.max_min.mean,
                        c.busy.mean * 100.0,
                        failed(c)
                    )
                },
            );
            let out = find(&held_out, name).map_or_else(
                || " |  |  | ".to_string(),
                |c| {
                    format!(
                        "{} | {} | {} | {}",
                        c.p50.ms(),
                        c.p95.ms(),
                        c.hit.ratio(),
                        failed(c)
                    )
                },
            );
            let _ = writeln!(w, "| {} | {name} | {ins} | {out} |", s.name);
        }
    }
    let _ = writeln!(w);
}

/// The cell of contender `name` in `cells`.
fn find<'a>(cells: &'a [Cell], name: &str) -> Option<&'a Cell> {
    cells.iter().find(|c| c.contender == name)
}

/// `failed/requests`, with the first failure's reason.
fn failed(c: &Cell) -> String {
    format!(
        "{}/{}{}",
        c.failed,
        c.requests,
        c.first_failure
            .as_deref()
            .map_or(String::new(), |f| format!(" ({})", f.replace('|', "\\|")))
    )
}
