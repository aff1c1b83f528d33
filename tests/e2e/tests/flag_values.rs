//! sglang-router's tuning flags given values other than their defaults,
//! through Envoy: each changes what a client or a worker can observe.

use std::time::Duration;

use serde_json::json;
use sglang_envoy_e2e::{expect_openai_error, Stack, StackOptions};

fn generate(text: &str) -> String {
    json!({"text": text, "sampling_params": {"max_new_tokens": 1}}).to_string()
}

async fn stack(workers: usize, policy: &str, cp_args: &[&str]) -> Stack {
    Stack::start(StackOptions {
        workers,
        policy: policy.into(),
        cp_args: cp_args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// The circuit state `/workers` reports for the first worker.
async fn circuit(stack: &Stack) -> String {
    stack.get_json("/workers").await["workers"][0]["circuit"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn retry_flags_set_how_many_attempts_envoy_makes() {
    let stack = stack(
        1,
        "round_robin",
        &[
            "--retry-max-retries",
            "3",
            "--retry-initial-backoff-ms",
            "1",
            "--retry-max-backoff-ms",
            "5",
            "--retry-backoff-multiplier",
            "2",
            "--retry-jitter-factor",
            "0",
            "--cb-failure-threshold",
            "100",
        ],
    )
    .await;
    let worker = &stack.workers[0];
    worker.configure(json!({"fail_status": 503})).await;
    let r = stack.post("/generate", &generate("x")).await;
    assert_eq!(r.status(), 503);
    // Three attempts in all (the default is five).
    assert_eq!(worker.served().await, 3);
}

#[tokio::test]
async fn a_disabled_circuit_breaker_never_spares_a_failing_worker() {
    let stack = stack(
        1,
        "round_robin",
        &["--disable-circuit-breaker", "--disable-retries"],
    )
    .await;
    let worker = &stack.workers[0];
    worker.configure(json!({"fail_status": 500})).await;
    // With the breaker, the eleventh would get the router's 503 instead.
    for _ in 0..15 {
        assert_eq!(stack.post("/generate", &generate("x")).await.status(), 500);
    }
    assert_eq!(worker.served().await, 15);
}

#[tokio::test]
async fn failures_further_apart_than_the_window_do_not_open_the_circuit() {
    let stack = stack(
        1,
        "round_robin",
        &[
            "--disable-retries",
            "--cb-failure-threshold",
            "3",
            "--cb-window-duration-secs",
            "1",
        ],
    )
    .await;
    stack.workers[0]
        .configure(json!({"fail_status": 500}))
        .await;
    for _ in 0..2 {
        assert_eq!(stack.post("/generate", &generate("x")).await.status(), 500);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..2 {
        assert_eq!(stack.post("/generate", &generate("x")).await.status(), 500);
    }
    assert_eq!(
        circuit(&stack).await,
        "closed",
        "the streak was broken by the gap"
    );
    assert_eq!(stack.post("/generate", &generate("x")).await.status(), 500);
    assert_eq!(circuit(&stack).await, "open", "three within the window");
}

#[tokio::test]
async fn cache_threshold_decides_what_counts_as_a_hit() {
    let shared = "s".repeat(1000);
    let longer = format!("{shared}{}", "t".repeat(100));
    for (threshold, hits) in [("0.3", 1.0), ("0.99", 0.0)] {
        let stack = stack(2, "cache_aware", &["--cache-threshold", threshold]).await;
        for text in [&shared, &longer] {
            assert_eq!(stack.post("/generate", &generate(text)).await.status(), 200);
        }
        // The second matches 1000 of its 1100 characters: a hit at 0.3,
        // a miss at 0.99.
        assert_eq!(
            stack.metric("sgl_router_cache_hits_total").await,
            hits,
            "--cache-threshold {threshold}"
        );
    }
}

#[tokio::test]
async fn max_tree_size_evicts_at_the_eviction_interval() {
    let text = "e".repeat(2000);
    let stack = stack(
        2,
        "cache_aware",
        &["--max-tree-size", "100", "--eviction-interval-secs", "1"],
    )
    .await;
    // The same prompt twice: the second is a hit while the tree holds it.
    // An eviction tick (every second) can fall between the two on a loaded
    // machine, so the pair is sent again until one hits.
    let mut pairs = 0;
    while stack.metric("sgl_router_cache_hits_total").await < 1.0 {
        assert!(pairs < 5, "no hit in {pairs} pairs of the same prompt");
        for _ in 0..2 {
            assert_eq!(
                stack.post("/generate", &generate(&text)).await.status(),
                200
            );
        }
        pairs += 1;
    }
    let hits = stack.metric("sgl_router_cache_hits_total").await;
    let misses = stack.metric("sgl_router_cache_misses_total").await;
    // After an eviction the tree holds at most 100 characters: the same
    // prompt matches too little to be a hit.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        stack.post("/generate", &generate(&text)).await.status(),
        200
    );
    assert_eq!(stack.metric("sgl_router_cache_hits_total").await, hits);
    assert_eq!(
        stack.metric("sgl_router_cache_misses_total").await,
        misses + 1.0
    );
}

#[tokio::test]
async fn max_payload_size_holds_whatever_envoys_own_limit() {
    // Envoy's config keeps its default limit (32 MiB): the control plane's
    // flag alone must hold.
    let stack = stack(1, "round_robin", &["--max-payload-size", "100000"]).await;
    let body = |chars: usize| generate(&"p".repeat(chars));
    assert_eq!(stack.post("/generate", &body(50_000)).await.status(), 200);
    let message = expect_openai_error(stack.post("/generate", &body(200_000)).await, 413).await;
    assert!(message.contains("100000"), "{message}");
    // Once the filter has the control plane's worker list, it refuses the
    // body itself; either way nothing reached the worker.
    assert!(
        stack
            .wait_worker_list_fetched(Duration::from_secs(10))
            .await,
        "the filter never fetched the worker list"
    );
    expect_openai_error(stack.post("/generate", &body(200_000)).await, 413).await;
    assert_eq!(stack.workers[0].served().await, 1);
}
