//! smg's `consistent_hashing`, `prefix_hash` and `least_load` policies
//! through a real Envoy: what a client sees of each (which worker a
//! request reaches), with either front door.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::json;
use sglang_envoy_e2e::{wait_until, Stack, StackOptions};

async fn stack(policy: &str, cp_args: &[&str]) -> Stack {
    Stack::start(StackOptions {
        workers: 3,
        policy: policy.into(),
        cp_args: cp_args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    })
    .await
    .expect("the stack starts")
}

fn chat(content: &str) -> String {
    json!({
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "system", "content": content}],
    })
    .to_string()
}

/// POSTs a chat completion, with `key` as `X-SMG-Routing-Key` if given.
async fn send(stack: &Stack, content: &str, key: Option<&str>) {
    // A request that reaches a stalled worker must fail the test, not hang it.
    let mut r = reqwest::Client::new()
        .post(stack.url("/v1/chat/completions"))
        .timeout(Duration::from_secs(20))
        .header("content-type", "application/json")
        .body(chat(content));
    if let Some(key) = key {
        r = r.header("X-SMG-Routing-Key", key);
    }
    let r = r.send().await.expect("Envoy answers");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
}

/// Inference requests each worker received so far.
async fn served(stack: &Stack) -> Vec<u64> {
    let mut out = Vec::new();
    for w in &stack.workers {
        out.push(w.served().await);
    }
    out
}

/// The one worker that received the requests `run` sends (panics when
/// they were split).
async fn one_worker<F: std::future::Future<Output = ()>>(stack: &Stack, run: F) -> usize {
    let before = served(stack).await;
    run.await;
    let after = served(stack).await;
    let gained: Vec<usize> = (0..after.len()).filter(|&i| after[i] > before[i]).collect();
    assert_eq!(
        gained.len(),
        1,
        "split over workers: {before:?} -> {after:?}"
    );
    gained[0]
}

/// `n` characters that differ from one `seed` to the next from the first.
fn text(seed: usize, n: usize) -> String {
    (0..n)
        .map(|i| (b'a' + ((i * 7 + seed * 11) % 26) as u8) as char)
        .collect()
}

#[tokio::test]
async fn consistent_hashing_keeps_a_key_on_one_worker_and_spreads_keys() {
    let stack = stack("consistent_hashing", &[]).await;
    // Each key lands on a worker at random (rendezvous hashing of ports
    // that change every run): with 12 keys, one of 3 workers got none in
    // about 2% of runs (3 x (2/3)^12); with 30, in 1 run of 60000.
    const KEYS: usize = 30;
    let mut homes = BTreeSet::new();
    for k in 0..KEYS {
        let key = format!("user-{k}");
        let home = one_worker(&stack, async {
            for q in 0..4 {
                // Different texts: only the key decides.
                send(&stack, &format!("question {q} of {key}"), Some(&key)).await;
            }
        })
        .await;
        homes.insert(home);
    }
    assert_eq!(homes.len(), 3, "{KEYS} keys all went to workers {homes:?}");

    // The same keys again, interleaved: still on their workers.
    let mut first: BTreeMap<usize, usize> = BTreeMap::new();
    for round in 0..2 {
        for k in 0..KEYS {
            let key = format!("user-{k}");
            let w = one_worker(&stack, send(&stack, "again", Some(&key))).await;
            if round == 0 {
                first.insert(k, w);
            } else {
                assert_eq!(first[&k], w, "{key} moved");
            }
        }
    }

    // Without a key: spread, not stuck on one worker.
    let before = served(&stack).await;
    for _ in 0..30 {
        send(&stack, "the same text every time", None).await;
    }
    let after = served(&stack).await;
    assert!(
        (0..3).all(|i| after[i] > before[i]),
        "30 keyless requests left a worker idle: {before:?} -> {after:?}"
    );
}

#[tokio::test]
async fn prefix_hash_keeps_a_shared_prefix_on_one_worker_and_spreads_prefixes() {
    let stack = stack("prefix_hash", &[]).await;
    let mut homes = BTreeSet::new();
    // Each head lands on a worker at random (rendezvous hashing of ports
    // that change every run): with 12 heads, one of 3 workers got none in
    // about 2% of runs (3 x (2/3)^12); with 30, in 1 run of 60000.
    for p in 0..30 {
        // A 2 KB system prompt (more than the 256 tokens × 4 bytes hashed),
        // then a different question each time.
        let prefix = format!("{p} {}", text(p, 2048));
        let home = one_worker(&stack, async {
            for q in 0..4 {
                send(
                    &stack,
                    &format!("{prefix} question {q} {}", text(q, q * 40)),
                    None,
                )
                .await;
            }
        })
        .await;
        homes.insert(home);
    }
    assert_eq!(homes.len(), 3, "30 prefixes all went to workers {homes:?}");
}

#[tokio::test]
async fn least_load_sends_new_requests_past_a_worker_holding_requests() {
    // No health check during the test: a stalled worker's /health hangs
    // too, and the test is about loads, not health.
    let stack = stack("least_load", &["--health-check-interval-secs", "60"]).await;
    let load_of = |loads: &[(String, u64)], w: usize| {
        loads
            .iter()
            .find(|(url, _)| *url == stack.workers[w].url)
            .map_or(u64::MAX, |(_, l)| *l)
    };
    for w in &stack.workers {
        w.configure(json!({"stall": true})).await;
    }
    // Six requests, one at a time, each held by its worker: least_load
    // fills the workers evenly.
    let mut held = Vec::new();
    for i in 0..6u64 {
        let url = stack.url("/v1/chat/completions");
        held.push(tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .header("content-type", "application/json")
                .body(chat(&format!("held {i}")))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
        let counted = wait_until(Duration::from_secs(10), || async {
            stack.loads().await.iter().map(|(_, l)| *l).sum::<u64>() == i + 1
        })
        .await;
        assert!(
            counted,
            "request {i} not counted: {:?}",
            stack.loads().await
        );
    }
    let loads = stack.loads().await;
    assert!(
        (0..3).all(|w| load_of(&loads, w) == 2),
        "6 requests on 3 workers: {loads:?}"
    );

    // Workers 1 and 2 finish theirs; worker 0 still holds two.
    for w in &stack.workers[1..] {
        w.configure(json!({"stall": false})).await;
    }
    let drained = wait_until(Duration::from_secs(10), || async {
        let loads = stack.loads().await;
        load_of(&loads, 0) == 2 && load_of(&loads, 1) == 0 && load_of(&loads, 2) == 0
    })
    .await;
    assert!(drained, "{:?}", stack.loads().await);

    let before = served(&stack).await;
    for i in 0..20 {
        send(&stack, &format!("new {i}"), None).await;
    }
    let after = served(&stack).await;
    assert_eq!(after[0], before[0], "the busy worker got new requests");
    assert!(
        after[1] > before[1] && after[2] > before[2],
        "the two idle workers should share: {before:?} -> {after:?}"
    );

    stack.workers[0].configure(json!({"stall": false})).await;
    for h in held {
        assert_eq!(h.await.unwrap().ok(), Some(200), "a held request failed");
    }
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}
