//! The deploy/ gateway recipes on a real Envoy: for Istio's EnvoyFilter and
//! Envoy Gateway's ext_proc and wasm variants, the Envoy config the gateway's
//! control plane generates from the recipe (`sglang_envoy_e2e::gateway`) runs
//! the router in front of simulated workers: routing, streaming, long
//! prompts, failover and prefill/decode disaggregation.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sglang_envoy_e2e::gateway::envoy_gateway::{self, Variant};
use sglang_envoy_e2e::gateway::istio;
use sglang_envoy_e2e::{
    expect_openai_error, free_port, wait_until, EnvoyConfig, FrontDoor, PdOptions, Stack,
    StackOptions,
};

/// What each recipe must give the router, in the config the gateway
/// generates from it (the tests below show Envoy acting on it).
#[test]
fn generated_configs_carry_what_the_router_needs() {
    let max_body = 33_554_432u64;
    // Istio: the filter, the raised buffer and the routing only on the
    // Gateway's port; the worker cluster resolves the Service itself.
    let b = istio::generate().unwrap();
    let listeners = b["static_resources"]["listeners"].as_sequence().unwrap();
    for l in listeners {
        let port = l["address"]["socket_address"]["port_value"]
            .as_u64()
            .unwrap();
        let hcm = &l["filter_chains"][0]["filters"][0]["typed_config"];
        let names: Vec<&str> = hcm["http_filters"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(|f| f["name"].as_str())
            .collect();
        let ours = port == istio::gateway_port();
        assert_eq!(
            names.contains(&"sglang.router"),
            ours,
            "port {port}: {names:?}"
        );
        let limit = l["per_connection_buffer_limit_bytes"].as_u64();
        assert_eq!(limit.is_some_and(|n| n > max_body), ours, "port {port}");
        if ours {
            let i = names.iter().position(|n| *n == "sglang.router").unwrap();
            assert_eq!(names[i + 1], "envoy.filters.http.router");
        }
    }
    let workers = b["static_resources"]["clusters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sglang_workers")
        .unwrap();
    assert_eq!(workers["type"], "STRICT_DNS");
    assert!(workers["eds_cluster_config"].is_null());

    // Envoy Gateway: the client buffer above the body limit, the filter
    // enabled on the route, ext_proc's settings.
    for variant in [Variant::ExtProc, Variant::Wasm] {
        let b = envoy_gateway::generate(variant).unwrap();
        let l = &b["static_resources"]["listeners"][0];
        assert!(l["per_connection_buffer_limit_bytes"].as_u64().unwrap() > max_body);
        let hcm = &l["filter_chains"][0]["filters"][0]["typed_config"];
        let filter = &hcm["http_filters"][0];
        let route = &hcm["route_config"]["virtual_hosts"][0]["routes"][0];
        let name = filter["name"].as_str().unwrap();
        assert!(
            route["typed_per_filter_config"][name].is_mapping(),
            "{name} enabled on the route"
        );
        let tc = &filter["typed_config"];
        match variant {
            Variant::ExtProc => {
                assert_eq!(tc["allow_mode_override"], true);
                assert_eq!(tc["response_attributes"][0], "upstream.address");
                assert_eq!(tc["processing_mode"]["request_body_mode"], "BUFFERED");
                let timeout: f64 = tc["message_timeout"]
                    .as_str()
                    .unwrap()
                    .trim_end_matches('s')
                    .parse()
                    .unwrap();
                assert!(
                    timeout >= 1800.0,
                    "PD holds a response while its prefill runs"
                );
            }
            Variant::Wasm => {
                assert_eq!(tc["config"]["allow_on_headers_stop_iteration"], true);
                assert_eq!(tc["config"]["failure_policy"], "FAIL_RELOAD");
            }
        }
    }
}

/// A stack whose Envoy runs `config`; `pd`: one prefill, one decode worker.
async fn stack(config: EnvoyConfig, pd: bool) -> Stack {
    Stack::start(StackOptions {
        policy: if pd { "round_robin" } else { "cache_aware" }.into(),
        pd: pd.then(PdOptions::default),
        envoy_config: Some(config),
        // Slow health checks: the failover check kills a worker and needs
        // Envoy, not a health check racing it, to find out. The
        // destination as deploy/control-plane.yaml has the recipes' control
        // plane write it.
        cp_args: vec![
            "--health-check-interval-secs".into(),
            "30".into(),
            "--destination-endpoints".into(),
            recipe_control_plane_flag("--destination-endpoints"),
        ],
        ..Default::default()
    })
    .await
    .expect("the stack starts with the gateway-shaped config")
}

/// The value after `flag` in deploy/control-plane.yaml's launch line.
fn recipe_control_plane_flag(flag: &str) -> String {
    let docs = sglang_envoy_e2e::gateway::recipe_docs("deploy/control-plane.yaml");
    let deployment =
        sglang_envoy_e2e::gateway::find_doc(&docs, "Deployment", Some("sglang-control-plane"));
    let args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .expect("the control plane's args")
        .iter()
        .map(sglang_envoy_e2e::gateway::text)
        .collect();
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("deploy/control-plane.yaml has no {flag}"));
    args[i + 1].clone()
}

/// `sgl_router_request_errors_total{reason=...}` (0 when absent).
async fn errors(stack: &Stack, reason: &str) -> f64 {
    let label = format!("reason=\"{reason}\"");
    stack
        .metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("sgl_router_request_errors_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every worker's load is back to zero (read on the admin port: the
/// recipes keep the admin API off the client port).
async fn loads_return_to_zero(stack: &Stack) -> bool {
    let url = stack.admin_url("/get_loads");
    wait_until(Duration::from_secs(5), || async {
        let Ok(r) = reqwest::get(&url).await else {
            return false;
        };
        let v: Value = r.json().await.unwrap_or_default();
        let loads = v["workers"].as_array().cloned().unwrap_or_default();
        !loads.is_empty() && loads.iter().all(|w| w["load"] == 0)
    })
    .await
}

fn chat(content: &str, stream: bool) -> String {
    json!({"model": "m", "max_tokens": 5, "stream": stream,
           "messages": [{"role": "user", "content": content}]})
    .to_string()
}

/// The workers (indexes) that received a request whose body contains
/// `needle` (the simulators keep their latest requests).
async fn receivers(stack: &Stack, needle: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, w) in stack.workers.iter().enumerate() {
        let got = w.requests().await.iter().any(|r| {
            r["method"] == "POST" && r["body"].as_str().is_some_and(|b| b.contains(needle))
        });
        if got {
            out.push(i);
        }
    }
    out
}

/// Routing, streaming, long prompts and unserved paths through a regular
/// fleet of two workers, then failover when one dies.
async fn regular_fleet(config: EnvoyConfig) -> Stack {
    let mut stack = stack(config, false).await;

    // Routing: the control plane's choice is where the request goes, so a
    // prompt that shares a long prefix follows the cache to one worker.
    let prefix = "You are a meticulous assistant. ".repeat(40);
    let mut holders = Vec::new();
    for i in 0..6 {
        let question = format!("question number {i} of the routing check");
        let body = json!({"text": format!("{prefix} {question}"),
            "sampling_params": {"max_new_tokens": 2}});
        let r = stack.post("/generate", &body.to_string()).await;
        assert_eq!(r.status(), 200, "request {i}");
        let got = receivers(&stack, &question).await;
        assert_eq!(got.len(), 1, "request {i} reached {got:?}");
        holders.push(got[0]);
    }
    // After the first, every one follows the cached prefix.
    let favourite = holders[1];
    assert!(
        holders[1..].iter().all(|&h| h == favourite),
        "cache-aware routing followed the prefix: {holders:?}"
    );

    // Streaming: chunk by chunk to the end, counted as finished (not as a
    // client that hung up), loads released.
    let cancelled = errors(&stack, "client_cancelled").await;
    let r = stack
        .post("/v1/chat/completions", &chat("stream to me", true))
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let body = r.text().await.unwrap();
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert!(body.matches("data: ").count() >= 3, "{body}");
    assert!(loads_return_to_zero(&stack).await);
    assert_eq!(
        errors(&stack, "client_cancelled").await,
        cancelled,
        "a finished stream counted as cancelled"
    );

    // Long prompts pass (past Envoy Gateway's 32 KiB and Envoy's 1 MiB
    // default buffers) and reach the worker whole.
    for size in [1_000_000usize, 3 << 20] {
        let text = "a".repeat(size);
        let body = json!({"text": text, "sampling_params": {"max_new_tokens": 1}}).to_string();
        let r = stack.post("/generate", &body).await;
        assert_eq!(r.status(), 200, "a {size}-byte prompt");
        let longest = sglang_envoy_e2e::longest_body_received(&stack.workers).await;
        assert!(
            longest >= body.len(),
            "the worker got {longest} of {} bytes",
            body.len()
        );
    }
    // Larger than the router's limit: its JSON 413.
    let r = stack
        .post(
            "/generate",
            &format!("{{\"text\":\"{}\"}}", "a".repeat(33 << 20)),
        )
        .await;
    expect_openai_error(r, 413).await;
    // Only the served endpoints reach a worker.
    let r = stack.post("/flush_cache", "{}").await;
    expect_openai_error(r, 404).await;

    // Failover: the worker holding the prefix dies; the control plane still
    // chooses it for the prefix's requests until it learns of the death,
    // Envoy retries them on the other, they succeed, and the control plane
    // credits the worker that answered.
    stack.workers[favourite].kill();
    for i in 0..4 {
        let r = stack
            .post(
                "/generate",
                &json!({"text": format!("{prefix} after the crash {i}"),
            "sampling_params": {"max_new_tokens": 1}})
                .to_string(),
            )
            .await;
        assert_eq!(r.status(), 200, "request {i} after a worker died");
    }
    let s = &stack;
    assert!(
        wait_until(Duration::from_secs(5), || async move {
            s.metric("sgl_router_worker_failovers_total").await >= 1.0
        })
        .await,
        "no failover was reported"
    );
    stack
}

/// PD through the recipe: both halves, input logprobs merged into a
/// streamed answer, and a decode answer held 2 s while its prefill runs.
async fn pd_fleet(config: EnvoyConfig) {
    let stack = stack(config, true).await;
    let r = stack
        .post("/v1/chat/completions", &chat("Hello PD", false))
        .await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], 5, "{answer}");
    assert_eq!(stack.decodes[0].stats().await["kv_fetched"], 1);

    let body = json!({"text": "one two three four", "return_logprob": true, "stream": true,
                      "sampling_params": {"max_new_tokens": 3}});
    let text = stack
        .post("/generate", &body.to_string())
        .await
        .text()
        .await
        .unwrap();
    let first = sglang_envoy_e2e::first_sse_event(&text);
    assert!(
        first["meta_info"]["input_token_logprobs"]
            .as_array()
            .is_some_and(|l| !l.is_empty()),
        "the prefill's input logprobs are merged into the stream: {first}"
    );

    // The decode stream's headers come at once; they wait for the prefill,
    // stalled here for 2 s: a second within the workers' 3 s KV timeout,
    // which starts when the decode worker has the request, a little later.
    stack.prefills[0].configure(json!({"stall": true})).await;
    let started = Instant::now();
    let slow = chat("a slow prefill", true);
    let pending = stack.post("/v1/chat/completions", &slow);
    let unstall = async {
        tokio::time::sleep(Duration::from_millis(2000)).await;
        stack.prefills[0].configure(json!({"stall": false})).await;
    };
    let (r, ()) = tokio::join!(pending, unstall);
    assert_eq!(
        r.status(),
        200,
        "a decode answer held {:?}",
        started.elapsed()
    );
    let text = r.text().await.unwrap();
    assert!(
        text.trim_end().ends_with("data: [DONE]") && !text.contains("\"error\""),
        "{text}"
    );
    assert!(started.elapsed() >= Duration::from_millis(2000));
    assert!(loads_return_to_zero(&stack).await);
}

#[tokio::test]
async fn istio_recipe_routes_streams_and_fails_over() {
    if skip() {
        return;
    }
    let other = free_port();
    let stack = regular_fleet(istio::config(other)).await;
    // The other server of the shared gateway is left alone: no router, no
    // raised buffer limit.
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{other}/generate"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "the other application");
    drop(stack);
}

#[tokio::test]
async fn istio_recipe_serves_pd() {
    if skip() {
        return;
    }
    pd_fleet(istio::config(free_port())).await;
}

#[tokio::test]
async fn envoy_gateway_ext_proc_recipe_routes_streams_and_fails_over() {
    if skip() {
        return;
    }
    regular_fleet(envoy_gateway::config(Variant::ExtProc)).await;
}

#[tokio::test]
async fn envoy_gateway_ext_proc_recipe_serves_pd() {
    if skip() {
        return;
    }
    pd_fleet(envoy_gateway::config(Variant::ExtProc)).await;
}

#[tokio::test]
async fn envoy_gateway_wasm_recipe_routes_streams_and_fails_over() {
    if skip() {
        return;
    }
    regular_fleet(envoy_gateway::config(Variant::Wasm)).await;
}

#[tokio::test]
async fn envoy_gateway_wasm_recipe_serves_pd() {
    if skip() {
        return;
    }
    pd_fleet(envoy_gateway::config(Variant::Wasm)).await;
}

/// These tests choose their own front door: run them once, in the default
/// (wasm) pass of scripts/test.sh, not again in the ext_proc pass.
fn skip() -> bool {
    let skip = FrontDoor::current() != FrontDoor::Wasm;
    if skip {
        eprintln!("skipped: the recipes choose their own front door");
    }
    skip
}
