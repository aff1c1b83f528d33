//! Admission control (`--max-concurrent-requests`, `--queue-size`,
//! `--queue-timeout-secs`): over the limit, requests wait in a bounded
//! queue; a full queue is a JSON 429, a wait past the timeout a JSON 408.

use std::time::{Duration, Instant};

use serde_json::json;
use sglang_envoy_e2e::{wait_until, Stack, StackOptions};

/// A `/generate` that takes the worker about `tokens` × its decode time.
fn slow(tokens: u32) -> String {
    json!({"text": "x", "sampling_params": {"max_new_tokens": tokens}}).to_string()
}

async fn limited(limit: u32, queue: u32, timeout_secs: u32) -> Stack {
    let stack = Stack::start(StackOptions {
        workers: 1,
        cp_args: vec![
            "--max-concurrent-requests".into(),
            limit.to_string(),
            "--queue-size".into(),
            queue.to_string(),
            "--queue-timeout-secs".into(),
            timeout_secs.to_string(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    // 100 ms per token.
    stack.workers[0]
        .configure(json!({"decode_us_per_token": 100_000}))
        .await;
    stack
}

/// Sends `n` requests at once; their statuses and OpenAI error types.
async fn burst(stack: &Stack, n: usize, body: &str) -> Vec<(u16, String)> {
    let sends: Vec<_> = (0..n)
        .map(|_| {
            let url = stack.url("/generate");
            let body = body.to_string();
            tokio::spawn(async move {
                let r = reqwest::Client::new()
                    .post(url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let v: serde_json::Value = r.json().await.unwrap_or_default();
                (
                    status,
                    v["error"]["type"].as_str().unwrap_or_default().to_string(),
                )
            })
        })
        .collect();
    let mut out = Vec::new();
    for s in sends {
        out.push(s.await.unwrap());
    }
    out.sort();
    out
}

async fn admission_idle(stack: &Stack) -> bool {
    wait_until(Duration::from_secs(5), || async {
        stack.metric("sgl_router_admission_in_flight").await == 0.0
            && stack.metric("sgl_router_admission_queued").await == 0.0
    })
    .await
}

#[tokio::test]
async fn over_the_limit_without_a_queue_is_429() {
    // Two take the two slots (4 s each); once both hold them, six more
    // arrive and each is refused. Sent in two steps, not as one burst: on a
    // busy machine a burst can be spread over more than a request's time,
    // and a slot freed meanwhile would admit a third.
    let stack = limited(2, 0, 60).await;
    let holders: Vec<_> = (0..2)
        .map(|_| {
            let url = stack.url("/generate");
            tokio::spawn(async move {
                reqwest::Client::new()
                    .post(url)
                    .header("content-type", "application/json")
                    .body(slow(40))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(5), || async {
            stack.metric("sgl_router_admission_in_flight").await == 2.0
        })
        .await,
        "the first two hold both slots"
    );
    let refused = burst(&stack, 6, &slow(1)).await;
    assert!(
        refused
            .iter()
            .all(|(s, kind)| *s == 429 && kind == "rate_limit_exceeded"),
        "{refused:?}"
    );
    for h in holders {
        assert_eq!(h.await.unwrap(), 200);
    }
    assert_eq!(stack.workers[0].served().await, 2);
    assert!(admission_idle(&stack).await);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn a_queued_request_waits_for_its_slot_or_times_out() {
    // One in flight (4 s), one waiting at most 2 s: the first is served,
    // the second waits and gives up (408), two more find the queue full.
    // Each is sent once the one before holds its place, not all at once:
    // on a busy machine a burst can arrive spread over more than the wait.
    let stack = limited(1, 1, 2).await;
    let send = |tokens: u32| {
        let url = stack.url("/generate");
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(url)
                .header("content-type", "application/json")
                .body(slow(tokens))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            let kind = v["error"]["type"].as_str().unwrap_or_default().to_string();
            (status, kind)
        })
    };
    let gauge = |name: &'static str, value: f64| {
        let stack = &stack;
        async move {
            wait_until(Duration::from_secs(5), || async {
                stack.metric(name).await == value
            })
            .await
        }
    };
    let first = send(40);
    assert!(gauge("sgl_router_admission_in_flight", 1.0).await);
    let second = send(1);
    assert!(gauge("sgl_router_admission_queued", 1.0).await);
    let full = [send(1).await.unwrap(), send(1).await.unwrap()];
    // The second still held the queue's one place meanwhile.
    assert_eq!(stack.metric("sgl_router_admission_queued").await, 1.0);
    for (status, kind) in &full {
        assert_eq!((*status, kind.as_str()), (429, "rate_limit_exceeded"));
    }
    let (status, kind) = second.await.unwrap();
    assert_eq!((status, kind.as_str()), (408, "timeout"));
    assert_eq!(first.await.unwrap().0, 200);
    assert!(admission_idle(&stack).await);

    // With room to wait, everyone is served, one at a time.
    let stack = limited(1, 8, 30).await;
    let started = Instant::now();
    let got = burst(&stack, 4, &slow(5)).await;
    assert!(got.iter().all(|(s, _)| *s == 200), "{got:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(4 * 500),
        "the four ran one after another"
    );
    assert!(admission_idle(&stack).await);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn a_client_that_leaves_the_queue_frees_its_place() {
    let stack = limited(1, 1, 30).await;
    let first = tokio::spawn({
        let url = stack.url("/generate");
        async move {
            reqwest::Client::new()
                .post(url)
                .body(slow(20))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    assert!(
        wait_until(Duration::from_secs(5), || async {
            stack.metric("sgl_router_admission_in_flight").await == 1.0
        })
        .await,
        "the first request never started"
    );
    // Queued behind the first; the client gives up after 300 ms.
    let gone = reqwest::Client::new()
        .post(stack.url("/generate"))
        .timeout(Duration::from_millis(300))
        .body(slow(1))
        .send()
        .await;
    assert!(gone.is_err(), "the queued request was answered");
    // Its place in the queue is free again at once...
    let freed = wait_until(Duration::from_secs(1), || async {
        stack.metric("sgl_router_admission_queued").await == 0.0
    })
    .await;
    assert!(freed, "the gone request kept its place in the queue");
    // ...so the next one waits there (rather than a 429) and is served
    // once the first ends.
    let next = reqwest::Client::new()
        .post(stack.url("/generate"))
        .body(slow(1))
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 200);
    assert_eq!(first.await.unwrap().unwrap(), 200);
    assert!(admission_idle(&stack).await);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}
