//! The admin API: changing the fleet through Envoy's client port needs
//! `--admin-token` (without one, only the admin port itself serves changes),
//! reading does not, and worker URLs are validated before anything is
//! called: no address that is never a worker, no second URL for a server
//! already registered.

use std::time::Duration;

use serde_json::json;
use sglang_envoy_e2e::{
    expect_bearer_challenge, expect_openai_error, SimWorker, Stack, StackOptions,
};
use tokio::net::TcpListener;

const TOKEN: &str = "s3cret-admin-token";

async fn guarded_stack() -> Stack {
    Stack::start(StackOptions {
        workers: 1,
        cp_args: vec!["--admin-token".into(), TOKEN.into()],
        ..Default::default()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn mutating_endpoints_need_the_token_through_envoy_and_directly() {
    let stack = guarded_stack().await;
    let extra = SimWorker::start(&stack.dir, &[]).await.unwrap();
    let client = reqwest::Client::new();
    for base in [stack.base.clone(), stack.admin.clone()] {
        let add = format!("{base}/add_worker?url={}", extra.url);
        expect_bearer_challenge(client.post(&add).send().await.unwrap()).await;
        let r = client.post(&add).bearer_auth("wrong").send().await.unwrap();
        expect_openai_error(r, 403).await;
        let r = client
            .post(format!("{base}/workers"))
            .json(&json!({"url": extra.url}))
            .send()
            .await
            .unwrap();
        expect_openai_error(r, 401).await;
        let r = client
            .delete(format!("{base}/workers/{}", stack.workers[0].url))
            .send()
            .await
            .unwrap();
        expect_openai_error(r, 401).await;
        // Reading stays open.
        let listed: serde_json::Value = client
            .get(format!("{base}/list_workers"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            listed["urls"].as_array().unwrap().len(),
            1,
            "nothing changed"
        );
    }
    let r = client
        .post(format!("{}/add_worker?url={}", stack.base, extra.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client
        .delete(format!("{}/workers/{}", stack.admin, stack.workers[0].url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let listed = stack.get_json("/list_workers").await;
    assert_eq!(listed["urls"], json!([extra.url]));
}

#[tokio::test]
async fn without_the_token_nobody_can_make_the_control_plane_call_out() {
    let stack = guarded_stack().await;
    // A canary the control plane would health-check if it were added.
    let canary = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", canary.local_addr().unwrap());
    for path in [
        format!("/add_worker?url={url}"),
        format!("/add_worker?url={url}&worker_type=regular"),
    ] {
        let r = reqwest::Client::new()
            .post(stack.url(&path))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }
    let called = tokio::time::timeout(Duration::from_millis(1500), canary.accept()).await;
    assert!(called.is_err(), "the control plane connected to the canary");
}

#[tokio::test]
async fn without_a_token_the_client_port_cannot_redirect_traffic() {
    // The default launch: no --admin-token, admin routes on the client port.
    let stack = Stack::with_workers(1).await;
    let canary = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", canary.local_addr().unwrap());
    let client = reqwest::Client::new();
    let attempts = [
        client.post(stack.url(&format!("/add_worker?url={url}"))),
        client
            .post(stack.url("/workers"))
            .json(&json!({ "url": url })),
        client.post(stack.url(&format!("/remove_worker?url={}", stack.workers[0].url))),
        client.delete(stack.url(&format!("/workers/{}", stack.workers[0].url))),
        // A client cannot pretend to be the admin port by dropping Envoy's mark.
        client
            .post(stack.url(&format!("/add_worker?url={url}")))
            .header("x-sglang-envoy-client-port", ""),
    ];
    for attempt in attempts {
        let message = expect_openai_error(attempt.send().await.unwrap(), 403).await;
        assert!(message.contains("--admin-token"), "{message}");
    }
    // Traffic keeps going to the registered worker, and nothing called out.
    for i in 0..30 {
        let body = format!(r#"{{"text":"prompt {i}","sampling_params":{{"max_new_tokens":1}}}}"#);
        assert_eq!(stack.post("/generate", &body).await.status(), 200);
    }
    assert_eq!(stack.workers[0].served().await, 30);
    let called = tokio::time::timeout(Duration::from_millis(500), canary.accept()).await;
    assert!(called.is_err(), "the control plane connected to the canary");
    let listed = stack.get_json("/list_workers").await;
    assert_eq!(listed["urls"], json!([stack.workers[0].url]));
    // The admin port itself still takes changes without a token.
    let extra = SimWorker::start(&stack.dir, &[]).await.unwrap();
    let r = client
        .post(stack.admin_url(&format!("/add_worker?url={}", extra.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn garbage_forbidden_and_duplicate_worker_urls_are_400() {
    let stack = Stack::with_workers(1).await;
    let client = reqwest::Client::new();
    let existing = stack.workers[0].url.clone();
    let port = existing.rsplit(':').next().unwrap().to_string();
    let admin_port = stack.admin.rsplit(':').next().unwrap().to_string();
    let bad = [
        "not a url".to_string(),
        "ftp://127.0.0.1:21".into(),
        // https:// workers are accepted, but not without a port.
        "https://127.0.0.1".into(),
        "http://127.0.0.1".into(),
        "http://127.0.0.1:1/v1/chat".into(),
        "http://user:pw@127.0.0.1:1".into(),
        "http://127.0.0.1:1?x=1".into(),
        "http://:1".into(),
        "http://127.0.0.1:0".into(),
        // Cloud metadata, unspecified and broadcast addresses are never workers.
        "http://169.254.169.254:80".into(),
        "http://[fe80::1]:80".into(),
        format!("http://0.0.0.0:{port}"),
        "http://255.255.255.255:80".into(),
        // Nor is the control plane itself.
        format!("http://127.0.0.1:{admin_port}"),
        format!("http://localhost:{admin_port}"),
        // The registered worker under another spelling (the same spelling
        // is idempotent: see below).
        format!("http://localhost:{port}"),
        format!("http://[::1]:{port}"),
        format!("http://[::ffff:127.0.0.1]:{port}"),
        // ...and whatever the scheme: one server, one worker.
        format!("https://127.0.0.1:{port}"),
    ];
    for bad in &bad {
        let r = client
            .post(stack.admin_url("/workers"))
            .json(&json!({ "url": bad }))
            .send()
            .await
            .unwrap();
        let message = expect_openai_error(r, 400).await;
        assert!(!message.is_empty(), "{bad}");
    }
    let r = client
        .post(stack.admin_url("/workers"))
        .body("{\"url\": 42}")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 400).await;
    // Posting a registered URL again changes nothing and answers its id, as
    // sglang-router does; the query-string API calls it a duplicate.
    let id = stack.get_json("/workers").await["workers"][0]["id"].clone();
    for same in [existing.clone(), format!("{existing}/")] {
        let r = client
            .post(stack.admin_url("/workers"))
            .json(&json!({ "url": same }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["worker_id"], id);
        let r = client
            .post(stack.admin_url(&format!("/add_worker?url={same}")))
            .send()
            .await
            .unwrap();
        assert!(expect_openai_error(r, 400)
            .await
            .contains("already registered"));
    }
    let listed = stack.get_json("/list_workers").await;
    assert_eq!(listed["urls"], json!([existing]));
    // One server, one load: the registered worker still serves alone.
    assert_eq!(
        stack.post("/generate", r#"{"text":"x"}"#).await.status(),
        200
    );
    assert_eq!(stack.loads().await.len(), 1);
}

#[tokio::test]
async fn the_admin_api_can_be_kept_off_the_client_port() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        admin_routes: false,
        ..Default::default()
    })
    .await
    .unwrap();
    let extra = SimWorker::start(&stack.dir, &[]).await.unwrap();
    let client = reqwest::Client::new();
    // Through Envoy the admin paths are no longer routed: Envoy answers its
    // JSON 404, as for any path the router does not serve.
    let r = client
        .post(stack.url(&format!("/add_worker?url={}", extra.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    for path in ["/list_workers", "/workers", "/get_loads", "/metrics"] {
        let r = client.get(stack.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
    // The control plane's health stays on the client port, as on
    // sglang-router's.
    for path in ["/health", "/liveness", "/readiness"] {
        let r = client.get(stack.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    // The admin port itself still works, and nothing was added.
    let listed: serde_json::Value = client
        .get(format!("{}/list_workers", stack.admin))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["urls"], json!([stack.workers[0].url]));
    // Inference still flows.
    let r = stack
        .post(
            "/v1/chat/completions",
            r#"{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .await;
    assert_eq!(r.status(), 200);
}
