//! `cost_aware` prices the prefill queued on each worker. A streamed
//! request's prefill leaves that queue when its first bytes come back (the
//! front door reports it), not when the request ends: a worker decoding
//! long answers has an empty prefill queue.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use sglang_envoy_e2e::{Stack, StackOptions};

/// One worker that decodes slowly (50 ms a token), routed by `cost_aware`.
async fn slow_decoding_stack() -> Stack {
    Stack::start(StackOptions {
        workers: 1,
        policy: "cost_aware".into(),
        worker_args: vec!["--decode-us-per-token".into(), "50000".into()],
        ..Default::default()
    })
    .await
    .unwrap()
}

/// The worker's `load` and `queued_prefill_bytes` in `/get_loads`.
async fn queue(stack: &Stack) -> (u64, u64) {
    let loads = stack.get_json("/get_loads").await;
    let w = &loads["workers"][0];
    (
        w["load"].as_u64().unwrap_or(u64::MAX),
        w["queued_prefill_bytes"].as_u64().unwrap_or(u64::MAX),
    )
}

/// Polls [`queue`] until it reads `want`, for `within` at most.
async fn wait_queue(stack: &Stack, want: (u64, u64), within: Duration) -> (u64, u64) {
    wait_queue_until(stack, within, |seen| seen == want).await
}

/// Polls [`queue`] until `done` says so, for `within` at most; the last
/// reading.
async fn wait_queue_until(
    stack: &Stack,
    within: Duration,
    done: impl Fn((u64, u64)) -> bool,
) -> (u64, u64) {
    let started = Instant::now();
    loop {
        let seen = queue(stack).await;
        if done(seen) || started.elapsed() > within {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_streamed_request_leaves_the_prefill_queue_at_its_first_bytes_and_the_load_at_its_end() {
    let stack = slow_decoding_stack().await;
    let prompt = "a system prompt long enough to count ".repeat(40);
    // 40 tokens at 50 ms: two seconds of decode after the first bytes.
    let body = json!({
        "model": "m", "stream": true, "max_tokens": 40,
        "messages": [{"role": "user", "content": prompt}],
    });
    let r = stack.post("/v1/chat/completions", &body.to_string()).await;
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let first = stream.next().await.expect("a first chunk").unwrap();
    assert!(!first.is_empty());
    // Decoding: still in flight, nothing left to prefill.
    let during = wait_queue(&stack, (1, 0), Duration::from_millis(1500)).await;
    assert_eq!(during, (1, 0), "while it decodes (load, queued bytes)");
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
    assert_eq!(
        wait_queue(&stack, (0, 0), Duration::from_secs(2)).await,
        (0, 0),
        "after its end"
    );
}

#[tokio::test]
async fn the_prefill_reports_teach_the_workers_pace() {
    // 1 ms a token: the prompt's prefill takes a few hundred ms, against
    // which Envoy's and the router's own milliseconds are small.
    let stack = Stack::start(StackOptions {
        workers: 1,
        policy: "cost_aware".into(),
        worker_args: vec!["--prefill-us-per-token".into(), "1000".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let pace = |loads: &Value| loads["workers"][0]["prefill_bytes_per_s"].as_f64();
    assert_eq!(
        pace(&stack.get_json("/get_loads").await),
        None,
        "no report yet"
    );
    let prompt = "a prompt whose prefill takes its time ".repeat(40);
    let body = json!({
        "model": "m", "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": prompt}],
    });
    let sent = Instant::now();
    let url = stack.url("/v1/chat/completions");
    let first = tokio::spawn(async move {
        let r = reqwest::Client::new().post(url).json(&body).send().await?;
        let mut stream = r.bytes_stream();
        let first = stream.next().await.transpose()?;
        let ttft = sent.elapsed();
        while stream.next().await.is_some() {}
        Ok::<_, reqwest::Error>((first.is_some(), ttft))
    });
    // While it prefills, the work the router counts for it.
    let (_, work) = wait_queue_until(&stack, Duration::from_secs(1), |seen| seen.1 > 0).await;
    assert!(work >= prompt.len() as u64 && work < u64::MAX, "{work}");
    let (streamed, ttft) = first.await.unwrap().unwrap();
    assert!(streamed);
    wait_queue(&stack, (0, 0), Duration::from_secs(2)).await;
    let learned = pace(&stack.get_json("/get_loads").await).unwrap_or(0.0);
    // The router times the prefill from its decision to the first bytes
    // Envoy sees: a little less than the client's time to first token.
    let seen_by_client = work as f64 / ttft.as_secs_f64();
    assert!(
        (0.9 * seen_by_client..=1.5 * seen_by_client).contains(&learned),
        "learned {learned} bytes/s; {work} bytes in {ttft:?} seen by the client"
    );
}

#[tokio::test]
async fn a_whole_answer_keeps_its_prefill_queued_until_it_ends() {
    // Its bytes come at its end: nothing tells its prefill ended sooner.
    let stack = slow_decoding_stack().await;
    let prompt = "another prompt, answered whole ".repeat(40);
    let body = json!({
        "model": "m", "max_tokens": 30,
        "messages": [{"role": "user", "content": prompt}],
    });
    let url = stack.url("/v1/chat/completions");
    let sent = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&body)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    // In flight (1.5 s of decode): counted, with its prompt's bytes queued.
    let seen = wait_queue_until(&stack, Duration::from_secs(1), |seen| seen.0 == 1).await;
    assert_eq!(seen.0, 1, "the request is in flight");
    assert!(
        seen.1 >= prompt.len() as u64,
        "its prompt is queued: {seen:?}"
    );
    assert_eq!(sent.await.unwrap().unwrap(), 200);
    let after: Value = stack.get_json("/get_loads").await;
    assert_eq!(
        wait_queue(&stack, (0, 0), Duration::from_secs(2)).await,
        (0, 0),
        "after its end: {after}"
    );
}
