//! smg 1.13.0's tenant flags on admission control: a tenant over its
//! request rate (`--tenant-rate-limit-*`) gets smg's 429 while another
//! tenant is served; the tenant header counts only with
//! `--trust-tenant-header`; with `--priority-scheduler-enabled` a waiting
//! request of a higher `x-smg-priority` class goes before lower ones.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use sglang_envoy_e2e::{wait_until, Stack, StackOptions};

/// A YAML file for the control plane, unique to this test process.
fn yaml_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "sglang-envoy-tenants-{}-{name}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, text).unwrap();
    path
}

async fn stack(cp_args: Vec<String>) -> Stack {
    Stack::start(StackOptions {
        workers: 1,
        cp_args,
        ..Default::default()
    })
    .await
    .unwrap()
}

/// One `/generate` with these headers: its status and OpenAI error type.
async fn send(stack: &Stack, headers: &[(&str, &str)], tokens: u32) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(stack.url("/generate"))
        .header("content-type", "application/json")
        .body(json!({"text": "x", "sampling_params": {"max_new_tokens": tokens}}).to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let r = request.send().await.unwrap();
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap_or_default();
    (
        status,
        v["error"]["type"].as_str().unwrap_or_default().to_string(),
    )
}

const TENANT: &str = "x-smg-tenant-id";

fn rate_args(trust: bool) -> Vec<String> {
    // Two requests a minute for this test's client (`ip:127.0.0.1`, the
    // tenant of a request with no other identity) and for any header
    // tenant; a third within the test's few seconds is over the rate.
    // Anyone else (`anonymous`, were the address lost) has plenty.
    let config = yaml_file(
        if trust { "trusted" } else { "untrusted" },
        "default_policy:\n  tokens_per_minute: 100000\n  requests_per_minute: 2\n\
         tenants:\n\
         - tenant_key: anonymous\n  tokens_per_minute: 100000\n  requests_per_minute: 1000\n",
    );
    let mut args = vec![
        "--tenant-rate-limit-enabled".to_string(),
        "--tenant-rate-limit-config".to_string(),
        config.display().to_string(),
    ];
    if trust {
        args.push("--trust-tenant-header".to_string());
    }
    args
}

#[tokio::test]
async fn a_tenant_over_its_rate_is_refused_while_another_is_served() {
    let stack = stack(rate_args(true)).await;
    let red = [(TENANT, "red")];
    assert_eq!(send(&stack, &red, 1).await.0, 200);
    assert_eq!(send(&stack, &red, 1).await.0, 200);
    assert_eq!(
        send(&stack, &red, 1).await,
        (429, "tenant_rate_limit_exceeded".to_string())
    );
    // Another tenant has its own rate.
    let blue = [(TENANT, "blue")];
    assert_eq!(send(&stack, &blue, 1).await.0, 200);
    assert_eq!(
        stack.workers[0].served().await,
        3,
        "the refused one never reached it"
    );
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn an_untrusted_tenant_header_is_ignored() {
    // Without --trust-tenant-header every request from this client is one
    // tenant, its address as Envoy saw it (not `anonymous`, which may send
    // many), whatever header it sends.
    let stack = stack(rate_args(false)).await;
    assert_eq!(send(&stack, &[(TENANT, "red")], 1).await.0, 200);
    assert_eq!(send(&stack, &[(TENANT, "blue")], 1).await.0, 200);
    assert_eq!(
        send(&stack, &[(TENANT, "green")], 1).await,
        (429, "tenant_rate_limit_exceeded".to_string())
    );
}

#[tokio::test]
async fn a_waiting_interactive_request_goes_before_waiting_bulk_ones() {
    let stack = stack(vec![
        "--max-concurrent-requests".into(),
        "1".into(),
        "--priority-scheduler-enabled".into(),
        // smg clamps every tenant to `default` unless told otherwise.
        "--priority-scheduler-default-max-class".into(),
        "interactive".into(),
    ])
    .await;
    let worker = &stack.workers[0];
    worker
        .configure(json!({"stall": true, "decode_us_per_token": 50_000}))
        .await;
    let spawn = |priority: &'static str| {
        let url = stack.url("/generate");
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(url)
                .header("content-type", "application/json")
                .header("x-smg-priority", priority)
                .body(json!({"text": "x", "sampling_params": {"max_new_tokens": 4}}).to_string())
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), Instant::now())
        })
    };
    let gauge = |name: &'static str, value: f64| {
        let stack = &stack;
        async move {
            wait_until(Duration::from_secs(10), || async {
                stack.metric(name).await == value
            })
            .await
        }
    };
    // One bulk request holds the only slot at the stalled worker...
    let first = spawn("bulk");
    assert!(gauge("sgl_router_admission_in_flight", 1.0).await);
    // ...two more bulk ones queue, then an interactive one.
    let bulk = [spawn("bulk"), spawn("bulk")];
    assert!(gauge("sgl_router_admission_queued", 2.0).await);
    let interactive = spawn("interactive");
    assert!(gauge("sgl_router_admission_queued", 3.0).await);
    worker.configure(json!({"stall": false})).await;
    let (status, first_done) = first.await.unwrap();
    assert_eq!(status, 200);
    let (status, urgent_done) = interactive.await.unwrap();
    assert_eq!(status, 200);
    for b in bulk {
        let (status, done) = b.await.unwrap();
        assert_eq!(status, 200);
        assert!(
            urgent_done < done,
            "a bulk request finished before the interactive one"
        );
    }
    assert!(first_done < urgent_done);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}
