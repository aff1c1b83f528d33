//! Helpers of the KV-event tests: the simulator's publisher switches, the
//! control plane's `kv_events` view of a worker in `/workers`, and waiting
//! until everything a worker published was applied.

use std::time::Duration;

use serde_json::{json, Value};

use crate::{wait_until, SimWorker, Stack};

/// Publishers on free ports (the simulator's port 0), with replay.
pub const CONFIG: &str =
    r#"{"publisher":"zmq","endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0","topic":"kv"}"#;

/// The control plane's `kv_events` object of `worker` in `/workers`.
pub async fn kv(stack: &Stack, worker: &SimWorker) -> Value {
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

pub fn blocks(kv: &Value) -> u64 {
    kv["blocks"].as_u64().unwrap_or(0)
}

pub fn rank0(kv: &Value, field: &str) -> Value {
    kv["ranks"][0][field].clone()
}

/// The simulator's own publisher state (`/_sim/kv_events`).
pub async fn sim_kv(worker: &SimWorker, post: Option<Value>) -> Value {
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
pub async fn sim_last_seq(worker: &SimWorker) -> Option<i64> {
    let next = sim_kv(worker, None).await["ranks"][0]["next_seq"].as_i64()?;
    (next > 0).then_some(next - 1)
}

pub fn chat(text: &str) -> String {
    json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]})
        .to_string()
}

/// A prompt of `words` distinct words starting with `tag`.
pub fn prompt(tag: &str, words: usize) -> String {
    (0..words).map(|i| format!("{tag}{i} ")).collect()
}

/// Sends `text` straight to `worker` (not through the router), as the same
/// prompt to twin workers must give both the same cache.
pub async fn direct(worker: &SimWorker, text: &str) {
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
pub async fn caught_up(stack: &Stack, worker: &SimWorker) -> bool {
    wait_until(Duration::from_secs(10), || async {
        let last = sim_last_seq(worker).await;
        last.is_some() && rank0(&kv(stack, worker).await, "last_seq").as_i64() == last
    })
    .await
}

/// Both workers subscribed, each having delivered a batch (a SUB socket
/// misses what is published before its subscription reaches the publisher),
/// then both restarted to seq 0 with empty caches.
pub async fn subscribed_and_reset(stack: &Stack) {
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
