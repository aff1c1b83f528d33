//! The control plane as an InferencePool's endpoint picker behind each
//! shape of gateway Envoy config ([`Shape`]): the destination read by
//! `override_host` from `envoy.lb` metadata, or by an `ORIGINAL_DST`
//! cluster from the header; the picker over TLS or plaintext; failing open
//! or closed. Through each: what the destination holds, chat, SSE, a 5 MB
//! body and an info GET, routing quality (distinct prompts spread, shared
//! prefixes stick, loads return to zero), a dead fleet answered by the
//! picker's own JSON 503 after one failed request, and a dead picker.
//!
//! These choose their own setup: they run once, in the picker pass of
//! scripts/test.sh.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};
use sglang_envoy_e2e::gateway::picker::{Reads, Shape};
use sglang_envoy_e2e::{expect_openai_error, FrontDoor, Stack, StackOptions};

/// The header the router marks its own replies with.
const ROUTER_REPLY: &str = "x-sglang-envoy-error";

fn skip() -> bool {
    let skip = FrontDoor::current() != FrontDoor::Picker;
    if skip {
        eprintln!("skipped: these choose their own picker setup (run in the picker pass)");
    }
    skip
}

async fn start(shape: Shape) -> Stack {
    Stack::start(StackOptions {
        workers: 3,
        picker: Some(shape),
        // Slow health checks: a dead fleet must be learnt from what Envoy
        // reports of failed requests, not from a scheduled check.
        cp_args: vec!["--health-check-interval-secs".into(), "30".into()],
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{shape:?}: the stack starts: {e}"))
}

/// A chat body with `content` as its one user message.
fn chat(content: &str, stream: bool) -> String {
    json!({"model": "m", "messages": [{"role": "user", "content": content}],
        "max_tokens": 2, "stream": stream})
    .to_string()
}

/// Inference requests each worker has served so far.
async fn served(stack: &Stack) -> Vec<u64> {
    let mut out = Vec::new();
    for w in &stack.workers {
        out.push(w.served().await);
    }
    out
}

/// Which worker got the request whose body holds `marker`, and the
/// destination header it arrived with.
async fn receiver(stack: &Stack, marker: &str) -> (usize, String) {
    for (i, w) in stack.workers.iter().enumerate() {
        for r in w.requests().await {
            if r["body"].as_str().is_some_and(|b| b.contains(marker)) {
                let header = r["headers"]["x-gateway-destination-endpoint"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                return (i, header);
            }
        }
    }
    panic!("no worker got the request marked {marker}");
}

/// What the destination holds: the serving worker alone where the
/// gateway takes one endpoint; that worker first, then distinct fallbacks
/// where it walks a list.
async fn destination_fits_the_gateway(stack: &Stack, shape: Shape) {
    for i in 0..4 {
        let marker = format!("destination check {i}");
        let r = stack
            .post("/generate", &json!({"text": marker}).to_string())
            .await;
        assert_eq!(r.status(), 200, "{shape:?}: {}", r.text().await.unwrap());
        let (worker, header) = receiver(stack, &marker).await;
        let entries: Vec<&str> = header.split(',').collect();
        assert_eq!(entries[0], stack.workers[worker].address(), "{shape:?}");
        let distinct: HashSet<&str> = entries.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            entries.len(),
            "{shape:?}: repeats in {header}"
        );
        match shape.reads {
            Reads::OriginalDstHeader => assert_eq!(entries.len(), 1, "{shape:?}: {header}"),
            Reads::OverrideHostMetadata => assert_eq!(entries.len(), 3, "{shape:?}: {header}"),
        }
    }
}

/// Chat, an SSE stream to its end, a 5 MB body whole, an info GET.
async fn requests_of_every_kind_are_served(stack: &Stack, shape: Shape) {
    let r = stack
        .post("/v1/chat/completions", &chat("hello", false))
        .await;
    assert_eq!(r.status(), 200, "{shape:?}");
    let v: Value = r.json().await.unwrap();
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");

    let r = stack
        .post("/v1/chat/completions", &chat("stream to me", true))
        .await;
    assert_eq!(r.status(), 200, "{shape:?}");
    let body = r.text().await.unwrap();
    assert!(
        body.trim_end().ends_with("data: [DONE]"),
        "{shape:?}: {body}"
    );

    let text = "b".repeat(5 << 20);
    let big = json!({"text": text, "sampling_params": {"max_new_tokens": 1}}).to_string();
    let r = stack.post("/generate", &big).await;
    assert_eq!(r.status(), 200, "{shape:?}: a 5 MB body");
    let longest = sglang_envoy_e2e::longest_body_received(&stack.workers).await;
    assert!(
        longest >= big.len(),
        "{shape:?}: {longest} of {} bytes",
        big.len()
    );

    let r = reqwest::get(stack.url("/v1/models")).await.unwrap();
    assert_eq!(r.status(), 200, "{shape:?}: an info GET");
}

/// Distinct prompts spread over the workers; prompts that share a long
/// prefix follow it to one worker; every load returns to zero.
async fn routing_follows_the_cache(stack: &Stack, shape: Shape) {
    let before = served(stack).await;
    for i in 0..30 {
        // 400 characters, distinct from the first one on.
        let prompt: String = format!("{i:03} ")
            .chars()
            .chain((0..396).map(|j| (b'a' + ((i * 7 + j * 13 + j / 5) % 26) as u8) as char))
            .collect();
        let r = stack
            .post("/v1/chat/completions", &chat(&prompt, false))
            .await;
        assert_eq!(r.status(), 200, "{shape:?}");
    }
    let after = served(stack).await;
    let spread: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(
        spread.iter().all(|&n| n >= 5),
        "{shape:?}: 30 distinct prompts over 3 workers went {spread:?}"
    );

    let prefix = "You are a careful assistant who answers briefly. ".repeat(40);
    let mut holders = Vec::new();
    for i in 0..6 {
        let marker = format!("shared prefix question {i}");
        let r = stack
            .post(
                "/v1/chat/completions",
                &chat(&format!("{prefix}{marker}"), false),
            )
            .await;
        assert_eq!(r.status(), 200, "{shape:?}");
        holders.push(receiver(stack, &marker).await.0);
    }
    assert!(
        holders.iter().all(|&h| h == holders[0]),
        "{shape:?}: a shared prefix went to {holders:?}"
    );
    assert!(
        stack.wait_loads_zero(Duration::from_secs(5)).await,
        "{shape:?}: loads {:?}",
        stack.loads().await
    );
}

/// Every worker killed: one request fails however the gateway fails it;
/// from then on (within a second or two, not a health-check interval) the
/// picker answers with its own JSON 503 and names no dead endpoint.
async fn a_dead_fleet_is_answered_by_the_picker(stack: &mut Stack, shape: Shape) {
    for w in &mut stack.workers {
        w.kill();
    }
    let first = stack
        .post("/generate", r#"{"text":"to a dead fleet"}"#)
        .await;
    assert!(
        first.status().is_server_error(),
        "{shape:?}: {}",
        first.status()
    );
    let mut answered = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let r = stack.post("/generate", r#"{"text":"still dead"}"#).await;
        if r.headers().contains_key(ROUTER_REPLY) {
            answered = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answered =
        answered.unwrap_or_else(|| panic!("{shape:?}: the picker kept naming dead endpoints"));
    let message = expect_openai_error(answered, 503).await;
    assert!(message.contains("no healthy"), "{shape:?}: {message}");
    let workers = stack.get_json("/workers").await;
    let listed = workers["workers"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 3, "{workers}");
    assert!(
        listed.iter().all(|w| w["healthy"] == Value::Bool(false)),
        "{shape:?}: {workers}"
    );
}

/// A picker that fails closed answers 503 when it is gone (JSON, by the
/// shipped local replies).
async fn a_closed_gateway_refuses_without_its_picker(stack: &mut Stack, shape: Shape) {
    stack.kill_control_plane();
    let r = stack.post("/generate", r#"{"text":"no picker"}"#).await;
    expect_openai_error(r, 503).await;
    assert!(!shape.fail_open);
}

async fn through(shape: Shape) {
    let mut stack = start(shape).await;
    // First, on empty trees: a 5 MB prompt fills one worker's tree, and
    // cache_aware then sends every new prompt to the others (by design:
    // the smallest tree has the most room) until they catch up.
    routing_follows_the_cache(&stack, shape).await;
    destination_fits_the_gateway(&stack, shape).await;
    requests_of_every_kind_are_served(&stack, shape).await;
    a_dead_fleet_is_answered_by_the_picker(&mut stack, shape).await;
    if !shape.fail_open {
        a_closed_gateway_refuses_without_its_picker(&mut stack, shape).await;
    }
}

/// GIE's own test config and Envoy AI Gateway's fail-close pools.
#[tokio::test]
async fn original_dst_on_the_header_plaintext_failing_closed() {
    if skip() {
        return;
    }
    through(Shape {
        reads: Reads::OriginalDstHeader,
        tls: false,
        fail_open: false,
    })
    .await;
}

#[tokio::test]
async fn original_dst_on_the_header_over_tls_failing_open() {
    if skip() {
        return;
    }
    through(Shape {
        reads: Reads::OriginalDstHeader,
        tls: true,
        fail_open: true,
    })
    .await;
}

#[tokio::test]
async fn override_host_on_metadata_plaintext_failing_open() {
    if skip() {
        return;
    }
    through(Shape {
        reads: Reads::OverrideHostMetadata,
        tls: false,
        fail_open: true,
    })
    .await;
}

/// The suite's own setup (Istio, Envoy Gateway, kgateway).
#[tokio::test]
async fn override_host_on_metadata_over_tls_failing_closed() {
    if skip() {
        return;
    }
    through(Shape::SUITE).await;
}
