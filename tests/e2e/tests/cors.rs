//! sglang-router's `--cors-allowed-origins`, answered by Envoy's CORS
//! filter rendered from the same launch line: allowed origins get their
//! preflight answered by Envoy (the workers never see it) and their answers
//! marked; other origins, and every origin without the flag, get nothing.

use serde_json::json;
use sglang_envoy_e2e::{Stack, StackOptions};

const ALLOWED: &str = "https://app.example.com";

async fn preflight(stack: &Stack, origin: &str) -> reqwest::Response {
    reqwest::Client::new()
        .request(reqwest::Method::OPTIONS, stack.url("/v1/chat/completions"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap()
}

fn allow_origin(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get("access-control-allow-origin")
        .map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test]
async fn allowed_origins_get_envoys_cors_answers_and_others_do_not() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        cp_args: vec![
            "--cors-allowed-origins".into(),
            ALLOWED.into(),
            "http://localhost:3000".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();

    let r = preflight(&stack, ALLOWED).await;
    assert_eq!(r.status(), 200);
    assert_eq!(allow_origin(&r).as_deref(), Some(ALLOWED));
    let methods = r.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap();
    assert!(methods.contains("POST"), "{methods}");
    let headers = r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap();
    assert!(headers.contains("authorization"), "{headers}");
    let r = preflight(&stack, "http://localhost:3000").await;
    assert_eq!(allow_origin(&r).as_deref(), Some("http://localhost:3000"));

    let r = preflight(&stack, "https://evil.example").await;
    assert_eq!(allow_origin(&r), None, "{:?}", r.headers());

    let r = reqwest::Client::new()
        .post(stack.url("/v1/chat/completions"))
        .header("origin", ALLOWED)
        .json(&json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(allow_origin(&r).as_deref(), Some(ALLOWED));

    // Preflights never reached the worker.
    let methods: Vec<_> = stack.workers[0]
        .requests()
        .await
        .into_iter()
        .map(|r| r["method"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(!methods.iter().any(|m| m == "OPTIONS"), "{methods:?}");
    assert!(
        stack
            .control_plane_log()
            .contains("--cors-allowed-origins (sglang-router's)"),
        "the flag is accepted with how it is answered"
    );
}

#[tokio::test]
async fn without_the_flag_no_origin_is_allowed() {
    let stack = Stack::with_workers(1).await;
    let r = preflight(&stack, ALLOWED).await;
    assert_eq!(allow_origin(&r), None, "{:?}", r.headers());
}
