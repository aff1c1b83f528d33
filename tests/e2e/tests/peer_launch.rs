//! Launch lines copied from sglang-router deployments: the flags this
//! router takes differently are accepted (and `--prometheus-port` serves
//! the metrics there), the ones it cannot honour stop the control plane
//! with a message naming the flag and the table in docs/flags.md.

use std::process::Command;

use serde_json::json;
use sglang_envoy_e2e::{free_port, release_bin, Stack, StackOptions};

/// Sums the samples of `name` in Prometheus text.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn an_sglang_router_launch_line_starts_and_serves_metrics_on_its_port() {
    let prometheus = free_port();
    let line = format!(
        "--port 30000 --log-dir /var/log/router --backend sglang --history-backend memory \
         --request-id-headers x-request-id x-trace-id --shutdown-grace-period-secs 30 \
         --prometheus-host 127.0.0.1 --prometheus-port {prometheus} --eviction-interval-secs 120 \
         --prometheus-duration-buckets 0.05 0.5 5 --rate-limit-tokens-per-second 50"
    );
    let stack = Stack::start(StackOptions {
        workers: 2,
        cp_args: line.split_whitespace().map(String::from).collect(),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = reqwest::Client::new()
        .post(stack.url("/v1/chat/completions"))
        .json(&json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        stack
            .wait_loads_zero(std::time::Duration::from_secs(5))
            .await
    );
    let text = reqwest::get(format!("http://127.0.0.1:{prometheus}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(sample(&text, "sgl_router_requests_total"), 1.0, "{text}");
    assert_eq!(
        sample(&text, "sgl_router_requests_total"),
        stack.metric("sgl_router_requests_total").await,
        "the same registry as the admin port's"
    );
    // The request duration histogram has the launch line's buckets.
    let bounds: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("sgl_router_request_duration_seconds_bucket"))
        .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(bounds, ["0.05", "0.5", "5.0", "+Inf"], "{text}");
    // The accepted flags are logged with what this router does instead
    // (`--shutdown-grace-period-secs` is its own: nothing to say).
    let log = stack.control_plane_log();
    assert!(!log.contains("--shutdown-grace-period-secs (sglang-router's)"));
    for flag in [
        "--port",
        "--log-dir",
        "--request-id-headers",
        "--rate-limit-tokens-per-second",
    ] {
        assert!(
            log.contains(&format!("{flag} (sglang-router's)")),
            "{flag}: {log}"
        );
    }
}

#[test]
fn a_flag_this_router_cannot_honour_stops_it_with_the_flag_named() {
    for (flag, value) in [("--backend", "openai"), ("--history-backend", "postgres")] {
        let out = Command::new(release_bin("sglang-envoy-control-plane"))
            .args(["--worker-urls", "http://127.0.0.1:1", flag, value])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("{flag} is an sglang-router flag"))
                && stderr.contains("\"sglang-router flags\", row"),
            "{flag}: {stderr}"
        );
    }
}

#[tokio::test]
async fn disable_health_check_routes_to_workers_whose_health_endpoint_fails() {
    let stack = Stack::start(StackOptions {
        workers: 2,
        cp_args: vec![
            "--disable-health-check".into(),
            "--health-check-endpoint".into(),
            "/no-such-path".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    // Probed, these workers would never be healthy: the path is a 404.
    let probe = reqwest::get(format!(
        "http://{}/no-such-path",
        stack.workers[0].address()
    ))
    .await
    .unwrap();
    assert_eq!(probe.status(), 404);
    let workers = stack.get_json("/workers").await;
    let listed = workers["workers"].as_array().unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|w| w["healthy"] == true), "{workers}");
    for i in 0..4 {
        let r = reqwest::Client::new()
            .post(stack.url("/generate"))
            .json(&json!({"text": format!("hello {i}"), "sampling_params": {"max_new_tokens": 1}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}
