//! Prefill/decode disaggregation through Envoy: the control plane sends the
//! prefill half, Envoy the decode half, and the simulated workers really do
//! the bootstrap handshake (decode fetches the KV of `bootstrap_room` from
//! the prefill's bootstrap port), so wrong fields fail these tests as they
//! would fail on GPUs.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use sglang_envoy_e2e::{
    expect_openai_error, venv_python, wait_until, FrontDoor, PdOptions, SimWorker, Stack,
    StackOptions, KV_TIMEOUT_MS,
};

async fn pd_stack(pd: PdOptions, policy: &str) -> Stack {
    Stack::start(StackOptions {
        policy: policy.into(),
        pd: Some(pd),
        ..Default::default()
    })
    .await
    .expect("the PD stack starts")
}

/// The bodies a worker received, parsed.
async fn bodies(w: &SimWorker) -> Vec<Value> {
    w.requests()
        .await
        .iter()
        .filter(|r| r["method"] == "POST")
        .filter_map(|r| serde_json::from_str(r["body"].as_str()?).ok())
        .collect()
}

async fn kv_fetched(w: &SimWorker) -> u64 {
    w.stats().await["kv_fetched"].as_u64().unwrap_or(0)
}

fn chat(content: &str, max_tokens: u32, stream: bool) -> String {
    json!({
        "model": "m",
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string()
}

#[tokio::test]
async fn both_halves_get_the_same_bootstrap_fields_and_the_client_the_decode_answer() {
    let stack = pd_stack(PdOptions::default(), "round_robin").await;
    let r = stack
        .post(
            "/v1/chat/completions",
            &chat("Hello, how are you?", 7, false),
        )
        .await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    // The prefill worker generates one token; the client sees the decode's 7.
    assert_eq!(answer["usage"]["completion_tokens"], 7, "{answer}");

    let (p, d) = (&stack.prefills[0], &stack.decodes[0]);
    let (pb, db) = (bodies(p).await, bodies(d).await);
    assert_eq!((pb.len(), db.len()), (1, 1), "one request each");
    let (pb, db) = (&pb[0], &db[0]);
    for key in ["rid", "bootstrap_host", "bootstrap_port", "bootstrap_room"] {
        assert_eq!(pb[key], db[key], "{key} differs");
    }
    assert_eq!(pb["bootstrap_host"], "127.0.0.1");
    assert_eq!(pb["bootstrap_port"], p.bootstrap_port.unwrap());
    let room = pb["bootstrap_room"].as_u64().expect("room is an integer");
    assert!(room <= i64::MAX as u64);
    let rid = pb["rid"].as_str().unwrap();
    let random = rid.strip_prefix("chatcmpl-").expect("chat rid prefix");
    assert!(random.len() > 25 && random.as_bytes()[24] == b'-', "{rid}");
    assert!(random[..24].chars().all(|c| c.is_ascii_alphanumeric()));
    // Not DP-aware, current SGLang's profile: no rank field in either half.
    for half in [&pb, &db] {
        for field in [
            "data_parallel_rank",
            "data_parallel_rank_decode",
            "routed_dp_rank",
            "disagg_prefill_dp_rank",
        ] {
            assert!(half.get(field).is_none(), "{field} in {half}");
        }
    }
    // The client's fields arrive untouched in both halves.
    assert_eq!(pb["messages"], db["messages"]);
    assert_eq!(db["max_tokens"], 7);
    assert_eq!(kv_fetched(d).await, 1, "the decode worker fetched the KV");
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

/// The filter asks once a request on its session; the prefill half's
/// outcome comes down unasked after the decision (`prefill_follows`), so
/// no `SessionUp.prefill` goes up, and no answer is held waiting for one
/// (the filter would hold it for its prefill timeout, 30 minutes).
#[tokio::test]
async fn a_pd_request_sends_no_prefill_wait_up_the_session() {
    if FrontDoor::current().is_ext_proc() {
        return; // no session: ext_proc's stream is per request
    }
    let stack = pd_stack(PdOptions::default(), "round_robin").await;
    // The VM's first request (the stack's readiness probe) went before its
    // session opened; the ten below must find it up, however soon they
    // follow (a release-built harness sent the first in under 20 ms).
    let session_up = wait_until(Duration::from_secs(5), || async {
        stack.metric("sgl_router_filter_sessions").await >= 1.0
    })
    .await;
    assert!(session_up, "the filter opened no session");
    let started = Instant::now();
    for i in 0..10 {
        let body = chat(&format!("question {i}"), 3, i % 2 == 1);
        let r = stack.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status(), 200);
        assert!(!r.bytes().await.unwrap_or_default().is_empty());
    }
    assert!(started.elapsed() < Duration::from_secs(30), "answers held");
    assert_eq!(kv_fetched(&stack.decodes[0]).await, 10);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
    let text = stack.metrics().await;
    let sent = |kind: &str| {
        let line = format!("sgl_router_filter_session_messages_total{{kind=\"{kind}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line)?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(sent("route") >= 10.0, "{text}");
    assert_eq!(sent("prefill"), 0.0, "{text}");
}

#[tokio::test]
async fn client_rid_and_headers_reach_the_prefill() {
    let stack = pd_stack(PdOptions::default(), "random").await;
    let r = reqwest::Client::new()
        .post(stack.url("/generate"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-pd")
        .header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        .body(r#"{"text":"hello there","rid":"client-rid-1","sampling_params":{"max_new_tokens":3,"temperature":0.7}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let prefill_reqs = stack.prefills[0].requests().await;
    let prefill_req = prefill_reqs
        .iter()
        .find(|r| r["method"] == "POST")
        .expect("the prefill request");
    assert_eq!(prefill_req["headers"]["authorization"], "Bearer sk-pd");
    assert!(prefill_req["headers"]["traceparent"]
        .as_str()
        .unwrap()
        .starts_with("00-0af7651916cd43dd8448eb211c80319c"));
    let body = prefill_req["body"].as_str().unwrap();
    assert!(
        body.contains(r#""temperature":0.7"#),
        "client bytes kept: {body}"
    );
    let pb: Value = serde_json::from_str(body).unwrap();
    let db = &bodies(&stack.decodes[0]).await[0];
    assert_eq!(pb["rid"], "client-rid-1");
    assert_eq!(db["rid"], "client-rid-1");
}

#[tokio::test]
async fn handshake_succeeds_on_every_route_streamed_or_not() {
    let stack = pd_stack(PdOptions::default(), "cache_aware").await;
    let cases = [
        (
            "/generate",
            json!({"text": "native route", "sampling_params": {"max_new_tokens": 4}}),
        ),
        (
            "/generate",
            json!({"text": "native stream", "stream": true, "sampling_params": {"max_new_tokens": 4}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "chat"}]}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "max_tokens": 4, "stream": true, "messages": [{"role": "user", "content": "chat stream"}]}),
        ),
        (
            "/v1/completions",
            json!({"model": "m", "max_tokens": 4, "prompt": "complete me"}),
        ),
        (
            "/v1/completions",
            json!({"model": "m", "max_tokens": 4, "stream": true, "prompt": "complete me streamed"}),
        ),
    ];
    for (i, (path, body)) in cases.iter().enumerate() {
        let r = stack.post(path, &body.to_string()).await;
        assert_eq!(r.status(), 200, "{path} {body}");
        let text = r.text().await.unwrap();
        assert!(!text.contains("\"error\""), "{path}: {text}");
        if body["stream"] == true {
            assert!(text.trim_end().ends_with("data: [DONE]"), "{path}: {text}");
        }
        assert_eq!(
            kv_fetched(&stack.decodes[0]).await,
            i as u64 + 1,
            "{path}: KV handshake"
        );
    }
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn openai_client_streams_from_the_decode_worker() {
    let stack = pd_stack(PdOptions::default(), "round_robin").await;
    let out = tokio::process::Command::new(venv_python())
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/openai_client.py"))
        .arg(&stack.base)
        .output()
        .await
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["completion_tokens"], 8, "{v}");
    assert!(v["chunks"].as_u64().unwrap() >= 8, "{v}");
    assert_eq!(v["streamed"], v["whole"], "stream and non-stream agree");
    // The script's third request (10 KB) is within this stack's body limit,
    // so all three went through the PD handshake.
    assert!(v["rejected"].is_null(), "{v}");
    assert_eq!(kv_fetched(&stack.decodes[0]).await, 3);
}

#[tokio::test]
async fn none_bootstrap_port_is_sent_as_null_and_still_connects() {
    let stack = pd_stack(
        PdOptions {
            bootstrap_none: true,
            ..Default::default()
        },
        "random",
    )
    .await;
    let r = stack
        .post("/v1/chat/completions", &chat("port none", 3, false))
        .await;
    assert_eq!(r.status(), 200);
    let pb = &bodies(&stack.prefills[0]).await[0];
    let db = &bodies(&stack.decodes[0]).await[0];
    assert!(pb.as_object().unwrap()["bootstrap_port"].is_null());
    assert!(db.as_object().unwrap()["bootstrap_port"].is_null());
    assert_eq!(kv_fetched(&stack.decodes[0]).await, 1);
}

#[tokio::test]
async fn batches_get_arrays_of_rooms_of_the_batch_size() {
    let stack = pd_stack(PdOptions::default(), "random").await;
    let r = stack
        .post(
            "/generate",
            r#"{"text":["first prompt","second prompt","third prompt"],"sampling_params":{"max_new_tokens":2}}"#,
        )
        .await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer.as_array().map(Vec::len), Some(3), "{answer}");
    let pb = &bodies(&stack.prefills[0]).await[0];
    let db = &bodies(&stack.decodes[0]).await[0];
    let rooms = pb["bootstrap_room"].as_array().expect("rooms array");
    assert_eq!(rooms.len(), 3);
    assert_eq!(pb["bootstrap_room"], db["bootstrap_room"]);
    assert_eq!(pb["bootstrap_host"].as_array().unwrap().len(), 3);
    assert_eq!(pb["bootstrap_port"].as_array().unwrap().len(), 3);
    assert_eq!(pb["rid"].as_array().unwrap().len(), 3);
    let distinct: std::collections::HashSet<_> = rooms.iter().map(|r| r.to_string()).collect();
    assert_eq!(distinct.len(), 3, "each item has its own room");
    assert_eq!(kv_fetched(&stack.decodes[0]).await, 3);
}

#[tokio::test]
async fn prefill_input_logprobs_are_merged_into_the_decode_answer() {
    let stack = pd_stack(PdOptions::default(), "random").await;
    let body = json!({
        "text": "one two three four five",
        "return_logprob": true,
        "sampling_params": {"max_new_tokens": 3},
    });
    let r = stack.post("/generate", &body.to_string()).await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    let prompt_tokens = answer["meta_info"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 0);
    assert_eq!(
        answer["meta_info"]["input_token_logprobs"]
            .as_array()
            .map(Vec::len),
        Some(prompt_tokens as usize),
        "the prefill's prompt logprobs are in the answer: {answer}"
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let text = stack
        .post("/generate", &streamed.to_string())
        .await
        .text()
        .await
        .unwrap();
    let first = sglang_envoy_e2e::first_sse_event(&text);
    assert_eq!(
        first["meta_info"]["input_token_logprobs"]
            .as_array()
            .map(Vec::len),
        Some(prompt_tokens as usize),
        "first streamed event carries the prompt logprobs: {first}"
    );
}

#[tokio::test]
async fn a_dead_prefill_worker_is_a_prompt_error_not_a_hang() {
    let mut stack = pd_stack(PdOptions::default(), "random").await;
    stack.prefills[0].kill();
    for stream in [false, true] {
        let started = Instant::now();
        let r = stack
            .post(
                "/v1/chat/completions",
                &chat("nobody prefills this", 4, stream),
            )
            .await;
        let status = r.status().as_u16();
        assert!(status >= 500, "got {status}");
        // Whichever side notices first answers: the control plane's failed
        // prefill (the router's JSON error) or the decode worker's failed KV
        // fetch from the dead bootstrap port (SGLang's error, passed on as
        // sglang-router does).
        let v: Value = r.json().await.expect("a JSON error");
        let message = v["error"]["message"]
            .as_str()
            .or(v["message"].as_str())
            .unwrap_or_default()
            .to_string();
        assert!(
            message.contains("prefill") || message.contains("KV transfer"),
            "{v}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(KV_TIMEOUT_MS),
            "the error must not wait for the decode's KV timeout: {:?}",
            started.elapsed()
        );
    }
    // The decode worker's half was cancelled, not left waiting.
    let d = &stack.decodes[0];
    assert!(
        sglang_envoy_e2e::wait_until(Duration::from_secs(KV_TIMEOUT_MS / 1000 + 2), || async {
            d.stats().await["in_flight"] == 0
        })
        .await
    );
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn prefill_and_decode_loads_return_to_zero_after_a_burst_with_cancellations() {
    let stack = pd_stack(
        PdOptions {
            prefills: 2,
            decodes: 2,
            ..Default::default()
        },
        "power_of_two",
    )
    .await;
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..24 {
        let url = stack.url("/v1/chat/completions");
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            // Those given up on stream, and generate long enough (~200 ms)
            // to still be in flight when the client hangs up.
            let give_up = i % 4 == 0;
            let tokens = if give_up { 2000 } else { 20 };
            let req = client
                .post(url)
                .header("content-type", "application/json")
                .body(chat(&format!("burst {i}"), tokens, i % 2 == 0))
                .send();
            if give_up {
                // Hang up once the answer has started (not at a fixed time,
                // which a slow machine may place before the request left):
                // mid-stream, whatever the machine's speed.
                let r = req.await.ok()?;
                let _ = r.bytes_stream().next().await;
                None
            } else {
                // Read to the end: these finish, they are not hang-ups.
                Some(match req.await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        r.text().await.map(|_| status)
                    }
                    Err(e) => Err(e),
                })
            }
        }));
    }
    for t in tasks {
        if let Some(status) = t.await.unwrap() {
            assert_eq!(status.unwrap(), 200);
        }
    }
    assert!(
        stack.wait_loads_zero(Duration::from_secs(10)).await,
        "loads: {:?}",
        stack.loads().await
    );
    let loads = stack.loads().await;
    assert_eq!(loads.len(), 4, "prefill and decode units listed: {loads:?}");
    let served: u64 = {
        let mut n = 0;
        for p in &stack.prefills {
            n += p.served().await;
        }
        n
    };
    assert!(served >= 18, "prefills served {served}");
    // Exactly the six hang-ups were counted as such (the others read their
    // answers to the end), and nothing is still decoding.
    let cancelled = || async {
        stack
            .metric("sgl_router_request_errors_total{reason=\"client_cancelled\"}")
            .await
    };
    wait_until(Duration::from_secs(3), || async {
        cancelled().await >= 6.0
    })
    .await;
    assert_eq!(cancelled().await, 6.0, "{}", stack.metrics().await);
    for d in &stack.decodes {
        assert!(
            wait_until(Duration::from_secs(5), || async {
                d.stats().await["in_flight"] == 0
            })
            .await,
            "a decode worker still generates for a client that hung up"
        );
    }
}

#[tokio::test]
async fn prefill_and_decode_workers_added_and_removed_at_run_time() {
    let stack = pd_stack(PdOptions::default(), "round_robin").await;
    let extra_decode = SimWorker::start_pd(
        &stack.dir,
        "decode",
        sglang_envoy_e2e::free_port(),
        &["--decode-us-per-token".into(), "100".into()],
    )
    .await
    .unwrap();
    let bootstrap = sglang_envoy_e2e::free_port();
    let extra_prefill = SimWorker::start_pd(&stack.dir, "prefill", bootstrap, &[])
        .await
        .unwrap();
    let client = reqwest::Client::new();

    // JSON API for the decode worker.
    let r = client
        .post(stack.admin_url("/workers"))
        .json(&json!({"url": extra_decode.url, "worker_type": "decode"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
    // sglang-router's query form for the prefill worker.
    let r = client
        .post(stack.admin_url(&format!(
            "/add_worker?url={}&worker_type=prefill&bootstrap_port={bootstrap}",
            extra_prefill.url
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let listed = stack.get_json("/list_workers").await;
    assert_eq!(listed["prefill"].as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(listed["decode"].as_array().unwrap().len(), 2, "{listed}");
    // POST /workers answers before the health check; /add_worker after it.
    let s = &stack;
    assert!(
        sglang_envoy_e2e::wait_until(Duration::from_secs(5), || async move {
            s.get_json("/workers").await["healthy"] == 4
        })
        .await
    );

    for i in 0..8 {
        let r = stack
            .post(
                "/v1/chat/completions",
                &chat(&format!("grown {i}"), 2, false),
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    assert!(
        kv_fetched(&extra_decode).await >= 3,
        "new decode gets traffic"
    );
    assert!(
        extra_prefill.served().await >= 3,
        "new prefill gets traffic"
    );

    // Remove the original prefill: everything goes to the new one.
    let original = stack.prefills[0].url.clone();
    let r = client
        .post(stack.admin_url(&format!("/remove_worker?url={original}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let before = stack.prefills[0].served().await;
    for i in 0..4 {
        let r = stack
            .post(
                "/v1/chat/completions",
                &chat(&format!("after {i}"), 2, false),
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(
        stack.prefills[0].served().await,
        before,
        "removed prefill idle"
    );
    // A regular worker has no place in a PD router.
    let r = client
        .post(stack.admin_url("/workers"))
        .json(&json!({"url": "http://127.0.0.1:9", "worker_type": "regular"}))
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 400).await;
}
