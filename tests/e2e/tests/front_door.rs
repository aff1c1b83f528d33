//! Behaviour that differs between the front doors (the wasm filter and
//! Envoy's ext_proc filter), or that one of them has to get right in its own
//! way. The rest of the suite runs unchanged through either front door
//! (`SGLANG_ENVOY_FRONT_DOOR`).

use std::path::Path;
use std::time::{Duration, Instant};

use sglang_envoy_e2e::{
    expect_openai_error, wait_until, FrontDoor, PdOptions, Stack, StackOptions, KV_TIMEOUT_MS,
};

/// ext_proc mode: with the control plane dead, requests keep flowing to the
/// workers Envoy last learnt through EDS (its fallback round robin), and a
/// client still cannot choose the worker. (The wasm filter falls back to
/// the workers it last knew as healthy, `outage.rs`, and fails closed only
/// without any: `errors::control_plane_down_with_no_healthy_worker_known_is_a_prompt_answer`.)
/// The picker setup (full-duplex bodies) cannot fail open: Envoy has handed
/// the body to the control plane. With the control plane dead each request
/// gets a prompt JSON 503 and reaches no worker; once it is back, requests
/// are routed again.
#[tokio::test]
async fn a_picker_fails_closed_at_once_and_routes_again_when_back() {
    if FrontDoor::current() != FrontDoor::Picker {
        eprintln!("skipped: the picker setup only");
        return;
    }
    let mut stack = Stack::with_workers(1).await;
    assert_eq!(
        stack.post("/generate", r#"{"text":"a"}"#).await.status(),
        200
    );
    stack.kill_control_plane();
    for i in 0..5 {
        let started = Instant::now();
        let r = stack
            .post("/generate", &format!(r#"{{"text":"b{i}"}}"#))
            .await;
        expect_openai_error(r, 503).await;
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        stack.workers[0].served().await,
        1,
        "no request went unrouted"
    );
    stack.restart_control_plane().await.unwrap();
    let s = &stack;
    assert!(
        wait_until(Duration::from_secs(10), || async move {
            s.post("/generate", r#"{"text":"c"}"#).await.status() == 200
        })
        .await
    );
}

#[tokio::test]
async fn ext_proc_fails_open_when_the_control_plane_dies() {
    if FrontDoor::current() != FrontDoor::ExtProc {
        eprintln!("skipped: only the ext_proc front door fails open");
        return;
    }
    let mut stack = Stack::with_workers(2).await;
    assert_eq!(
        stack
            .post("/generate", r#"{"text":"before"}"#)
            .await
            .status(),
        200
    );
    stack.kill_control_plane();
    let target = stack.workers[0]
        .url
        .trim_start_matches("http://")
        .to_string();
    for i in 0..10 {
        let started = Instant::now();
        let r = reqwest::Client::new()
            .post(stack.url("/generate"))
            .header("x-gateway-destination-endpoint", &target)
            .body(format!(
                r#"{{"text":"after {i}","sampling_params":{{"max_new_tokens":1}}}}"#
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            200,
            "request {i} failed with the control plane down"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    let (a, b) = (
        stack.workers[0].served().await,
        stack.workers[1].served().await,
    );
    assert_eq!(a + b, 11);
    assert!(
        a >= 3 && b >= 3,
        "fallback round robin spreads requests (and ignores the client's header): {a} / {b}"
    );
    let r = stack
        .post(
            "/v1/chat/completions",
            r#"{"model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().trim_end().ends_with("data: [DONE]"));
}

/// A prefill that fails while the decode half waits for its KV reaches the
/// client at once, not when the decode gives up; the decode is cancelled.
#[tokio::test]
async fn a_failing_prefill_ends_the_request_before_the_decode_gives_up() {
    let stack = Stack::start(StackOptions {
        policy: "round_robin".into(),
        pd: Some(PdOptions::default()),
        ..Default::default()
    })
    .await
    .unwrap();
    stack.prefills[0]
        .configure(serde_json::json!({"fail_status": 503}))
        .await;
    for stream in [false, true] {
        let started = Instant::now();
        let body = format!(
            r#"{{"model":"m","stream":{stream},"max_tokens":4,"messages":[{{"role":"user","content":"doomed"}}]}}"#
        );
        let r = stack.post("/v1/chat/completions", &body).await;
        let message = expect_openai_error(r, 503).await;
        assert!(message.contains("prefill"), "{message}");
        assert!(
            started.elapsed() < Duration::from_millis(KV_TIMEOUT_MS / 2),
            "stream={stream}: the error waited for the decode: {:?}",
            started.elapsed()
        );
    }
    let d = &stack.decodes[0];
    assert!(
        wait_until(Duration::from_secs(KV_TIMEOUT_MS / 1000 + 2), || async {
            d.stats().await["in_flight"] == 0
        })
        .await
    );
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

/// The control plane learns which worker served each request (wasm: the
/// `upstream.address` property; ext_proc: the response attribute), so
/// failovers away from a dead worker are counted and reported.
#[tokio::test]
async fn failovers_are_reported_to_the_control_plane() {
    let mut stack = Stack::start(StackOptions {
        workers: 2,
        policy: "round_robin".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    stack.workers[0].kill();
    // Round robin keeps choosing the dead worker until it is noticed; Envoy
    // retries those requests on the fallback endpoint.
    for _ in 0..4 {
        let r = stack
            .post(
                "/generate",
                r#"{"text":"x","sampling_params":{"max_new_tokens":1}}"#,
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    let stack = &stack;
    let counted = wait_until(Duration::from_secs(5), || async move {
        failovers(stack).await >= 1.0
    })
    .await;
    assert!(counted, "no failover was reported");
}

/// `sgl_router_worker_failovers_total` from the metrics.
async fn failovers(stack: &Stack) -> f64 {
    let Ok(r) = reqwest::get(stack.url("/metrics")).await else {
        return 0.0;
    };
    r.text()
        .await
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("sgl_router_worker_failovers_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The two Envoy configs differ only in the HTTP filters: listeners, routes
/// (the per-route `disabled` works for either filter, both named
/// `sglang.router`) and clusters are the same text, comments aside.
#[test]
fn both_envoy_configs_share_everything_but_the_filter() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let read = |name: &str| {
        std::fs::read_to_string(root.join(name))
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .map(|l| l.split(" # ").next().unwrap_or(l).trim_end().to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (wasm, ext_proc) = (read("envoy/envoy.yaml"), read("envoy/envoy-ext-proc.yaml"));
    let parts = |text: &str| {
        let filters = text.find("          http_filters:").unwrap();
        let clusters = text.find("\n  clusters:").unwrap();
        (text[..filters].to_string(), text[clusters..].to_string())
    };
    let (wasm_head, wasm_clusters) = parts(&wasm);
    let (ext_head, ext_clusters) = parts(&ext_proc);
    assert_eq!(wasm_head, ext_head, "listeners and routes differ");
    assert_eq!(wasm_clusters, ext_clusters, "clusters differ");
    assert!(ext_proc.contains("failure_mode_allow: true"));
}
