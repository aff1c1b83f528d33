//! sglang-router's `manual` policy through a real Envoy: requests carrying
//! the same `X-SMG-Routing-Key` reach the same worker, different keys
//! spread, a dead worker's keys move to another worker and stay there, and
//! requests without the header spread at random.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use sglang_envoy_e2e::{Stack, StackOptions};

const BODY: &str = r#"{"model":"m","prompt":"hi","max_tokens":1}"#;

async fn manual_stack(workers: usize) -> Stack {
    Stack::start(StackOptions {
        workers,
        policy: "manual".into(),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// POSTs a completion with `key` as routing key (none when `None`).
async fn send(stack: &Stack, key: Option<&str>) {
    let mut r = reqwest::Client::new()
        .post(stack.url("/v1/completions"))
        .header("content-type", "application/json")
        .body(BODY);
    if let Some(key) = key {
        r = r.header("X-SMG-Routing-Key", key);
    }
    let r = r.send().await.expect("Envoy answers");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
}

/// For each routing key the workers received (`""` for none): the indexes
/// of the workers that got it, and how many requests in all.
async fn where_keys_went(stack: &Stack) -> BTreeMap<String, (BTreeSet<usize>, usize)> {
    let mut out: BTreeMap<String, (BTreeSet<usize>, usize)> = BTreeMap::new();
    for (i, w) in stack.workers.iter().enumerate() {
        for r in w.requests().await {
            if r["path"] != "/v1/completions" {
                continue;
            }
            let key = r["headers"]["x-smg-routing-key"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let entry = out.entry(key).or_default();
            entry.0.insert(i);
            entry.1 += 1;
        }
    }
    out
}

/// New keys get a worker at random (the default assignment): all landing
/// on one of 3 happens 3 * (1/3)^16 of the time, under 1 in 10 million
/// (with 8 keys it was 1 in 2200).
const KEYS: usize = 16;

#[tokio::test]
async fn same_key_same_worker_and_keys_spread() {
    let stack = manual_stack(3).await;
    for k in 0..KEYS {
        for _ in 0..5 {
            send(&stack, Some(&format!("user-{k}"))).await;
        }
    }
    let seen = where_keys_went(&stack).await;
    let mut homes = BTreeSet::new();
    for k in 0..KEYS {
        let (workers, n) = &seen[&format!("user-{k}")];
        assert_eq!(*n, 5, "user-{k}: every request arrives once");
        assert_eq!(workers.len(), 1, "user-{k} was split over {workers:?}");
        homes.extend(workers.iter().copied());
    }
    assert!(homes.len() >= 2, "{KEYS} keys all went to worker {homes:?}");
}

#[tokio::test]
async fn without_a_key_requests_spread() {
    let stack = manual_stack(3).await;
    for _ in 0..30 {
        send(&stack, None).await;
    }
    let seen = where_keys_went(&stack).await;
    let (workers, n) = &seen[""];
    assert_eq!(*n, 30);
    assert_eq!(
        workers.len(),
        3,
        "30 requests without a key left a worker idle"
    );
}

#[tokio::test]
async fn a_dead_workers_keys_move_to_one_other_worker() {
    let mut stack = manual_stack(3).await;
    send(&stack, Some("chat-42")).await;
    let home = *where_keys_went(&stack).await["chat-42"]
        .0
        .first()
        .expect("the key arrived somewhere");
    let dead = stack.workers[home].url.clone();
    stack.workers[home].kill();

    // The first requests find the worker dead: Envoy retries them on the
    // fallback endpoints, and the control plane takes the worker out.
    send(&stack, Some("chat-42")).await;
    let noticed = stack
        .wait_marked(&dead, false, Duration::from_secs(10))
        .await;
    assert!(noticed, "the dead worker is still marked healthy");

    let before: Vec<u64> = futures::future::join_all(
        stack
            .workers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != home)
            .map(|(_, w)| w.served()),
    )
    .await;
    for _ in 0..8 {
        send(&stack, Some("chat-42")).await;
    }
    let after: Vec<u64> = futures::future::join_all(
        stack
            .workers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != home)
            .map(|(_, w)| w.served()),
    )
    .await;
    let gained: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(
        gained.contains(&8) && gained.contains(&0),
        "the key's 8 requests must all reach one live worker: {gained:?}"
    );
}
