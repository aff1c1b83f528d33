//! Per-request traces of scenario 2, for finding out why a policy's
//! percentiles differ from another's: with `SGLANG_BENCH_TRACE_DIR` set,
//! each single-router cell writes one TSV file there, a line per request
//! in schedule order (when it was sent, whose turn it was, the system
//! prompt it shares, what the client saw).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use crate::loadgen::StreamOutcome;
use crate::workload::Scheduled;

/// The environment variable naming the directory the traces go to.
pub const TRACE_DIR_ENV: &str = "SGLANG_BENCH_TRACE_DIR";

/// Writes the trace of one cell when [`TRACE_DIR_ENV`] is set: the file
/// `<shape>-<seed>-<contender>.tsv`. A trace that cannot be written is
/// reported and skipped: it is not the benchmark's result.
pub fn write(
    shape: &str,
    seed: u64,
    contender: &str,
    schedule: &[Scheduled],
    outcomes: &[StreamOutcome],
) {
    let Some(dir) = std::env::var_os(TRACE_DIR_ENV).map(PathBuf::from) else {
        return;
    };
    let name = format!("{shape}-{seed}-{contender}.tsv").replace(' ', "_");
    let path = dir.join(name);
    if let Err(e) = std::fs::write(&path, lines(schedule, outcomes)) {
        eprintln!("cannot write the trace {}: {e}", path.display());
    }
}

/// The TSV text: a header, then one line per request. `group` numbers the
/// distinct first messages (the shared system prompts) in order of first
/// use; `uncached` is the prompt tokens the worker did not hold.
fn lines(schedule: &[Scheduled], outcomes: &[StreamOutcome]) -> String {
    let mut groups: HashMap<String, usize> = HashMap::new();
    let mut out =
        String::from("sent_s\tuser\tturn\tgroup\tttft_ms\tprompt_tokens\tuncached\tfailure\n");
    for (s, o) in schedule.iter().zip(outcomes) {
        let body: serde_json::Value = serde_json::from_slice(&s.body).unwrap_or_default();
        let first = body["messages"][0]["content"].as_str().unwrap_or_default();
        let next = groups.len();
        let group = *groups.entry(first.to_string()).or_insert(next);
        let _ = writeln!(
            out,
            "{:.3}\t{}\t{}\t{}\t{:.1}\t{}\t{}\t{}",
            s.at.as_secs_f64(),
            s.user,
            s.turn,
            group,
            o.ttft_ms.unwrap_or(-1.0),
            o.prompt_tokens,
            o.prompt_tokens.saturating_sub(o.cached_tokens),
            o.failure.as_deref().unwrap_or("")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_line_per_request_with_its_group() {
        let req = |user: usize, system: &str| Scheduled {
            at: Duration::from_millis(1500),
            user,
            turn: 0,
            body: serde_json::json!({"messages": [{"role": "system", "content": system}]})
                .to_string()
                .into_bytes(),
        };
        let schedule = vec![req(1, "a"), req(2, "b"), req(3, "a")];
        let seen = StreamOutcome {
            ttft_ms: Some(12.0),
            prompt_tokens: 100,
            cached_tokens: 60,
            ..Default::default()
        };
        let text = lines(&schedule, &vec![seen; 3]);
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[1], "1.500\t1\t0\t0\t12.0\t100\t40\t");
        assert!(rows[2].starts_with("1.500\t2\t0\t1\t"));
        assert!(
            rows[3].starts_with("1.500\t3\t0\t0\t"),
            "the first group again"
        );
    }
}
