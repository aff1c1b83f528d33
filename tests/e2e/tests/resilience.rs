//! Workers that misbehave while their `/health` looks fine: answers of
//! 5xx, a stalled worker, a killed one. Failed attempts are retried on other
//! workers before any byte reaches the client, and a worker that keeps
//! failing has its circuit opened (sglang-router's retry and circuit-breaker
//! flags and defaults).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sglang_envoy_e2e::{
    expect_openai_error, wait_until, PdOptions, SimWorker, Stack, StackOptions,
};

const GENERATE: &str = r#"{"text":"x","sampling_params":{"max_new_tokens":1}}"#;

fn stream_chat() -> String {
    json!({
        "model": "m",
        "max_tokens": 2,
        "stream": true,
        "messages": [{"role": "user", "content": "hi"}],
    })
    .to_string()
}

/// The circuit state `/workers` reports for `worker`.
async fn circuit(stack: &Stack, worker: &SimWorker) -> String {
    stack.get_json("/workers").await["workers"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["url"] == worker.url.as_str()).cloned())
        .map(|w| w["circuit"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_worker_answering_500_fails_no_request_and_its_circuit_opens() {
    let stack = Stack::start(StackOptions {
        workers: 2,
        policy: "round_robin".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let (bad, good) = (&stack.workers[0], &stack.workers[1]);
    bad.configure(json!({"fail_status": 500})).await;
    for _ in 0..40 {
        assert_eq!(stack.post("/generate", GENERATE).await.status(), 200);
    }
    // sglang-router's default: ten consecutive failures open the circuit;
    // from then on the failing worker gets nothing (round robin would have
    // given it 20). A failure is counted before its client sees the answer,
    // so not one request more goes its way.
    let failures = bad.served().await;
    assert_eq!(failures, 10);
    assert_eq!(good.served().await, 40);
    assert_eq!(circuit(&stack, bad).await, "open");
    assert_eq!(circuit(&stack, good).await, "closed");
    // Each failure was retried once, on the good worker.
    assert_eq!(
        stack.metric("sgl_router_retries_total").await,
        failures as f64
    );
    // Its health checks still pass: health and circuit are separate.
    let workers = stack.get_json("/workers").await;
    assert!(workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["healthy"] == Value::Bool(true)));
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn under_load_a_failing_worker_costs_no_client_request() {
    let stack = Stack::start(StackOptions {
        workers: 3,
        policy: "round_robin".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    stack.workers[1]
        .configure(json!({"fail_status": 503}))
        .await;
    let tasks: Vec<_> = (0..16)
        .map(|c| {
            let url = stack.url("/v1/chat/completions");
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut failed = 0;
                for i in 0..25 {
                    let body = json!({
                        "model": "m",
                        "max_tokens": 1,
                        "messages": [{"role": "user", "content": format!("client {c} turn {i}")}],
                    });
                    let r = client.post(&url).json(&body).send().await.unwrap();
                    if r.status() != 200 {
                        failed += 1;
                    }
                }
                failed
            })
        })
        .collect();
    let mut failed = 0;
    for t in tasks {
        failed += t.await.unwrap();
    }
    assert_eq!(failed, 0, "client requests failed");
    assert_eq!(circuit(&stack, &stack.workers[1]).await, "open");
    // Concurrent requests may have gone its way while the last failures
    // were being reported; never many.
    assert!(stack.workers[1].served().await < 30);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

/// Requests each client sends after the kill, at least: the killed worker
/// is met (and retried around) until it is probed down, then the fleet
/// serves on without it.
const AFTER_KILL_PER_CLIENT: u64 = 20;

#[tokio::test]
async fn a_worker_killed_under_load_costs_no_client_request() {
    let mut stack = Stack::start(StackOptions {
        workers: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));
    let (sent, after_kill) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    // 8 closed-loop clients until told to stop; each status is kept with
    // whether its request was sent after the kill.
    let tasks: Vec<_> = (0..8)
        .map(|c| {
            let url = stack.url("/generate");
            let (stop, killed) = (stop.clone(), killed.clone());
            let (sent, after_kill) = (sent.clone(), after_kill.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut statuses = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let after = killed.load(Ordering::Relaxed);
                    let body = json!({"text": format!("{c}-{i}"), "sampling_params": {"max_new_tokens": 4}});
                    let r = client.post(&url).json(&body).send().await;
                    statuses.push((r.map_or(0, |r| r.status().as_u16()), after));
                    sent.fetch_add(1, Ordering::Relaxed);
                    if after {
                        after_kill.fetch_add(1, Ordering::Relaxed);
                    }
                }
                statuses
            })
        })
        .collect();
    // The load is under way, and the worker to kill has its share of it.
    let under_way = wait_until(Duration::from_secs(10), || async {
        sent.load(Ordering::Relaxed) >= 40 && stack.workers[2].served().await > 0
    })
    .await;
    assert!(
        under_way,
        "{} requests before the kill",
        sent.load(Ordering::Relaxed)
    );
    killed.store(true, Ordering::Relaxed);
    stack.workers[2].kill();
    // The load goes on past the kill.
    let enough = wait_until(Duration::from_secs(30), || async {
        after_kill.load(Ordering::Relaxed) >= 8 * AFTER_KILL_PER_CLIENT
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.extend(t.await.unwrap());
    }
    let after: Vec<u16> = statuses
        .iter()
        .filter(|(_, a)| *a)
        .map(|(s, _)| *s)
        .collect();
    assert!(enough, "only {} requests sent after the kill", after.len());
    let bad: Vec<_> = statuses.iter().filter(|(s, _)| *s != 200).collect();
    assert!(bad.is_empty(), "failed (status, after the kill): {bad:?}");
    eprintln!(
        "{} requests, {} sent after the kill",
        statuses.len(),
        after.len()
    );
}

#[tokio::test]
async fn without_retries_the_failure_surfaces_until_the_circuit_opens() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        cp_args: vec![
            "--disable-retries".into(),
            "--cb-failure-threshold".into(),
            "2".into(),
            "--cb-success-threshold".into(),
            "2".into(),
            "--cb-timeout-duration-secs".into(),
            "1".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let stack = &stack;
    let worker = &stack.workers[0];
    worker.configure(json!({"fail_status": 500})).await;
    // Two answers of the worker's own 500 (one attempt each)...
    for _ in 0..2 {
        assert_eq!(stack.post("/generate", GENERATE).await.status(), 500);
    }
    // ...each counted before its client saw it, so the very next request...
    // ...gets the router's JSON 503: the worker is spared.
    let message = expect_openai_error(stack.post("/generate", GENERATE).await, 503).await;
    assert!(message.contains("circuit"), "{message}");
    assert_eq!(worker.served().await, 2);
    // Half-open after the timeout: one failure opens it again.
    let reached = wait_until(Duration::from_secs(3), || async move {
        stack.post("/generate", GENERATE).await.status() == 500
    })
    .await;
    assert!(reached, "the half-open circuit let no request through");
    // That one failure opened it again, before the next request.
    assert_eq!(circuit(stack, worker).await, "open");
    assert_eq!(stack.post("/generate", GENERATE).await.status(), 503);
    // Once the worker is well, half-open successes close the circuit.
    worker.configure(json!({"fail_status": null})).await;
    let back = wait_until(Duration::from_secs(3), || async move {
        stack.post("/generate", GENERATE).await.status() == 200
    })
    .await;
    assert!(back);
    assert_eq!(stack.post("/generate", GENERATE).await.status(), 200);
    let closed = wait_until(Duration::from_secs(1), || async move {
        circuit(stack, worker).await == "closed"
    })
    .await;
    assert!(
        closed,
        "two successes while half-open must close the circuit"
    );
}

#[tokio::test]
async fn a_stalled_stream_moves_to_another_worker() {
    let stack = Stack::start(StackOptions {
        workers: 2,
        policy: "round_robin".into(),
        cp_args: vec![
            "--stream-start-timeout-secs".into(),
            "1".into(),
            "--cb-failure-threshold".into(),
            "3".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let (stalled, good) = (&stack.workers[0], &stack.workers[1]);
    stalled.configure(json!({"stall": true})).await;
    let mut slow = 0;
    for _ in 0..10 {
        let started = std::time::Instant::now();
        let r = stack.post("/v1/chat/completions", &stream_chat()).await;
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        assert!(text.contains("data: [DONE]"), "{text}");
        if started.elapsed() >= Duration::from_millis(900) {
            slow += 1;
        }
    }
    // Each stream sent to the stalled worker waited one start timeout, then
    // went on; after three, its circuit opened and none waited any more.
    assert_eq!(slow, 3);
    assert_eq!(circuit(&stack, stalled).await, "open");
    assert_eq!(good.served().await, 10);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn a_failing_prefill_worker_is_taken_out_of_rotation() {
    let stack = Stack::start(StackOptions {
        pd: Some(PdOptions {
            prefills: 2,
            decodes: 1,
            ..Default::default()
        }),
        policy: "round_robin".into(),
        cp_args: vec!["--cb-failure-threshold".into(), "2".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let bad = &stack.prefills[0];
    bad.configure(json!({"fail_status": 500})).await;
    let mut failed = 0;
    for _ in 0..20 {
        if stack.post("/generate", GENERATE).await.status() != 200 {
            failed += 1;
        }
    }
    // Only the requests that met the failing prefill before its circuit
    // opened failed (a PD pair is not retried: the decode half carries the
    // prefill's bootstrap address).
    assert_eq!(failed, 2);
    assert_eq!(circuit(&stack, bad).await, "open");
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}
