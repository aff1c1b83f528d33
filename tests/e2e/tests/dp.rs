//! DP-aware routing: each data-parallel rank of a worker is its own routing
//! unit (own load, own cache tree), and the router tells the worker which
//! rank to run on.

use std::time::Duration;

use serde_json::{json, Value};
use sglang_envoy_e2e::{PdOptions, SimWorker, Stack, StackOptions};

fn dp_options(workers: usize, dp: usize, policy: &str) -> StackOptions {
    let mut o = StackOptions {
        workers,
        policy: policy.into(),
        cp_args: vec!["--dp-aware".into()],
        ..Default::default()
    };
    o.worker_args
        .extend(["--dp-size".to_string(), dp.to_string()]);
    o
}

fn chat(content: &str) -> String {
    json!({"model": "m", "max_tokens": 2, "messages": [{"role": "system", "content": content}]})
        .to_string()
}

/// The inference requests a worker received (not probes or info GETs).
async fn posts(w: &SimWorker) -> Vec<Value> {
    w.requests()
        .await
        .into_iter()
        .filter(|r| r["method"] == "POST")
        .collect()
}

async fn by_rank(w: &SimWorker) -> Vec<u64> {
    w.stats().await["by_rank"]
        .as_array()
        .map(|a| a.iter().map(|n| n.as_u64().unwrap_or(0)).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn every_rank_of_every_worker_gets_distinct_prompts_and_is_told_its_rank() {
    for policy in ["cache_aware", "round_robin", "power_of_two"] {
        let stack = Stack::start(dp_options(2, 2, policy)).await.unwrap();
        let loads = stack.loads().await;
        assert_eq!(loads.len(), 4, "{policy}: 2 workers x 2 ranks: {loads:?}");
        assert!(loads
            .iter()
            .all(|(u, _)| u.ends_with("@0") || u.ends_with("@1")));
        // 64: through the ext_proc front door each load is released the
        // moment its request ends, so sequential power_of_two picks are
        // uniformly random; 32 left a rank under 3 requests ~3% of runs.
        for i in 0..64 {
            let prompt = format!("{i:03} distinct {}", "y".repeat(i * 7 % 40));
            let r = stack.post("/v1/chat/completions", &chat(&prompt)).await;
            assert_eq!(r.status(), 200);
        }
        for w in &stack.workers {
            let ranks = by_rank(w).await;
            assert_eq!(ranks.len(), 2);
            assert!(
                ranks.iter().all(|&n| n >= 3),
                "{policy}: a rank left idle: {ranks:?}"
            );
            for req in posts(w).await {
                let body: Value = serde_json::from_str(req["body"].as_str().unwrap()).unwrap();
                let rank = body["data_parallel_rank"].as_u64().expect("rank injected");
                assert_eq!(req["dp_rank"].as_u64(), Some(rank), "ran where told");
            }
        }
        assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
    }
}

#[tokio::test]
async fn shared_prefix_traffic_sticks_to_one_rank() {
    let stack = Stack::start(dp_options(2, 4, "cache_aware")).await.unwrap();
    let prefix: String = (0..2048)
        .map(|i| (b'a' + (i * 11 % 26) as u8) as char)
        .collect();
    for i in 0..12 {
        let r = stack
            .post(
                "/v1/chat/completions",
                &chat(&format!("{prefix} question {i}")),
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    let mut used = Vec::new();
    for (wi, w) in stack.workers.iter().enumerate() {
        for (rank, n) in by_rank(w).await.into_iter().enumerate() {
            if n > 0 {
                used.push((wi, rank, n));
            }
        }
    }
    assert_eq!(
        used.len(),
        1,
        "one (worker, rank) holds the prefix: {used:?}"
    );
    assert_eq!(used[0].2, 12);
}

#[tokio::test]
async fn dp_aware_pd_tells_prefill_and_decode_their_ranks() {
    let mut o = StackOptions {
        policy: "round_robin".into(),
        cp_args: vec!["--dp-aware".into()],
        pd: Some(PdOptions {
            prefill_args: vec!["--dp-size".into(), "2".into()],
            decode_args: vec!["--dp-size".into(), "2".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    o.worker_args.clear();
    let stack = Stack::start(o).await.unwrap();
    for i in 0..8 {
        let r = stack
            .post("/v1/chat/completions", &chat(&format!("pd dp {i}")))
            .await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    let (p, d) = (&stack.prefills[0], &stack.decodes[0]);
    let prefill_reqs = posts(p).await;
    let decode_reqs = posts(d).await;
    assert_eq!((prefill_reqs.len(), decode_reqs.len()), (8, 8));
    for (pr, dr) in prefill_reqs.iter().zip(&decode_reqs) {
        let pb: Value = serde_json::from_str(pr["body"].as_str().unwrap()).unwrap();
        let db: Value = serde_json::from_str(dr["body"].as_str().unwrap()).unwrap();
        let prank = pb["data_parallel_rank"].as_u64().expect("prefill rank");
        assert_eq!(pr["dp_rank"].as_u64(), Some(prank));
        assert!(pb.get("data_parallel_rank_decode").is_none());
        let drank = db["data_parallel_rank_decode"]
            .as_u64()
            .expect("decode rank");
        assert_eq!(dr["dp_rank"].as_u64(), Some(drank), "decode ran where told");
    }
    assert_eq!(by_rank(p).await, [4, 4], "round robin over prefill ranks");
    assert!(by_rank(d).await.iter().all(|&n| n == 4));
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}
