//! Bad input and missing capacity get clear OpenAI-shaped JSON errors with
//! the right status, never a hang.

use std::time::{Duration, Instant};

use sglang_envoy_e2e::{expect_openai_error, wait_until, FrontDoor, Stack, StackOptions};

async fn expect_error(r: reqwest::Response, status: u16, message_part: &str) {
    let message = expect_openai_error(r, status).await;
    assert!(
        message.contains(message_part),
        "{message:?} lacks {message_part:?}"
    );
}

#[tokio::test]
async fn malformed_bodies_get_400_and_reach_no_worker() {
    let stack = Stack::with_workers(1).await;
    for (body, part) in [
        ("{\"messages\": [", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("{\"a\":1} trailing", "not valid JSON"),
        ("\u{7f}\u{0}", "not valid JSON"),
    ] {
        expect_error(stack.post("/v1/chat/completions", body).await, 400, part).await;
    }
    let empty = reqwest::Client::new()
        .post(stack.url("/generate"))
        .send()
        .await
        .unwrap();
    expect_error(empty, 400, "body is required").await;
    assert_eq!(stack.workers[0].served().await, 0);
    // The filter is still alive after all that.
    assert_eq!(
        stack.post("/generate", r#"{"text":"ok"}"#).await.status(),
        200
    );
}

#[tokio::test]
async fn oversized_bodies_get_413() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        max_body_bytes: 4096,
        ..Default::default()
    })
    .await
    .unwrap();
    let big = format!("{{\"text\":\"{}\"}}", "x".repeat(10_000));
    expect_error(stack.post("/generate", &big).await, 413, "4096 bytes").await;
    let fits = format!("{{\"text\":\"{}\"}}", "x".repeat(4000));
    assert_eq!(stack.post("/generate", &fits).await.status(), 200);
    assert_eq!(stack.workers[0].served().await, 1);
}

#[tokio::test]
async fn no_healthy_worker_is_503_until_one_recovers() {
    let stack = Stack::start(StackOptions {
        workers: 2,
        cp_args: vec![
            "--health-failure-threshold".into(),
            "1".into(),
            "--health-success-threshold".into(),
            "1".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    for w in &stack.workers {
        w.configure(serde_json::json!({"healthy": false})).await;
    }
    let stack = &stack;
    let all_down = wait_until(Duration::from_secs(5), || async move {
        stack.post("/generate", r#"{"text":"x"}"#).await.status() == 503
    })
    .await;
    assert!(
        all_down,
        "requests still routed with every worker unhealthy"
    );
    expect_error(
        stack.post("/generate", r#"{"text":"x"}"#).await,
        503,
        "no healthy workers",
    )
    .await;
    // The router tells its orchestrator: alive, but not ready.
    let live = reqwest::get(stack.url("/liveness")).await.unwrap();
    assert_eq!(live.status(), 200);
    let ready = reqwest::get(stack.url("/readiness")).await.unwrap();
    expect_error(ready, 503, "not ready").await;

    stack.workers[1]
        .configure(serde_json::json!({"healthy": true}))
        .await;
    let back = wait_until(Duration::from_secs(5), || async move {
        stack.post("/generate", r#"{"text":"x"}"#).await.status() == 200
    })
    .await;
    assert!(back, "a recovered worker must get requests again");
    let ready = reqwest::get(stack.url("/readiness")).await.unwrap();
    assert_eq!(ready.status(), 200);
}

/// With a worker list, the wasm filter keeps routing through an outage (see
/// outage.rs); with no healthy worker on it, the client gets a prompt 503.
/// The ext_proc filter fails open (`failure_mode_allow`) and the request
/// reaches a worker of the cluster anyway. Either way the answer is prompt.
#[tokio::test]
async fn control_plane_down_with_no_healthy_worker_known_is_a_prompt_answer() {
    let mut stack = Stack::start(StackOptions {
        workers: 1,
        cp_args: vec!["--health-failure-threshold".into(), "1".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    stack.workers[0]
        .configure(serde_json::json!({"healthy": false}))
        .await;
    let s = &stack;
    assert!(
        wait_until(Duration::from_secs(5), || async move {
            s.post("/generate", r#"{"text":"x"}"#).await.status() == 503
        })
        .await
    );
    // The filter fetches the (now empty) worker list.
    assert!(
        stack
            .wait_worker_list_fetched(Duration::from_secs(10))
            .await,
        "the filter never fetched the worker list"
    );
    stack.kill_control_plane();
    let started = Instant::now();
    let r = stack.post("/generate", r#"{"text":"x"}"#).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answer took {:?}",
        started.elapsed()
    );
    match FrontDoor::current() {
        FrontDoor::Wasm => expect_error(r, 503, "control plane").await,
        // A picker's gateway fails closed (full duplex cannot fail open).
        FrontDoor::Picker => {
            expect_openai_error(r, 503).await;
        }
        FrontDoor::ExtProc => {
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        }
    }
}

#[tokio::test]
async fn unknown_admin_paths_are_json_404() {
    let stack = Stack::with_workers(1).await;
    let r = reqwest::get(format!("{}/no_such_endpoint", stack.admin))
        .await
        .unwrap();
    expect_error(r, 404, "no such admin endpoint").await;
}
