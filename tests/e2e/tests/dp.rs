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
                // The simulator speaks current SGLang: routed_dp_rank.
                let rank = body["routed_dp_rank"].as_u64().expect("rank injected");
                assert!(body.get("data_parallel_rank").is_none(), "{body}");
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

/// The fields of one PD pair's ranks, in the profile the workers speak.
struct PairRanks {
    prefill: u64,
    decode: u64,
}

/// A DP-aware PD fleet whose simulators speak `profile`:
/// the router reads each worker's version and writes its fields; every
/// half runs on the rank the router chose and the decode fetches its KV
/// from the prefill's rank. Returns each pair's ranks as the bodies say.
async fn dp_pd_run(profile: &str) -> Vec<PairRanks> {
    // 2 prefill ranks, 3 decode ranks: round robin pairs every prefill rank
    // with every decode rank, so a decode that ran on its prefill's rank
    // number instead of its own would show.
    let args = |dp: &str| {
        vec![
            "--dp-size".to_string(),
            dp.into(),
            "--wire-profile".into(),
            profile.into(),
        ]
    };
    let mut o = StackOptions {
        policy: "round_robin".into(),
        cp_args: vec!["--dp-aware".into()],
        pd: Some(PdOptions {
            prefill_args: args("2"),
            decode_args: args("3"),
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
        assert_eq!(r.status(), 200, "{profile}: {}", r.text().await.unwrap());
    }
    let (p, d) = (&stack.prefills[0], &stack.decodes[0]);
    let prefill_reqs = posts(p).await;
    let decode_reqs = posts(d).await;
    assert_eq!((prefill_reqs.len(), decode_reqs.len()), (8, 8));
    let mut pairs = Vec::new();
    for (pr, dr) in prefill_reqs.iter().zip(&decode_reqs) {
        let pb: Value = serde_json::from_str(pr["body"].as_str().unwrap()).unwrap();
        let db: Value = serde_json::from_str(dr["body"].as_str().unwrap()).unwrap();
        assert_eq!(pb["bootstrap_room"], db["bootstrap_room"]);
        let ranks = match profile {
            "legacy" => {
                assert!(pb.get("data_parallel_rank_decode").is_none());
                assert!(pb.get("routed_dp_rank").is_none() && db.get("routed_dp_rank").is_none());
                assert_eq!(db["data_parallel_rank"], pb["data_parallel_rank"]);
                PairRanks {
                    prefill: pb["data_parallel_rank"].as_u64().expect("prefill rank"),
                    decode: db["data_parallel_rank_decode"]
                        .as_u64()
                        .expect("decode rank"),
                }
            }
            _ => {
                assert!(
                    pb.get("data_parallel_rank").is_none()
                        && db.get("data_parallel_rank").is_none()
                );
                let prefill = pb["routed_dp_rank"].as_u64().expect("prefill rank");
                assert_eq!(db["disagg_prefill_dp_rank"].as_u64(), Some(prefill), "{db}");
                // The room agrees with the prefill's rank (SGLang's fallback).
                assert_eq!(pb["bootstrap_room"].as_u64().unwrap() % 2, prefill);
                PairRanks {
                    prefill,
                    decode: db["routed_dp_rank"].as_u64().expect("decode rank"),
                }
            }
        };
        assert_eq!(
            pr["dp_rank"].as_u64(),
            Some(ranks.prefill),
            "prefill ran where told"
        );
        assert_eq!(
            dr["dp_rank"].as_u64(),
            Some(ranks.decode),
            "decode ran where told"
        );
        pairs.push(ranks);
    }
    assert_eq!(by_rank(p).await, [4, 4], "round robin over prefill ranks");
    assert_eq!(by_rank(d).await, [3, 3, 2], "round robin over decode ranks");
    // Every decode found its KV (on the prefill rank the body named).
    assert_eq!(p.stats().await["kv_fetched_by_rank"], json!([4, 4]));
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
    pairs
}

#[tokio::test]
async fn dp_aware_pd_tells_prefill_and_decode_their_ranks_in_each_wire_profile() {
    for profile in ["upstream", "legacy"] {
        let pairs = dp_pd_run(profile).await;
        // Decode ranks are chosen independently of prefill ranks: some pair
        // differs, so a decode running on the prefill's rank would show.
        assert!(
            pairs.iter().any(|p| p.prefill != p.decode),
            "{profile}: every pair had equal ranks; the test proves nothing"
        );
    }
}
