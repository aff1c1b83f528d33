//! Every endpoint answers in SGLang's shapes.

mod common;

use std::time::Duration;

use common::{assert_error, fast, sse_events, start};
use serde_json::{json, Value};
use sglang_sim_worker::SimConfig;

#[tokio::test]
async fn health_and_info() {
    let sim = start(SimConfig {
        dp_size: 3,
        model_path: "org/model-x".into(),
        cache_tokens: 777,
        ..fast()
    })
    .await;
    for path in ["/health", "/health_generate"] {
        let r = sim.client.get(sim.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.bytes().await.unwrap().is_empty());
    }
    for path in ["/get_server_info", "/server_info"] {
        let (status, v) = sim.get(path).await;
        assert_eq!(status, 200);
        assert_eq!(v["model_path"], "org/model-x");
        assert_eq!(v["tokenizer_path"], "org/model-x");
        assert_eq!(v["served_model_name"], "org/model-x");
        assert_eq!(v["dp_size"], 3);
        assert_eq!(v["tp_size"], 1);
        assert_eq!(v["version"], "0.5.23+sim");
        assert_eq!(v["disaggregation_mode"], "null");
        assert_eq!(v["max_total_num_tokens"], 777);
        assert_eq!(v["host"], "127.0.0.1");
        // The bound port, not the configured default.
        let port = sim.url.rsplit(':').next().unwrap();
        assert_eq!(v["port"].to_string(), port);
    }
    let (_, v) = sim.get("/get_model_info").await;
    assert_eq!(
        v,
        json!({"model_path": "org/model-x", "tokenizer_path": "org/model-x", "is_generation": true})
    );
    let (_, v) = sim.get("/v1/models").await;
    assert_eq!(v["object"], "list");
    let m = &v["data"][0];
    assert_eq!(m["id"], "org/model-x");
    assert_eq!(m["object"], "model");
    assert_eq!(m["owned_by"], "sglang");
    assert_eq!(m["root"], "org/model-x");
    assert_eq!(m["max_model_len"], 32768);
    assert!(m["created"].as_u64().unwrap() > 1_600_000_000);
    let (_, v) = sim.get("/get_load").await;
    let ranks = v.as_array().unwrap();
    assert_eq!(ranks.len(), 3);
    for (i, r) in ranks.iter().enumerate() {
        assert_eq!(
            *r,
            json!({"dp_rank": i, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0})
        );
    }
}

#[tokio::test]
async fn generate_single_batch_and_token_ids() {
    let sim = start(fast()).await;
    let (status, v) = sim
        .post(
            "/generate",
            json!({"text": "abcdefgh", "rid": "r1", "sampling_params": {"max_new_tokens": 3}}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["text"], " tok0 tok1 tok2");
    let m = &v["meta_info"];
    assert_eq!(m["id"], "r1");
    assert_eq!(m["finish_reason"], json!({"type": "length", "length": 3}));
    assert_eq!(m["prompt_tokens"], 2);
    assert_eq!(m["completion_tokens"], 3);
    assert_eq!(m["cached_tokens"], 0);
    assert!(m["e2e_latency"].as_f64().unwrap() > 0.0);

    // Default max tokens.
    let (_, v) = sim.post("/generate", json!({"text": "x"})).await;
    assert_eq!(v["meta_info"]["completion_tokens"], 16);
    assert!(v["meta_info"]["id"].as_str().unwrap().len() >= 16);

    let (_, v) = sim
        .post(
            "/generate",
            json!({"text": ["one", "two two two"], "rid": ["a", "b"], "sampling_params": {"max_new_tokens": 1}}),
        )
        .await;
    let items = v.as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["meta_info"]["id"], "a");
    assert_eq!(items[1]["meta_info"]["id"], "b");
    assert_eq!(items[1]["meta_info"]["prompt_tokens"], 3);
    assert_eq!(items[1]["text"], " tok0");

    let (_, v) = sim
        .post(
            "/generate",
            json!({"input_ids": [1, 2, 3, 4, 5], "sampling_params": {"max_new_tokens": 2}}),
        )
        .await;
    assert_eq!(v["meta_info"]["prompt_tokens"], 5);
    let (_, v) = sim
        .post(
            "/generate",
            json!({"input_ids": [[1, 2], [3]], "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}]}),
        )
        .await;
    assert_eq!(v[0]["meta_info"]["prompt_tokens"], 2);
    assert_eq!(v[1]["meta_info"]["prompt_tokens"], 1);
    assert_eq!(v[1]["meta_info"]["completion_tokens"], 2);
}

#[tokio::test]
async fn generate_streams_cumulative_text() {
    let sim = start(fast()).await;
    let r = sim
        .post_raw(
            "/generate",
            r#"{"text":"hello","stream":true,"rid":"s","sampling_params":{"max_new_tokens":3}}"#,
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let events = sse_events(&r.text().await.unwrap());
    assert_eq!(events.len(), 4);
    assert_eq!(events[0]["text"], " tok0");
    assert_eq!(events[0]["meta_info"]["completion_tokens"], 1);
    assert!(events[0]["meta_info"]["finish_reason"].is_null());
    assert_eq!(events[2]["text"], " tok0 tok1 tok2");
    assert_eq!(events[2]["meta_info"]["id"], "s");
    assert_eq!(events[2]["meta_info"]["finish_reason"]["type"], "length");
    assert_eq!(events[3], "[DONE]");
}

#[tokio::test]
async fn chat_completion() {
    let sim = start(fast()).await;
    let (status, v) = sim
        .post(
            "/v1/chat/completions",
            json!({"model": "m", "rid": "c1", "max_tokens": 2,
                   "messages": [{"role": "user", "content": "hello"}]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["id"], "c1");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "m");
    assert!(v["created"].is_u64());
    let c = &v["choices"][0];
    assert_eq!(c["index"], 0);
    assert_eq!(
        c["message"],
        json!({"role": "assistant", "content": " tok0 tok1", "reasoning_content": null, "tool_calls": null})
    );
    assert_eq!(c["finish_reason"], "length");
    assert!(c["logprobs"].is_null());
    assert!(c.get("matched_stop").is_some());
    // "<|user|>\nhello\n" is 15 bytes: 4 tokens.
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6,
               "prompt_tokens_details": null})
    );

    // max_completion_tokens wins; the model defaults to the served one; ids
    // are generated.
    let (_, v) = sim
        .post(
            "/v1/chat/completions",
            json!({"max_completion_tokens": 1, "max_tokens": 9,
                   "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
        )
        .await;
    assert_eq!(v["usage"]["completion_tokens"], 1);
    assert_eq!(v["model"], "sim-model");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
}

#[tokio::test]
async fn chat_stream_chunks() {
    let sim = start(fast()).await;
    let body = json!({"model": "m", "stream": true, "max_tokens": 3,
                      "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "hello"}]});
    let r = sim
        .post_raw("/v1/chat/completions", &body.to_string())
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let events = sse_events(&r.text().await.unwrap());
    // role, 3 tokens, finish, usage, [DONE]
    assert_eq!(events.len(), 7, "{events:?}");
    let id = events[0]["id"].as_str().unwrap().to_string();
    for e in &events[..6] {
        assert_eq!(e["object"], "chat.completion.chunk");
        assert_eq!(e["id"], id.as_str());
        assert_eq!(e["model"], "m");
        assert!(e["created"].is_u64());
    }
    assert_eq!(
        events[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let mut text = String::new();
    for e in &events[1..4] {
        let c = &e["choices"][0];
        assert_eq!(c["index"], 0);
        assert!(c["finish_reason"].is_null());
        assert!(c.get("logprobs").is_some());
        text.push_str(c["delta"]["content"].as_str().unwrap());
    }
    assert_eq!(text, " tok0 tok1 tok2");
    assert_eq!(events[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[4]["choices"][0]["delta"], json!({}));
    assert_eq!(events[5]["choices"], json!([]));
    assert_eq!(events[5]["usage"]["completion_tokens"], 3);
    assert_eq!(events[5]["usage"]["prompt_tokens"], 4);
    assert_eq!(events[6], "[DONE]");

    // Without include_usage there is no usage chunk.
    let body = json!({"stream": true, "max_tokens": 1,
                      "messages": [{"role": "user", "content": "hello"}]});
    let r = sim
        .post_raw("/v1/chat/completions", &body.to_string())
        .await;
    let events = sse_events(&r.text().await.unwrap());
    assert_eq!(events.len(), 4, "{events:?}");
    assert!(events.iter().all(|e| e.get("usage").is_none()));
}

#[tokio::test]
async fn completions_single_batch_and_stream() {
    let sim = start(fast()).await;
    let (status, v) = sim
        .post(
            "/v1/completions",
            json!({"model": "m", "prompt": "once upon", "max_tokens": 2, "rid": "k"}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["id"], "k");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], " tok0 tok1");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(v["choices"][0]["logprobs"].is_null());
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], 5);
    // No --enable-cache-report: no cached tokens in OpenAI usage.
    assert!(v["usage"]["prompt_tokens_details"].is_null(), "{v}");

    let (_, v) = sim
        .post(
            "/v1/completions",
            json!({"prompt": ["aaaa", "bbbbbbbb"], "max_tokens": 1}),
        )
        .await;
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    assert_eq!(choices[1]["index"], 1);
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["completion_tokens"], 2);

    let (_, v) = sim
        .post(
            "/v1/completions",
            json!({"prompt": [7, 8, 9], "max_tokens": 1}),
        )
        .await;
    assert_eq!(v["usage"]["prompt_tokens"], 3);

    let body = json!({"prompt": ["p one", "p two"], "max_tokens": 2, "stream": true,
                      "stream_options": {"include_usage": true}});
    let r = sim.post_raw("/v1/completions", &body.to_string()).await;
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let events = sse_events(&r.text().await.unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks = &events[..events.len() - 1];
    assert!(chunks.iter().all(|e| e["object"] == "text_completion"));
    for index in 0..2 {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter_map(|e| e["choices"].as_array().and_then(|c| c.first()))
            .filter(|c| c["index"] == index)
            .collect();
        let text: String = mine.iter().map(|c| c["text"].as_str().unwrap()).collect();
        assert_eq!(text, " tok0 tok1");
        assert_eq!(mine.last().unwrap()["finish_reason"], "length");
    }
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 4);
    assert_eq!(usage["prompt_tokens"], 4);
}

#[tokio::test]
async fn embeddings_are_deterministic() {
    let sim = start(fast()).await;
    let (status, v) = sim
        .post(
            "/v1/embeddings",
            json!({"model": "e", "input": ["embed me", "other", "embed me"]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "e");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["index"], i);
        assert_eq!(d["embedding"].as_array().unwrap().len(), 8);
    }
    assert_eq!(data[0]["embedding"], data[2]["embedding"]);
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    assert_eq!(v["usage"], json!({"prompt_tokens": 6, "total_tokens": 6}));

    let (_, single) = sim
        .post("/v1/embeddings", json!({"input": "embed me"}))
        .await;
    assert_eq!(single["data"][0]["embedding"], data[0]["embedding"]);
    assert_eq!(single["model"], "sim-model");
}

#[tokio::test]
async fn rerank_sorts_by_score() {
    let sim = start(fast()).await;
    let (status, v) = sim
        .post(
            "/v1/rerank",
            json!({"query": "red fox", "documents": ["blue sky", "the red fox", "a red car"]}),
        )
        .await;
    assert_eq!(status, 200);
    let items = v.as_array().unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(items[0]["index"], 1);
    assert_eq!(items[0]["document"], "the red fox");
    assert_eq!(items[1]["index"], 2);
    assert_eq!(items[2]["index"], 0);
    let scores: Vec<f64> = items.iter().map(|i| i["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    assert!(items[0]["meta_info"].is_object());

    let (_, again) = sim
        .post(
            "/v1/rerank",
            json!({"query": "red fox", "documents": ["blue sky", "the red fox", "a red car"]}),
        )
        .await;
    let again: Vec<f64> = again
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["score"].as_f64().unwrap())
        .collect();
    assert_eq!(scores, again);
}

/// A request asking for more tokens than the context holds is refused at
/// once, as SGLang refuses it; the simulator used to start generating 2^63
/// tokens, growing to many GB and leaving its health check unanswered.
#[tokio::test]
async fn more_tokens_than_the_context_holds_are_refused() {
    let sim = start(fast()).await;
    let asks = [
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":9223372036854775808}"#,
        ),
        ("/v1/completions", r#"{"prompt":"x","max_tokens":32768}"#),
        (
            "/generate",
            r#"{"text":"x","sampling_params":{"max_new_tokens":18446744073709551615}}"#,
        ),
    ];
    for (path, body) in asks {
        let r = tokio::time::timeout(Duration::from_secs(5), sim.post_raw(path, body))
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer within 5 s"));
        let msg = assert_error(r, 400).await;
        assert!(msg.contains("maximum context length of 32768"), "{msg}");
    }
    // A request within the context is served, and the worker stays healthy.
    let r = sim
        .post_raw("/v1/completions", r#"{"prompt":"x","max_tokens":2}"#)
        .await;
    assert_eq!(r.status(), 200);
    let (status, _) = sim.get("/health").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn bad_requests_get_json_errors() {
    let sim = start(fast()).await;
    for path in [
        "/generate",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/rerank",
    ] {
        for body in ["{\"messages\": [", "", "{\"a\":1} trailing", "NaN"] {
            let msg = assert_error(sim.post_raw(path, body).await, 400).await;
            assert!(msg.contains("not valid JSON"), "{path} {body:?}: {msg}");
        }
        let msg = assert_error(sim.post_raw(path, "[1, 2]").await, 400).await;
        assert!(msg.contains("must be a JSON object"), "{msg}");
        // Valid JSON without the required field.
        assert_error(sim.post_raw(path, "{\"model\":\"m\"}").await, 400).await;
    }
    let msg = assert_error(
        sim.post_raw(
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":"many"}"#,
        )
        .await,
        400,
    )
    .await;
    assert!(msg.contains("max_tokens"), "{msg}");
    assert_error(
        sim.post_raw(
            "/generate",
            r#"{"text":"x","sampling_params":{"max_new_tokens":-1}}"#,
        )
        .await,
        400,
    )
    .await;
    // Unknown paths and wrong methods: FastAPI's own answers, as SGLang's.
    let r = sim
        .client
        .get(sim.url("/no/such/path"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"detail": "Not Found"})
    );
    let r = sim.client.get(sim.url("/generate")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"detail": "Method Not Allowed"})
    );
    // Nothing bad was counted as served tokens.
    assert_eq!(sim.stats().await["prompt_tokens_total"], 0);
}

#[tokio::test]
async fn requests_are_recorded() {
    let sim = start(SimConfig {
        dp_size: 2,
        ..fast()
    })
    .await;
    let body = "{\"text\": \"abcdabcd\",  \"data_parallel_rank\": 1, \"x\": 1.10}";
    let r = sim
        .client
        .post(sim.url("/generate"))
        .header("authorization", "Bearer sk-test")
        .header("X-Trace-Id", "trace-1")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    sim.client.get(sim.url("/health")).send().await.unwrap();

    let (_, log) = sim.get("/_sim/requests").await;
    let log = log.as_array().unwrap();
    assert_eq!(log.len(), 2, "{log:?}");
    let g = &log[0];
    assert_eq!(g["method"], "POST");
    assert_eq!(g["path"], "/generate");
    assert_eq!(g["body"], body);
    assert_eq!(g["headers"]["authorization"], "Bearer sk-test");
    assert_eq!(g["headers"]["x-trace-id"], "trace-1");
    assert_eq!(g["headers"]["content-length"], body.len().to_string());
    assert_eq!(g["dp_rank"], 1);
    assert_eq!(g["prompt_tokens"], 2);
    assert_eq!(g["cached_tokens"], 0);
    assert!(g["at_ms"].as_u64().unwrap() > 1_600_000_000_000);
    assert_eq!(log[1]["path"], "/health");
    assert!(log[1]["dp_rank"].is_null());

    let stats = sim.stats().await;
    assert_eq!(stats["requests_total"], 1, "{stats}");
    assert_eq!(stats["by_path"], json!({"/generate": 1}));
    assert_eq!(stats["by_rank"], json!([0, 1]));
    assert_eq!(stats["prompt_tokens_total"], 2);
    assert_eq!(stats["in_flight"], 0);

    let r = sim
        .client
        .delete(sim.url("/_sim/requests"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let (_, log) = sim.get("/_sim/requests").await;
    assert_eq!(log, json!([]));
}
