//! The replicas scenario in the report: one table per shape (each setup
//! over the seeds, and its ratios to one control plane), the goals of
//! issue 28 for the shared setups, and the splice that puts the section
//! into docs/benchmarks.md without touching the rest.

use std::fmt::Write as _;

use super::goals::mark;
use super::RunInfo;
use crate::params::Profile;
use crate::prom::Histogram;
use crate::replicas::{us, ReplicaRun, ReplicasResults, SETUPS};

/// The section's heading, which the splice looks for.
pub const HEADING: &str = "## Several control planes (replicas)";

/// Hit ratio a shared setup keeps, at least, of one control plane's.
const HIT_GOAL: f64 = 0.95;
/// Decision p99 a shared setup stays within, of one control plane's.
const P99_GOAL: f64 = 1.10;

/// One setup on one shape, over its seeds.
#[derive(Debug, Clone)]
pub(super) struct Agg {
    pub setup: String,
    pub requests: usize,
    pub failed: usize,
    /// Means over the seeds of each run's TTFT percentiles and hit ratio.
    pub p50: f64,
    pub p95: f64,
    pub hit: f64,
    /// Every run's control planes together.
    pub decisions: Histogram,
    /// Their CPU time's, when every run measured it.
    pub cpu: Option<Histogram>,
    /// Each run's decision p99 (all its control planes together), in the
    /// order the seeds ran.
    pub p99_seeds: Vec<Option<f64>>,
    /// Each run's decision CPU p99, likewise; empty unless every run
    /// measured it.
    pub cpu_p99_seeds: Vec<Option<f64>>,
    /// Decisions of the first, second... control plane, summed over runs.
    pub per_replica: Vec<u64>,
    /// Each run's filter VM sessions per control plane, `2/1/1`.
    pub sessions: Vec<String>,
}

/// The setups of `shape`, in [`SETUPS`] order (whatever order
/// they ran in), then any other.
pub(super) fn aggregate(runs: &[ReplicaRun], shape: &str) -> Vec<Agg> {
    let mut names: Vec<&str> = SETUPS.iter().map(|s| s.label).collect();
    for r in runs {
        if !names.contains(&r.setup.as_str()) {
            names.push(&r.setup);
        }
    }
    names
        .into_iter()
        .filter_map(|name| {
            let rs: Vec<&ReplicaRun> = runs
                .iter()
                .filter(|r| r.row.shape == shape && r.setup == name)
                .collect();
            if rs.is_empty() {
                return None;
            }
            let mean =
                |f: fn(&ReplicaRun) -> f64| rs.iter().map(|r| f(r)).sum::<f64>() / rs.len() as f64;
            let width = rs.iter().map(|r| r.per_replica.len()).max().unwrap_or(0);
            Some(Agg {
                setup: name.to_string(),
                requests: rs.iter().map(|r| r.row.requests).sum(),
                failed: rs.iter().map(|r| r.row.failed).sum(),
                p50: mean(|r| r.row.ttft_ms.p50),
                p95: mean(|r| r.row.ttft_ms.p95),
                hit: mean(|r| r.row.cache_hit_ratio),
                decisions: Histogram::merge(rs.iter().map(|r| &r.decisions)),
                cpu: rs
                    .iter()
                    .all(|r| r.cpu.is_some())
                    .then(|| Histogram::merge(rs.iter().filter_map(|r| r.cpu.as_ref()))),
                p99_seeds: rs.iter().map(|r| r.decisions.quantile(0.99)).collect(),
                cpu_p99_seeds: match rs.iter().all(|r| r.cpu.is_some()) {
                    true => rs
                        .iter()
                        .map(|r| r.cpu.as_ref().and_then(|h| h.quantile(0.99)))
                        .collect(),
                    false => Vec::new(),
                },
                per_replica: (0..width)
                    .map(|i| rs.iter().filter_map(|r| r.per_replica.get(i)).sum())
                    .collect(),
                sessions: rs
                    .iter()
                    .map(|r| {
                        let s: Vec<String> = r.sessions.iter().map(u64::to_string).collect();
                        s.join("/")
                    })
                    .collect(),
            })
        })
        .collect()
}

impl Agg {
    /// The decision p99 the goal is judged on: the median seed's (of an
    /// even number, the slower of the middle two). A seed's p99 rests on
    /// its few slowest decisions, so one hiccup of a shared machine moves
    /// it by half (the pooled p99, [`Agg::decisions`], with it); the
    /// median seed's it does not move.
    pub fn p99(&self) -> Option<f64> {
        median_seed(&self.p99_seeds)
    }

    /// The decision CPU p99 of the median seed, as [`Agg::p99`]: what the
    /// goal "sharing adds no work on the request path" is judged on.
    pub fn cpu_p99(&self) -> Option<f64> {
        median_seed(&self.cpu_p99_seeds)
    }
}

/// The median of the seeds' values (of an even number, the larger middle one).
fn median_seed(seeds: &[Option<f64>]) -> Option<f64> {
    let mut seeds: Vec<f64> = seeds.iter().flatten().copied().collect();
    seeds.sort_by(f64::total_cmp);
    seeds.get(seeds.len() / 2).copied()
}

/// `a / b` as `0.97x`, empty when either is missing or `b` is 0.
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => String::new(),
    }
}

/// One goal line of a shared setup against one control plane.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Goal {
    pub shape: String,
    pub setup: String,
    pub goal: String,
    pub measured: String,
    pub pass: Option<bool>,
}

/// The goals of `shape`'s shared setups (every one with a store and the
/// tree shared) against its first setup, one control plane: hit ratio at
/// least [`HIT_GOAL`] of it, decision p99 at most [`P99_GOAL`] of it. The
/// p99 is judged in CPU time where every run measured it ("sharing adds
/// no work on the request path"); the clock's p99, which adds the waits
/// for a core of more processes on a small machine, is then reported
/// beside it, unjudged.
pub(super) fn goals(shape: &str, aggs: &[Agg]) -> Vec<Goal> {
    let Some(one) = aggs.iter().find(|a| a.setup == SETUPS[0].label) else {
        return Vec::new();
    };
    let shared = SETUPS
        .iter()
        .filter(|s| s.fleet_store && s.unshared.is_none());
    let one_p99 = one.p99();
    let mut out = Vec::new();
    for s in shared {
        let Some(a) = aggs.iter().find(|a| a.setup == s.label) else {
            continue;
        };
        let hit = a.hit / one.hit.max(1e-9);
        out.push(Goal {
            shape: shape.into(),
            setup: a.setup.clone(),
            goal: format!("hit ratio >= {HIT_GOAL:.2}x one replica's"),
            measured: format!("{:.3} vs {:.3} = {hit:.2}x", a.hit, one.hit),
            pass: (one.hit > 0.0).then_some(hit >= HIT_GOAL),
        });
        let against = |x: Option<f64>, o: Option<f64>| match (x, o) {
            (Some(x), Some(o)) if o > 0.0 => (
                format!("{} vs {} us = {:.2}x", us(Some(x)), us(Some(o)), x / o),
                Some(x / o <= P99_GOAL),
            ),
            _ => ("no decisions counted".into(), None),
        };
        let (cpu, one_cpu) = (a.cpu_p99(), one.cpu_p99());
        let judged_on_cpu = cpu.is_some() && one_cpu.is_some();
        if judged_on_cpu {
            let (measured, pass) = against(cpu, one_cpu);
            out.push(Goal {
                shape: shape.into(),
                setup: a.setup.clone(),
                goal: format!(
                    "decision p99, CPU time (median seed's) <= {P99_GOAL:.2}x one replica's"
                ),
                measured,
                pass,
            });
        }
        let (measured, pass) = against(a.p99(), one_p99);
        out.push(Goal {
            shape: shape.into(),
            setup: a.setup.clone(),
            goal: match judged_on_cpu {
                true => "decision p99 on the clock (median seed's), reported".into(),
                false => format!("decision p99 (median seed's) <= {P99_GOAL:.2}x one replica's"),
            },
            measured,
            pass: pass.filter(|_| !judged_on_cpu),
        });
    }
    out
}

/// One line per setup with a sharing turned off, against the shared setup
/// with as many control planes: the same processes on the same cores, so
/// what differs is that sharing alone, which a ratio to one control plane
/// mixes with the cost of running more processes on a small machine.
pub(super) fn sharing_alone(aggs: &[Agg]) -> Vec<String> {
    let find = |label: &str| aggs.iter().find(|a| a.setup == label);
    let q = |a: &Agg, p: f64| a.decisions.quantile(p);
    SETUPS
        .iter()
        .filter_map(|unshared| {
            let flag = unshared.unshared?;
            let shared = SETUPS.iter().rfind(|s| {
                s.replicas == unshared.replicas && s.fleet_store && s.unshared.is_none()
            })?;
            let (with, without) = (find(shared.label)?, find(unshared.label)?);
            Some(format!(
                "What `{flag}` turns off (`{}` against `{}`, the same processes): \
                 decision p50 {} vs {} us, p99 {} vs {} us ({}); hit ratio {:.3} vs \
                 {:.3}; TTFT p50 {:.0} vs {:.0} ms, p95 {:.0} vs {:.0} ms.",
                shared.label,
                unshared.label,
                us(q(with, 0.5)),
                us(q(without, 0.5)),
                us(with.p99()),
                us(without.p99()),
                ratio(with.p99(), without.p99()),
                with.hit,
                without.hit,
                with.p50,
                without.p50,
                with.p95,
                without.p95,
            ))
        })
        .collect()
}

/// The section: what ran, a table per shape, the goals.
pub fn render(w: &mut String, results: &ReplicasResults, profile: &Profile, info: &RunInfo) {
    let rp = &profile.replicas;
    let q = &profile.quality;
    let _ = writeln!(w, "{HEADING}\n");
    let project = info
        .versions
        .iter()
        .find(|(k, _)| k == "this project")
        .map_or("unknown", |(_, v)| v.as_str());
    let machine: Vec<String> = info
        .machine
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let _ = writeln!(
        w,
        "*Run of {} ({} profile), this project {project}, `{} --scenarios replicas`; \
         {}. A small shared machine: compare the ratios, not the absolute numbers.*\n",
        info.date,
        info.profile,
        info.command,
        machine.join(", ")
    );
    let _ = writeln!(
        w,
        "Issue 28: several control planes, all active, behind one Envoy. This \
         project's `cost_aware` on scenario 2's shapes {} ({} requests/s of \
         arrivals for {:?}, then up to {:?} of drain), each setup on fresh \
         workers with the same {} seed(s). One Envoy (`envoy/envoy.yaml`, the \
         wasm filter) with `--concurrency {}` in every setup; the \
         `sglang_control_plane` cluster lists every control plane as an \
         endpoint (its outlier detection kept). Each worker thread's filter \
         VM holds its session to the one control plane its thread's round \
         robin picked, a random one, so Envoy is started again (at most {} \
         times) until the VMs' sessions are spread as evenly as they can be \
         (`VM sessions per replica`, each seed's, from \
         `sgl_router_filter_sessions`): otherwise a 3-replica row could run \
         on fewer. Every control plane gets the same `--worker-urls`. `1 replica` \
         is one plain control plane, no Redis; the others share one \
         `redis-server` (started per run, nothing kept on disk) through \
         `--fleet-store-url` with a key prefix of their own, which shares the \
         worker list, the approximate tree's inserts and the requests in \
         flight; `1 replica, store` is one control plane with that store, \
         doing all of the sharing's work with no one to share with (what the \
         store costs a replica's decisions, apart from the others' inserts \
         and processes); `tree not shared` adds `--disable-shared-tree` and \
         `loads not shared` `--disable-shared-loads`, which show what each \
         sharing buys. \
         TTFT and the hit ratio (the workers' cached over prompt tokens) are \
         means over the seeds of each run's; `decision` is the control \
         planes' `sgl_router_decision_duration_seconds` read from each one's \
         `/metrics` at the end of every run, all of a setup's summed bucket \
         by bucket, its quantiles interpolated inside a bucket (as PromQL's \
         `histogram_quantile`). `decision p99` is the median seed's \
         (of an even number, the slower middle one), each seed's p99 taken \
         over all its control planes' decisions (`p99 per seed`, in the \
         order the seeds ran) and `pooled` over every seed's: a seed's p99 \
         rests on its few slowest decisions, so one hiccup of the machine \
         moves it, and the pooled one with it, by half; the goal is judged \
         on the median seed's. `decisions per replica` is each control \
         plane's `_count`, summed over the seeds (in the cluster's order). \
         `CPU` is the same decisions' `sgl_router_decision_cpu_seconds` \
         (every control plane runs with `--decision-cpu-metric`): the \
         deciding thread's CPU time, the decision's own work without the \
         waits for a core that more processes on 2 cores add to the clock. \
         The p99 goal (\"sharing adds no work on the request path\") is \
         judged on the CPU p99 of the median seed; the clock's is reported \
         beside it. Ratios are to `1 replica` on the same shape.\n",
        rp.shapes
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(" and "),
        q.rate,
        q.duration,
        q.drain,
        rp.seeds,
        rp.envoy_concurrency,
        crate::replicas::MAX_ENVOY_STARTS,
    );
    for (setup, why) in &results.skipped {
        let _ = writeln!(w, "Setup `{setup}` left out: {why}.\n");
    }
    let mut shapes: Vec<&str> = Vec::new();
    for r in &results.runs {
        if !shapes.contains(&r.row.shape.as_str()) {
            shapes.push(&r.row.shape);
        }
    }
    let mut all_goals = Vec::new();
    for shape in shapes {
        let aggs = aggregate(&results.runs, shape);
        let _ = writeln!(w, "### {shape}\n");
        let _ = writeln!(
            w,
            "| setup | requests | failed | TTFT p50 ms | TTFT p95 ms | hit ratio | decision p50 us | decision p99 us | p99 per seed us | p99 pooled us | CPU p50 us | CPU p99 us | CPU p99 per seed us | decisions per replica | VM sessions per replica | hit vs 1 | decision p99 vs 1 | CPU p99 vs 1 | TTFT p95 vs 1 |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: |"
        );
        let one = aggs.first().filter(|a| a.setup == SETUPS[0].label);
        for a in &aggs {
            let p99 = a.p99();
            let per: Vec<String> = a.per_replica.iter().map(u64::to_string).collect();
            let seeds: Vec<String> = a.p99_seeds.iter().map(|p| us(*p)).collect();
            let cpu_seeds: Vec<String> = a.cpu_p99_seeds.iter().map(|p| us(*p)).collect();
            let cpu_q = |q: f64| us(a.cpu.as_ref().and_then(|h| h.quantile(q)));
            let _ = writeln!(
                w,
                "| {} | {} | {} | {:.0} | {:.0} | {:.3} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                a.setup,
                a.requests,
                a.failed,
                a.p50,
                a.p95,
                a.hit,
                us(a.decisions.quantile(0.5)),
                us(p99),
                seeds.join(", "),
                us(a.decisions.quantile(0.99)),
                cpu_q(0.5),
                us(a.cpu_p99()),
                cpu_seeds.join(", "),
                per.join(" / "),
                a.sessions.join(", "),
                ratio(Some(a.hit), one.map(|o| o.hit)),
                ratio(p99, one.and_then(Agg::p99)),
                ratio(a.cpu_p99(), one.and_then(Agg::cpu_p99)),
                ratio(Some(a.p95), one.map(|o| o.p95)),
            );
        }
        let _ = writeln!(w);
        for line in sharing_alone(&aggs) {
            let _ = writeln!(w, "{line}\n");
        }
        all_goals.extend(goals(shape, &aggs));
    }
    if !all_goals.is_empty() {
        let _ = writeln!(
            w,
            "| shape | setup | goal | measured | result |\n| --- | --- | --- | --- | --- |"
        );
        for g in &all_goals {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | **{}** |",
                g.shape,
                g.setup,
                g.goal,
                g.measured,
                mark(g.pass)
            );
        }
        let _ = writeln!(w);
    }
}

/// The section of `doc` under [`HEADING`] (to the next `## ` heading or
/// the end), if it has one.
pub fn section(doc: &str) -> Option<&str> {
    let start = doc.find(HEADING)?;
    let after = start + HEADING.len();
    let end = doc[after..]
        .find("\n## ")
        .map_or(doc.len(), |i| after + i + 1);
    Some(&doc[start..end])
}

/// `doc` with its replicas section replaced by `new` (a whole section,
/// heading included), or `new` appended when it has none; a blank line
/// keeps it from the next heading.
pub fn splice(doc: &str, new: &str) -> String {
    let new = new.trim_end();
    match section(doc) {
        Some(old) => {
            let start = doc.find(HEADING).unwrap_or(0);
            let rest = &doc[start + old.len()..];
            let gap = if rest.is_empty() { "\n" } else { "\n\n" };
            format!("{}{new}{gap}{rest}", &doc[..start])
        }
        None => format!("{}\n\n{new}\n", doc.trim_end()),
    }
}

#[cfg(test)]
#[path = "replicas_tests.rs"]
mod tests;
