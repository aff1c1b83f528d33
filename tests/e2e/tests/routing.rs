//! Requests on every route reach a worker through Envoy and come back as the
//! worker sent them; the worker sees the client's body and headers unchanged.

use serde_json::{json, Value};
use sglang_envoy_e2e::{Stack, StackOptions};

/// Drops the fields that differ between two answers to the same request.
fn stable(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("created");
                m.remove("e2e_latency");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

#[tokio::test]
async fn every_route_reaches_a_worker_and_returns_its_answer() {
    let stack = Stack::with_workers(1).await;
    let worker = &stack.workers[0];
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": "m", "rid": "r-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        ),
        (
            "/v1/completions",
            json!({"model": "m", "rid": "r-cmpl", "prompt": "once upon", "max_tokens": 4}),
        ),
        (
            "/generate",
            json!({"rid": "r-gen", "text": "the sky is", "sampling_params": {"max_new_tokens": 4}}),
        ),
        ("/v1/embeddings", json!({"model": "m", "input": "embed me"})),
        (
            "/v1/rerank",
            json!({"query": "q", "documents": ["a", "b", "c"]}),
        ),
    ];
    let client = reqwest::Client::new();
    for (path, body) in cases {
        // Warm the worker's prefix cache so both answers compared below are
        // cache hits (the simulator reports cached_tokens like SGLang).
        client
            .post(format!("{}{path}", worker.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        let before = worker.served().await;
        let via = stack.post(path, &body.to_string()).await;
        assert_eq!(via.status(), 200, "{path}");
        let via: Value = via.json().await.unwrap();
        assert_eq!(
            worker.served().await,
            before + 1,
            "{path} did not reach the worker once"
        );
        let direct: Value = client
            .post(format!("{}{path}", worker.url))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            stable(via),
            stable(direct),
            "{path}: answer changed on the way"
        );
    }
}

#[tokio::test]
async fn info_routes_are_answered_by_a_worker() {
    let stack = Stack::start(StackOptions::default()).await.unwrap();
    for path in ["/v1/models", "/get_model_info", "/get_server_info"] {
        let r = reqwest::get(stack.url(path)).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let v: Value = r.json().await.unwrap();
        let expected_key = match path {
            "/v1/models" => "data",
            "/get_model_info" => "model_path",
            _ => "dp_size",
        };
        assert!(v.get(expected_key).is_some(), "{path}: {v}");
    }
}

#[tokio::test]
async fn body_and_headers_reach_the_worker_unchanged() {
    let stack = Stack::with_workers(1).await;
    // Floats that re-serialisation would change, unknown nested keys, an
    // unusual key order, escapes and whitespace.
    let body = "{\"temperature\": 0.7, \"top_p\":1e-7,\"max_tokens\":3,\n  \"zz_custom\": {\"b\": [1.10, {\"x\": null}], \"a\": \"\\u00e9\\n\"},\n  \"model\":\"m\", \"messages\":[{\"role\":\"user\",\"content\":\"hello\"}], \"seed\": 12345678901234567890 }";
    let r = reqwest::Client::new()
        .post(stack.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test")
        .header("x-request-id", "req-123")
        .header("x-trace-id", "trace-abc")
        .header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .header("x-custom", "kept")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = stack.workers[0].requests().await;
    let req = seen
        .iter()
        .rev()
        .find(|r| r["path"] == "/v1/chat/completions")
        .expect("the worker recorded the request");
    assert_eq!(req["body"].as_str(), Some(body), "body changed on the way");
    let h = &req["headers"];
    assert_eq!(h["authorization"], "Bearer sk-test");
    assert_eq!(h["x-request-id"], "req-123");
    assert_eq!(h["x-trace-id"], "trace-abc");
    assert_eq!(
        h["traceparent"],
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    );
    assert_eq!(h["x-custom"], "kept");
    assert_eq!(h["content-length"], body.len().to_string());
}

#[tokio::test]
async fn a_client_cannot_choose_the_worker() {
    let stack = Stack::start(StackOptions {
        workers: 2,
        policy: "round_robin".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    // Name worker 0's endpoint in the override header on every request: the
    // filter must drop it, so round robin still reaches both workers.
    let target = stack.workers[0]
        .url
        .trim_start_matches("http://")
        .to_string();
    for _ in 0..6 {
        let r = reqwest::Client::new()
            .post(stack.url("/generate"))
            .header("x-gateway-destination-endpoint", &target)
            .body(r#"{"text":"x","sampling_params":{"max_new_tokens":1}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(stack.workers[0].served().await, 3);
    assert_eq!(stack.workers[1].served().await, 3);
}

/// `--decision-cpu-metric`: every decision made for a request through
/// Envoy is timed in its thread's CPU as well as on the clock, and its CPU
/// time lies within its clock time; without the flag none is.
#[tokio::test]
async fn decisions_are_timed_in_cpu_only_when_asked() {
    let plain = Stack::with_workers(1).await;
    let measured = Stack::start(StackOptions {
        workers: 1,
        cp_args: vec!["--decision-cpu-metric".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let body =
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    for stack in [&plain, &measured] {
        for _ in 0..10 {
            let r = stack.post("/v1/chat/completions", &body.to_string()).await;
            assert_eq!(r.status(), 200);
        }
    }
    let wall = "sgl_router_decision_duration_seconds";
    let cpu = "sgl_router_decision_cpu_seconds";
    assert!(plain.metric(&format!("{wall}_count")).await >= 10.0);
    assert_eq!(plain.metric(&format!("{cpu}_count")).await, 0.0);
    let decisions = measured.metric(&format!("{wall}_count")).await;
    assert!(decisions >= 10.0, "{decisions} decisions");
    assert_eq!(measured.metric(&format!("{cpu}_count")).await, decisions);
    let wall_sum = measured.metric(&format!("{wall}_sum")).await;
    let cpu_sum = measured.metric(&format!("{cpu}_sum")).await;
    assert!(
        cpu_sum > 0.0 && cpu_sum <= wall_sum,
        "CPU {cpu_sum} s against {wall_sum} s on the clock"
    );
}
