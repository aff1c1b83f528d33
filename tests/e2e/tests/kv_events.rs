//! SGLang's KV events through the whole stack: simulated workers started
//! with `--kv-events-config` publish their caches' changes as SGLang 0.5.23
//! does; the control plane finds each publisher in the worker's
//! `/server_info`, subscribes, and `/workers` shows what each worker holds:
//! the blocks a request routed through Envoy stored, a dropped batch
//! filled in by replay, and a restarted worker's state reset.

use serde_json::{json, Value};
use sglang_envoy_e2e::kv_events::{
    blocks, caught_up, chat, direct, kv, prompt, rank0, sim_kv, subscribed_and_reset, CONFIG,
};
use sglang_envoy_e2e::{SimWorker, Stack, StackOptions};

async fn start() -> Stack {
    Stack::start(StackOptions {
        workers: 2,
        worker_args: vec!["--kv-events-config".into(), CONFIG.into()],
        ..Default::default()
    })
    .await
    .unwrap()
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
