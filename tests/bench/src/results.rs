//! Scenario 3 results: what `bench-engine` measures (per-decision
//! percentiles, memory) and what the criterion benches wrote.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::stats::Percentiles;

/// Memory of a bare tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TreeMemory {
    /// Tenants (workers) the documents were dealt to.
    pub tenants: u32,
    /// Sum over tenants of the characters each holds (`Tree::tenant_size`).
    pub stored_chars: usize,
    /// Distinct characters (shared prefixes counted once).
    pub unique_chars: usize,
    /// Heap bytes the tree holds.
    pub bytes: usize,
}

/// Per-decision timings of one cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DecisionCell {
    /// Registered workers.
    pub workers: usize,
    /// Prompt size in bytes.
    pub prompt_bytes: usize,
    /// Microseconds per decision, each timed on its own.
    pub us: Percentiles,
}

/// One engine fill.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineFill {
    /// Registered workers.
    pub workers: usize,
    /// Characters routed in (whole documents).
    pub routed_chars: usize,
    /// Heap growth of the engine while filling.
    pub bytes: usize,
    /// Seconds the fill took.
    pub seconds: f64,
}

/// Everything `bench-engine` writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineResults {
    /// Bare-tree memory.
    pub tree: TreeMemory,
    /// Engine fills.
    pub fills: Vec<EngineFill>,
    /// Decision timings.
    pub decisions: Vec<DecisionCell>,
}

/// One criterion benchmark's estimates.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CriterionEstimate {
    /// `group/function/parameter`.
    pub id: String,
    /// Mean time per iteration, ns.
    pub mean_ns: f64,
    /// Median time per iteration, ns.
    pub median_ns: f64,
}

/// Reads every `*/new/{benchmark,estimates}.json` under `dir`
/// (`target/criterion`), sorted by id. Missing or unreadable entries are
/// skipped.
pub fn read_criterion(dir: &Path) -> Vec<CriterionEstimate> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if !path.is_dir() {
                continue;
            }
            if path.file_name().is_some_and(|n| n == "new") {
                if let Some(est) = read_one(&path) {
                    out.push(est);
                }
            } else if path
                .file_name()
                .is_some_and(|n| n != "report" && n != "base")
            {
                stack.push(path);
            }
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

fn read_one(new: &Path) -> Option<CriterionEstimate> {
    let b: Value =
        serde_json::from_str(&std::fs::read_to_string(new.join("benchmark.json")).ok()?).ok()?;
    let e: Value =
        serde_json::from_str(&std::fs::read_to_string(new.join("estimates.json")).ok()?).ok()?;
    Some(CriterionEstimate {
        id: b["full_id"].as_str()?.to_string(),
        mean_ns: e["mean"]["point_estimate"].as_f64()?,
        median_ns: e["median"]["point_estimate"].as_f64()?,
    })
}
