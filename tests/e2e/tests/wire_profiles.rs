//! The SGLang people run today, as the router sees it: the simulator speaks
//! current SGLang by default (`routed_dp_rank`, FastAPI's error bodies, a
//! `/health` that takes time), or the legacy dialect. The PD and DP fields
//! of each profile are checked in `dp.rs`; here, how the router learns a
//! worker's facts and what `--wire-profile` forces.

use std::time::Duration;

use serde_json::Value;
use sglang_envoy_e2e::{SimWorker, Stack, StackOptions};

fn chat(content: &str) -> String {
    serde_json::json!({"model": "m", "max_tokens": 2,
        "messages": [{"role": "user", "content": content}]})
    .to_string()
}

fn dp_stack(worker_args: &[&str], cp_args: &[&str]) -> StackOptions {
    let mut o = StackOptions {
        workers: 1,
        policy: "round_robin".into(),
        cp_args: ["--dp-aware"]
            .iter()
            .chain(cp_args)
            .map(|s| s.to_string())
            .collect(),
        ..Default::default()
    };
    o.worker_args
        .extend(worker_args.iter().map(|s| s.to_string()));
    o
}

async fn bodies(w: &SimWorker) -> Vec<Value> {
    w.requests()
        .await
        .into_iter()
        .filter(|r| r["method"] == "POST")
        .filter_map(|r| serde_json::from_str(r["body"].as_str()?).ok())
        .collect()
}

/// `dp_size` is read from `/server_info` (SGLang 0.5.6 and later; the only
/// route of the newest) or `/get_server_info` (0.5.4 and older).
#[tokio::test]
async fn dp_size_is_read_from_whichever_info_route_the_worker_has() {
    for routes in ["current", "legacy"] {
        let stack = Stack::start(dp_stack(&["--dp-size", "3", "--info-routes", routes], &[]))
            .await
            .unwrap();
        let loads = stack.loads().await;
        assert_eq!(loads.len(), 3, "{routes}: one unit per rank: {loads:?}");
        let r = stack.post("/v1/chat/completions", &chat(routes)).await;
        assert_eq!(r.status(), 200);
    }
}

/// `--wire-profile legacy` forces the legacy fields on a current worker,
/// which still honours `data_parallel_rank` as a deprecated alias (and
/// counts it); `auto` writes the worker's own `routed_dp_rank`.
#[tokio::test]
async fn the_flag_forces_a_profile_and_auto_follows_the_version() {
    for (flag, field) in [("legacy", "data_parallel_rank"), ("auto", "routed_dp_rank")] {
        let stack = Stack::start(dp_stack(&["--dp-size", "2"], &["--wire-profile", flag]))
            .await
            .unwrap();
        for i in 0..4 {
            let r = stack
                .post("/v1/chat/completions", &chat(&format!("{flag} {i}")))
                .await;
            assert_eq!(r.status(), 200);
        }
        let w = &stack.workers[0];
        for body in bodies(w).await {
            assert!(body[field].is_u64(), "{flag}: {body}");
        }
        let deprecated = w.stats().await["deprecated_dp_rank"].as_u64().unwrap_or(0);
        assert_eq!(
            deprecated > 0,
            flag == "legacy",
            "{flag}: deprecated_dp_rank {deprecated}"
        );
    }
}

/// Workers whose `/health` answers 503 while they start and then takes a
/// second, like SGLang's, are admitted and served.
#[tokio::test]
async fn workers_with_sglangs_slow_health_are_admitted() {
    let mut o = StackOptions {
        workers: 2,
        policy: "round_robin".into(),
        ..Default::default()
    };
    o.worker_args.extend(
        ["--health-delay-ms", "1000", "--startup-ms", "1500"]
            .iter()
            .map(|s| s.to_string()),
    );
    let stack = Stack::start(o).await.unwrap();
    let s = &stack;
    let served = sglang_envoy_e2e::wait_until(Duration::from_secs(15), || async move {
        for i in 0..4 {
            if s.post("/v1/chat/completions", &chat(&format!("slow {i}")))
                .await
                .status()
                != 200
            {
                return false;
            }
        }
        true
    })
    .await;
    assert!(
        served,
        "workers with a one-second /health were not admitted"
    );
    for w in &stack.workers {
        assert!(w.served().await > 0, "round robin reached every worker");
    }
}
