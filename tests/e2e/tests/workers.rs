//! Workers added and removed at run time, and workers that die.

use std::time::Duration;

use sglang_envoy_e2e::{expect_openai_error, wait_until, SimWorker, Stack, StackOptions};

const GEN: &str = r#"{"text":"hello","sampling_params":{"max_new_tokens":1}}"#;

async fn send(stack: &Stack, n: usize) {
    for _ in 0..n {
        let r = stack.post("/generate", GEN).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
}

#[tokio::test]
async fn workers_added_and_removed_at_run_time_take_effect() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        policy: "round_robin".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let extra = SimWorker::start(&stack.dir, &[]).await.unwrap();

    // sglang-router's query-string API, on the admin port (through the
    // client port it needs --admin-token: admin_security.rs).
    let r = client
        .post(stack.admin_url(&format!("/add_worker?url={}", extra.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.text().await.unwrap(),
        format!("Successfully added worker: {}", extra.url)
    );
    let list = stack.get_json("/list_workers").await;
    assert!(list["urls"]
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u == extra.url.as_str()));

    send(&stack, 10).await;
    assert_eq!(extra.served().await, 5, "the new worker must get its turn");
    assert_eq!(stack.workers[0].served().await, 5);

    // Duplicates and garbage are refused with JSON errors.
    let dup = client
        .post(stack.admin_url(&format!("/add_worker?url={}", extra.url)))
        .send()
        .await
        .unwrap();
    assert!(expect_openai_error(dup, 400)
        .await
        .contains("already registered"));
    for bad in ["not-a-url", "ftp://x:1", "http://127.0.0.1:1/path"] {
        let r = client
            .post(stack.admin_url(&format!("/add_worker?url={bad}")))
            .send()
            .await
            .unwrap();
        expect_openai_error(r, 400).await;
    }
    let none = client
        .post(stack.admin_url("/add_worker"))
        .send()
        .await
        .unwrap();
    assert!(expect_openai_error(none, 400).await.contains("url"));

    let r = client
        .post(stack.admin_url(&format!("/remove_worker?url={}", extra.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    send(&stack, 6).await;
    assert_eq!(
        extra.served().await,
        5,
        "a removed worker must get no requests"
    );

    // The JSON API (sglang-router's shapes: workers_api.rs).
    let r = client
        .post(stack.admin_url("/workers"))
        .json(&serde_json::json!({"url": extra.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let s = &stack;
    assert!(
        wait_until(Duration::from_secs(5), || async move {
            let all = s.get_json("/workers").await;
            all["total"] == 2 && all["healthy"] == 2
        })
        .await,
        "the worker added again is not healthy"
    );
    send(&stack, 4).await;
    assert_eq!(extra.served().await, 7);
    let encoded = extra.url.replace(':', "%3A").replace('/', "%2F");
    let r = client
        .delete(stack.admin_url(&format!("/workers/{encoded}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let gone = client
        .delete(stack.admin_url(&format!("/workers/{encoded}")))
        .send()
        .await
        .unwrap();
    expect_openai_error(gone, 404).await;
    let all = stack.get_json("/workers").await;
    assert_eq!(all["total"], 1);
}

#[tokio::test]
async fn a_killed_worker_fails_no_request_after_it_died() {
    let mut stack = Stack::start(StackOptions {
        workers: 3,
        policy: "round_robin".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    send(&stack, 6).await;
    let dead = stack.workers[1].url.clone();
    stack.workers[1].kill();

    // Sequential and concurrent traffic right after the crash: round robin
    // keeps choosing the dead worker until the control plane notices, and
    // Envoy must retry those requests on a live one.
    send(&stack, 12).await;
    let burst = futures::future::join_all((0..24).map(|_| stack.post("/generate", GEN))).await;
    for r in burst {
        assert_eq!(r.status(), 200);
    }
    let noticed = stack
        .wait_marked(&dead, false, Duration::from_secs(5))
        .await;
    assert!(noticed, "the dead worker is still marked healthy");
    let served: u64 = stack.workers[0].served().await + stack.workers[2].served().await;
    assert_eq!(
        served,
        4 + 36,
        "every request must have been served by a live worker"
    );
}
