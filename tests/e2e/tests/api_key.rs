//! sglang-router's `--api-key` through Envoy: inference requests without
//! `Authorization: Bearer <key>` get a JSON 401 from the router and never
//! reach a worker; with it they are routed. The control plane's own calls
//! to workers that require the key (SGLang's `--api-key`) carry it. The
//! wasm filter keeps checking while the control plane is down.

use std::time::Duration;

use serde_json::json;
use sglang_envoy_e2e::{expect_openai_error, FrontDoor, Stack, StackOptions};

const KEY: &str = "sk-fleet-7f3a";

fn chat() -> serde_json::Value {
    json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn inference_needs_the_key_and_the_control_plane_passes_it_to_workers() {
    let mut stack = Stack::start(StackOptions {
        workers: 2,
        // Workers that require the key: with --dp-aware the control plane
        // must read their /server_info, which needs it, before routing.
        worker_args: vec!["--api-key".into(), KEY.into()],
        cp_args: vec!["--api-key".into(), KEY.into(), "--dp-aware".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let base = stack.base.clone();
    let send = |auth: Option<&str>, path: &str| {
        let mut r = client.post(format!("{base}{path}")).json(&chat());
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.send()
    };

    for auth in [
        None,
        Some("Bearer sk-wrong"),
        Some(KEY),
        Some("Basic c2stZmxlZXQ="),
    ] {
        for path in ["/v1/chat/completions", "/generate"] {
            let r = send(auth, path).await.unwrap();
            let message = expect_openai_error(r, 401).await;
            assert!(message.contains("API key"), "{auth:?} {path}: {message}");
        }
    }
    for w in &stack.workers {
        let reached: Vec<_> = w
            .requests()
            .await
            .into_iter()
            .filter(|r| r["method"] == "POST")
            .collect();
        assert!(
            reached.is_empty(),
            "refused requests reached {}: {reached:?}",
            w.url
        );
    }
    let r = send(Some(&format!("Bearer {KEY}")), "/v1/chat/completions")
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    // Health stays open, as it is on sglang-router.
    let r = client.get(stack.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    if FrontDoor::current().is_ext_proc() {
        // Envoy's ext_proc filter fails open without the control plane:
        // nothing of the router checks the key then (docs/envoy.md, ext_proc).
        return;
    }
    // The filter's fallback has the worker list (and the key's check).
    assert!(
        stack
            .wait_worker_list_fetched(Duration::from_secs(10))
            .await,
        "the filter never fetched the worker list"
    );
    stack.kill_control_plane();
    let r = send(None, "/generate").await.unwrap();
    expect_openai_error(r, 401).await;
    let r = send(Some(&format!("Bearer {KEY}")), "/v1/chat/completions")
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        200,
        "routed by the filter alone: {:?}",
        r.text().await
    );
}
