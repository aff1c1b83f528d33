//! SGLang's KV events through the whole stack: simulated workers started
//! with `--kv-events-config` publish their caches' changes as SGLang 0.5.23
//! does; the control plane finds each publisher in the worker's
//! `/server_info`, subscribes, and `/workers` shows what each worker holds:
//! the blocks a request routed through Envoy stored, a dropped batch
//! filled in by replay, and a restarted worker's state reset.

use std::time::Duration;

use serde_json::{json, Value};
use sglang_envoy_e2e::{wait_until, SimWorker, Stack, StackOptions};

/// Publishers on free ports (the simulator's port 0), with replay.
const CONFIG: &str =
    r#"{"publisher":"zmq","endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0","topic":"kv"}"#;

/// The control plane's `kv_events` object of `worker` in `/workers`.
async fn kv(stack: &Stack, worker: &SimWorker) -> Value {
    let all = stack.get_json("/workers").await;
    all["workers"]
        .as_array()
        .and_then(|ws| {
            ws.iter()
                .find(|w| w["base_url"] == worker.url.as_str() || w["url"] == worker.url.as_str())
        })
        .map(|w| w["kv_events"].clone())
        .unwrap_or_default()
}

fn blocks(kv: &Value) -> u64 {
    kv["blocks"].as_u64().unwrap_or(0)
}

fn rank0(kv: &Value, field: &str) -> Value {
    kv["ranks"][0][field].clone()
}

/// The simulator's own publisher state (`/_sim/kv_events`).
async fn sim_kv(worker: &SimWorker, post: Option<Value>) -> Value {
    let url = format!("{}/_sim/kv_events", worker.url);
    let c = reqwest::Client::new();
    let r = match post {
        Some(b) => c.post(url).json(&b).send().await,
        None => c.get(url).send().await,
    };
    match r {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(_) => Value::Null,
    }
}

/// The last seq `worker` published on rank 0 (`None` before the first).
async fn sim_last_seq(worker: &SimWorker) -> Option<i64> {
    let next = sim_kv(worker, None).await["ranks"][0]["next_seq"].as_i64()?;
    (next > 0).then_some(next - 1)
}

fn chat(text: &str) -> String {
    json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]})
        .to_string()
}

/// A prompt of `words` distinct words starting with `tag`.
fn prompt(tag: &str, words: usize) -> String {
    (0..words).map(|i| format!("{tag}{i} ")).collect()
}

/// Sends `text` straight to `worker` (not through the router), as the same
/// prompt to twin workers must give both the same cache.
async fn direct(worker: &SimWorker, text: &str) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", worker.url))
        .header("content-type", "application/json")
        .body(chat(text))
        .send()
        .await
        .map(|r| r.status().as_u16());
    assert_eq!(r.ok(), Some(200));
}

/// Waits until the control plane has applied everything `worker` published.
async fn caught_up(stack: &Stack, worker: &SimWorker) -> bool {
    wait_until(Duration::from_secs(10), || async {
        let last = sim_last_seq(worker).await;
        last.is_some() && rank0(&kv(stack, worker).await, "last_seq").as_i64() == last
    })
    .await
}

async fn start() -> Stack {
    Stack::start(StackOptions {
        workers: 2,
        worker_args: vec!["--kv-events-config".into(), CONFIG.into()],
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Both workers subscribed, each having delivered a batch (a SUB socket
/// misses what is published before its subscription reaches the publisher),
/// then both restarted to seq 0 with empty caches.
async fn subscribed_and_reset(stack: &Stack) {
    for w in &stack.workers {
        let ok = wait_until(Duration::from_secs(15), || async {
            let v = kv(stack, w).await;
            v["discovery"] == "subscribed" && rank0(&v, "subscribed") == true
        })
        .await;
        assert!(ok, "not subscribed: {}", kv(stack, w).await);
        let mut i = 0;
        let got = wait_until(Duration::from_secs(15), || {
            i += 1;
            let text = prompt(&format!("warm{i}-"), 80);
            async move {
                direct(w, &text).await;
                rank0(&kv(stack, w).await, "received").as_u64() > Some(0)
            }
        })
        .await;
        assert!(got, "no event arrived: {}", kv(stack, w).await);
        // Everything published so far applied, so that nothing numbered
        // before the restart arrives after it.
        assert!(caught_up(stack, w).await, "{}", kv(stack, w).await);
        sim_kv(w, Some(json!({"restart": true}))).await;
    }
}

#[tokio::test]
async fn blocks_a_routed_request_stored_are_known_per_worker() {
    let stack = start().await;
    subscribed_and_reset(&stack).await;
    // A restart announces nothing: the ranks still hold the warm-up blocks
    // until the first batch after it (seq 0) resets them.
    let served_before: Vec<u64> =
        futures::future::join_all(stack.workers.iter().map(|w| w.served())).await;
    let mut blocks_before = Vec::new();
    for w in &stack.workers {
        blocks_before.push(blocks(&kv(&stack, w).await));
    }
    let text = prompt("routed-", 300);
    let r = stack.post("/v1/chat/completions", &chat(&text)).await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap_or_default();
    let prompt_tokens = body["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    assert!(prompt_tokens > 64, "{body}");
    let served_after: Vec<u64> =
        futures::future::join_all(stack.workers.iter().map(|w| w.served())).await;
    let chosen = (0..2)
        .find(|&i| served_after[i] > served_before[i])
        .expect("one worker served it");
    let (w, other) = (&stack.workers[chosen], &stack.workers[1 - chosen]);
    assert!(caught_up(&stack, w).await, "{}", kv(&stack, w).await);
    let v = kv(&stack, w).await;
    // The simulator caches the prompt's full pages of 16 tokens, nothing
    // else (page size 16, events reset by the restart's seq 0).
    assert_eq!(blocks(&v), prompt_tokens / 16, "{v}");
    assert_eq!(rank0(&v, "state"), "live", "{v}");
    assert_eq!(
        rank0(&v, "last_seq"),
        0,
        "the first batch after the restart: {v}"
    );
    // The other worker published nothing since: what it holds is unchanged.
    let o = kv(&stack, other).await;
    assert_eq!(blocks(&o), blocks_before[1 - chosen], "{o}");
}

/// Sends `text` straight to each of `workers`.
async fn to_each(workers: &[&SimWorker], text: &str) {
    for w in workers {
        direct(w, text).await;
    }
}

#[tokio::test]
async fn a_dropped_batch_is_replayed_and_a_restart_resets_the_rank() {
    let stack = start().await;
    subscribed_and_reset(&stack).await;
    let (a, b) = (&stack.workers[0], &stack.workers[1]);
    // Twin workers get the same prompts. First one each, so that the
    // control plane sees both restarted (seq 0).
    to_each(&[a, b], &prompt("base-", 100)).await;
    assert!(caught_up(&stack, a).await && caught_up(&stack, b).await);

    // B's next batch never reaches the subscriber, which sees the gap at
    // the one after and asks the replay socket for it.
    sim_kv(b, Some(json!({"drop_next": 1}))).await;
    for (i, words) in [(0, 200), (1, 120), (2, 60)] {
        to_each(&[a, b], &prompt(&format!("twin{i}-"), words)).await;
    }
    assert!(caught_up(&stack, a).await && caught_up(&stack, b).await);
    let (va, vb) = (kv(&stack, a).await, kv(&stack, b).await);
    assert_eq!(rank0(&vb, "gaps").as_u64(), Some(1), "{vb}");
    assert_eq!(rank0(&vb, "replayed").as_u64(), Some(1), "{vb}");
    assert_eq!(rank0(&vb, "state"), "live", "{vb}");
    assert_eq!(rank0(&vb, "last_seq"), 3, "{vb}");
    assert!(blocks(&va) > 0);
    assert_eq!(
        blocks(&vb),
        blocks(&va),
        "B after replay holds what A holds: {va} {vb}"
    );
    assert_eq!(rank0(&va, "gaps").as_u64(), Some(0), "{va}");

    // Both restart (empty caches, seq 0), and B's first batch after it is
    // lost: its seq 1 goes back, so the rank is reset, and batch 0 of the
    // new run is asked for again.
    let before = blocks(&vb);
    for w in [a, b] {
        sim_kv(w, Some(json!({"restart": true}))).await;
    }
    sim_kv(b, Some(json!({"drop_next": 1}))).await;
    to_each(&[a, b], &prompt("after0-", 40)).await;
    to_each(&[a, b], &prompt("after1-", 40)).await;
    assert!(caught_up(&stack, a).await && caught_up(&stack, b).await);
    let (va, vb) = (kv(&stack, a).await, kv(&stack, b).await);
    assert!(blocks(&vb) > 0 && blocks(&vb) < before, "{vb}");
    assert_eq!(blocks(&vb), blocks(&va), "{va} {vb}");
    assert_eq!(rank0(&vb, "last_seq"), 1, "{vb}");
    assert_eq!(rank0(&vb, "state"), "live", "{vb}");
    assert_eq!(rank0(&vb, "replayed").as_u64(), Some(2), "{vb}");
}
