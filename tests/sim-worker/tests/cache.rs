//! The prefix cache, DP ranks, and the prefill timing and queueing model.

mod common;

use std::time::{Duration, Instant};

use common::{fast, start, Sim};
use serde_json::{json, Value};
use sglang_sim_worker::SimConfig;

/// `/generate` with `text` pinned to `rank` (if any), one new token.
async fn generate(sim: &Sim, text: &str, rank: Option<u64>) -> (Value, Duration) {
    let mut body = json!({"text": text, "sampling_params": {"max_new_tokens": 1}});
    if let Some(r) = rank {
        body["data_parallel_rank"] = json!(r);
    }
    let t = Instant::now();
    let (status, v) = sim.post("/generate", body).await;
    assert_eq!(status, 200, "{v}");
    (v["meta_info"].clone(), t.elapsed())
}

#[tokio::test]
async fn shared_prefix_is_reported_cached() {
    let sim = start(SimConfig {
        enable_cache_report: true,
        ..fast()
    })
    .await;
    // 100 tokens of 4 bytes.
    let shared = "abcd".repeat(100);
    let (first, _) = generate(&sim, &format!("{shared}AAAA and more"), None).await;
    assert_eq!(first["cached_tokens"], 0);
    let (second, _) = generate(&sim, &format!("{shared}BBBB other"), None).await;
    assert_eq!(second["prompt_tokens"], 103);
    assert_eq!(second["cached_tokens"], 100);
    // A repeat is a full hit.
    let (third, _) = generate(&sim, &format!("{shared}BBBB other"), None).await;
    assert_eq!(third["cached_tokens"], third["prompt_tokens"]);
    // Chat shares the prefix of its rendered prompt too.
    let chat = |content: &str| {
        json!({"max_tokens": 1, "messages": [
            {"role": "system", "content": shared.clone()},
            {"role": "user", "content": content},
        ]})
    };
    sim.post("/v1/chat/completions", chat("first question"))
        .await;
    let (_, v) = sim
        .post("/v1/chat/completions", chat("second question"))
        .await;
    // "<|system|>\n" + 400 bytes + "\n<|user|>\n" = 421 shared bytes: 105
    // whole tokens.
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(cached, 105, "{v}");
    let stats = sim.stats().await;
    assert_eq!(
        stats["cached_tokens_total"].as_u64().unwrap(),
        100 + 103 + cached
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_prefill_is_faster() {
    let sim = start(SimConfig {
        prefill_us_per_token: 200,
        decode_us_per_token: 0,
        ..SimConfig::default()
    })
    .await;
    // 1500 tokens: 300 ms of prefill uncached.
    let shared = "wxyz".repeat(1500);
    let (first, cold) = generate(&sim, &format!("{shared}1111"), None).await;
    assert_eq!(first["cached_tokens"], 0);
    let (second, warm) = generate(&sim, &format!("{shared}2222"), None).await;
    assert_eq!(second["cached_tokens"], 1500);
    assert!(
        cold >= Duration::from_millis(290),
        "cold prefill took {cold:?}"
    );
    assert!(warm * 3 < cold, "warm {warm:?} vs cold {cold:?}");
}

#[tokio::test]
async fn dp_ranks_have_separate_caches() {
    let sim = start(SimConfig {
        dp_size: 2,
        ..fast()
    })
    .await;
    let text = "0123".repeat(50);
    let (a, _) = generate(&sim, &text, Some(0)).await;
    assert_eq!(a["cached_tokens"], 0);
    let (b, _) = generate(&sim, &text, Some(1)).await;
    assert_eq!(b["cached_tokens"], 0, "rank 1 must not see rank 0's cache");
    let (c, _) = generate(&sim, &text, Some(0)).await;
    assert_eq!(c["cached_tokens"], 50);
    let (d, _) = generate(&sim, &text, Some(1)).await;
    assert_eq!(d["cached_tokens"], 50);
    assert_eq!(sim.stats().await["by_rank"], json!([2, 2]));
    assert_eq!(sim.ranks_run().await, [0, 1, 0, 1]);

    // Unpinned (and out-of-range) requests alternate between ranks.
    generate(&sim, "q", None).await;
    generate(&sim, "q", Some(9)).await;
    assert_eq!(sim.stats().await["by_rank"], json!([3, 3]));
}

#[tokio::test]
async fn cache_evicts_least_recently_used() {
    let sim = start(SimConfig {
        cache_tokens: 150,
        ..fast()
    })
    .await;
    let a = "aaaa".repeat(100);
    let b = "bbbb".repeat(100);
    generate(&sim, &a, None).await;
    generate(&sim, &b, None).await;
    // 200 tokens do not fit in 150: the tail of `a` went first.
    let (again, _) = generate(&sim, &a, None).await;
    assert_eq!(again["cached_tokens"], 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefills_queue_per_rank() {
    let sim = start(SimConfig {
        prefill_us_per_token: 400,
        decode_us_per_token: 0,
        max_running_prefills: 1,
        ..SimConfig::default()
    })
    .await;
    // Two distinct 250-token prompts: 100 ms of prefill each, one at a time.
    let (p1, p2) = ("1234".repeat(250), "5678".repeat(250));
    let t = Instant::now();
    let load = async {
        tokio::time::sleep(Duration::from_millis(40)).await;
        sim.get("/get_load").await.1
    };
    let ((_, d1), (_, d2), load) =
        tokio::join!(generate(&sim, &p1, None), generate(&sim, &p2, None), load,);
    let total = t.elapsed();
    assert!(total >= Duration::from_millis(195), "{total:?}");
    assert!(d1.max(d2) >= Duration::from_millis(195));
    assert_eq!(load[0]["num_reqs"], 2, "{load}");
    assert_eq!(load[0]["num_waiting_reqs"], 1, "{load}");
    assert_eq!(load[0]["num_tokens"], 2 * 251, "{load}");
    assert!(sim.idle().await);

    // With two slots they run side by side: 250 ms each here, so one after
    // the other would take at least 500 ms (wide margin for a busy machine).
    let sim = start(SimConfig {
        prefill_us_per_token: 1000,
        decode_us_per_token: 0,
        max_running_prefills: 2,
        ..SimConfig::default()
    })
    .await;
    let t = Instant::now();
    tokio::join!(generate(&sim, &p1, None), generate(&sim, &p2, None),);
    let total = t.elapsed();
    assert!(total >= Duration::from_millis(245), "{total:?}");
    assert!(total < Duration::from_millis(450), "{total:?}");
}

/// Like SGLang, OpenAI answers report cached tokens only with
/// `--enable-cache-report` (off by default); `meta_info` always has them.
#[tokio::test]
async fn cached_tokens_reach_openai_usage_only_with_the_cache_report() {
    let sim = start(fast()).await;
    let body =
        json!({"max_tokens": 1, "messages": [{"role": "user", "content": "abcd".repeat(50)}]});
    sim.post("/v1/chat/completions", body.clone()).await;
    let (_, v) = sim.post("/v1/chat/completions", body).await;
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{v}");
    assert!(
        v["usage"]["prompt_tokens_details"].is_null(),
        "cached tokens reported without --enable-cache-report: {v}"
    );
    generate(&sim, &"efgh".repeat(50), None).await;
    let (meta, _) = generate(&sim, &"efgh".repeat(50), None).await;
    assert!(meta["cached_tokens"].as_u64().unwrap() > 0);
}
