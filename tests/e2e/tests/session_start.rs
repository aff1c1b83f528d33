//! A filter VM opens its session with the control plane on its root's tick
//! after its first request, and that request's question waits for it. The
//! root ticks fast while a question waits for a stream that is opening, so
//! a fresh Envoy's first request does not wait for two ticks.

use std::time::{Duration, Instant};

use serde_json::json;
use sglang_envoy_e2e::{FrontDoor, Stack, StackOptions};

/// The tick: the longest at which a VM's first questions still wait for
/// its first stream (`FIRST_WAIT_MAX_TICK`) rather than take calls.
const TICK_MS: u64 = 100;

#[tokio::test]
async fn a_fresh_vms_first_request_does_not_wait_for_its_ticks() {
    if FrontDoor::current() != FrontDoor::Wasm {
        eprintln!("the wasm filter's session only");
        return;
    }
    // One worker thread, one VM. The stack's readiness probe went through
    // it: a fresh Envoy's VM has served nothing.
    let mut stack = Stack::start(StackOptions {
        workers: 1,
        envoy_concurrency: 1,
        filter_options: format!(r#", "report_interval_ms": {TICK_MS}"#),
        ..Default::default()
    })
    .await
    .unwrap();
    stack.restart_envoy().await.unwrap();
    let asked = || stack.metric("sgl_router_filter_session_messages_total{kind=\"route\"}");
    let before = asked().await;
    let mut took = Vec::new();
    for i in 0..3 {
        let started = Instant::now();
        let body = json!({"model": "m", "prompt": format!("first {i}"), "max_tokens": 1});
        let r = stack.post("/v1/completions", &body.to_string()).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        took.push(started.elapsed());
    }
    // Its question went on the session, which it opened: not a call.
    assert_eq!(asked().await - before, 3.0, "questions on the session");
    // At one tick a period, the stream opens on a tick and the question
    // goes on the next: at least a whole tick. Fast ticks take a few ms.
    assert!(
        took[0] < Duration::from_millis(TICK_MS * 9 / 10),
        "the first request took {:?} (then {:?}, {:?}); the tick is {TICK_MS} ms",
        took[0],
        took[1],
        took[2]
    );
}
