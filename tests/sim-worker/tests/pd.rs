//! Prefill/decode disaggregation: a prefill and a decode worker hand the KV
//! over through the prefill's bootstrap server, as a PD router drives them.

mod common;

use std::time::{Duration, Instant};

use common::{assert_error, fast, sse_events, start, Sim};
use serde_json::{json, Value};
use sglang_sim_worker::{DisaggregationMode, SimConfig, WireProfile};

/// Timeout of the handshake in tests that expect it to fail.
const SHORT_MS: u64 = 300;

fn config(mode: DisaggregationMode, timeout_ms: u64, dp_size: usize) -> SimConfig {
    SimConfig {
        disaggregation_mode: mode,
        disaggregation_bootstrap_port: 0,
        disaggregation_timeout_ms: timeout_ms,
        dp_size,
        ..fast()
    }
}

/// A prefill and a decode worker.
struct Pd {
    prefill: Sim,
    decode: Sim,
    /// The prefill's bootstrap port.
    port: u16,
}

async fn bootstrap_port(sim: &Sim) -> u16 {
    let (_, info) = sim.get("/get_server_info").await;
    let port = info["disaggregation_bootstrap_port"].as_u64().unwrap();
    u16::try_from(port).unwrap()
}

async fn pd(timeout_ms: u64, dp_size: usize) -> Pd {
    pd_speaking(WireProfile::default(), timeout_ms, dp_size).await
}

/// [`pd`] with both workers speaking `profile`.
async fn pd_speaking(profile: WireProfile, timeout_ms: u64, dp_size: usize) -> Pd {
    let with = |mode| SimConfig {
        wire_profile: profile,
        ..config(mode, timeout_ms, dp_size)
    };
    let prefill = start(with(DisaggregationMode::Prefill)).await;
    let decode = start(with(DisaggregationMode::Decode)).await;
    let port = bootstrap_port(&prefill).await;
    Pd {
        prefill,
        decode,
        port,
    }
}

/// `body` plus the bootstrap fields.
fn with_bootstrap(body: &Value, host: &str, port: Value, room: Value) -> Value {
    let mut b = body.clone();
    b["bootstrap_host"] = json!(host);
    b["bootstrap_port"] = port;
    b["bootstrap_room"] = room;
    b
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

impl Pd {
    /// Sends `prefill_body` and `decode_body` to `path` at once, like a PD
    /// router; returns both answers.
    async fn send(
        &self,
        path: &str,
        prefill_body: Value,
        decode_body: Value,
    ) -> ((u16, Value), (u16, Value)) {
        let (p, d) = tokio::join!(
            self.prefill.post(path, prefill_body),
            self.decode.post(path, decode_body)
        );
        ((p.0.as_u16(), p.1), (d.0.as_u16(), d.1))
    }

    /// Sends `body` with matching bootstrap fields (room `room`) to both.
    async fn pair(&self, path: &str, body: &Value, room: u64) -> (Value, Value) {
        let b = with_bootstrap(body, "127.0.0.1", json!(self.port), json!(room));
        let ((ps, p), (ds, d)) = self.send(path, b.clone(), b).await;
        assert_eq!(ps, 200, "prefill: {p}");
        assert_eq!(ds, 200, "decode: {d}");
        (p, d)
    }

    /// Streams `body` with matching bootstrap fields to both; returns the
    /// events of each.
    async fn pair_stream(&self, path: &str, body: &Value, room: u64) -> (Vec<Value>, Vec<Value>) {
        let mut b = with_bootstrap(body, "127.0.0.1", json!(self.port), json!(room));
        b["stream"] = json!(true);
        let s = b.to_string();
        let (p, d) = tokio::join!(
            self.prefill.post_raw(path, &s),
            self.decode.post_raw(path, &s)
        );
        assert_eq!(p.status(), 200);
        assert_eq!(d.status(), 200);
        assert_eq!(d.headers()["content-type"], "text/event-stream");
        let (p, d) = tokio::join!(p.text(), d.text());
        (sse_events(&p.unwrap()), sse_events(&d.unwrap()))
    }
}

fn chat_body(max_tokens: u64) -> Value {
    json!({"max_tokens": max_tokens, "messages": [{"role": "user", "content": "hello there"}]})
}

#[tokio::test]
async fn info_reports_mode_and_bound_bootstrap_port() {
    let p = pd(1000, 2).await;
    let (_, info) = p.prefill.get("/server_info").await;
    assert_eq!(info["disaggregation_mode"], "prefill");
    assert_eq!(info["dp_size"], 2);
    assert_ne!(p.port, 0);
    let r = reqwest::get(format!("http://127.0.0.1:{}/health", p.port))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, info) = p.decode.get("/get_server_info").await;
    assert_eq!(info["disaggregation_mode"], "decode");
    // A decode worker does not listen on its bootstrap port: it reports the
    // configured one.
    assert_eq!(info["disaggregation_bootstrap_port"], 0);
    let (_, info) = start(fast()).await.get("/get_server_info").await;
    assert_eq!(info["disaggregation_mode"], "null");
    assert_eq!(info["disaggregation_bootstrap_port"], 8998);
}

#[tokio::test]
async fn generate_pairs_up() {
    let p = pd(5000, 1).await;
    let body = json!({"text": "abcdefgh", "rid": "g1", "sampling_params": {"max_new_tokens": 4}});
    let (pre, dec) = p.pair("/generate", &body, 11).await;
    // The prefill stops after the first token.
    assert_eq!(pre["text"], " tok0");
    assert_eq!(pre["meta_info"]["completion_tokens"], 1);
    assert_eq!(
        pre["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 1})
    );
    assert_eq!(pre["meta_info"]["prompt_tokens"], 2);
    assert_eq!(dec["text"], " tok0 tok1 tok2 tok3");
    assert_eq!(dec["meta_info"]["completion_tokens"], 4);
    assert_eq!(dec["meta_info"]["prompt_tokens"], 2);
    assert_eq!(dec["meta_info"]["cached_tokens"], 0);
    assert_eq!(dec["meta_info"]["id"], "g1");
    let ps = p.prefill.stats().await;
    let ds = p.decode.stats().await;
    assert_eq!(
        (&ps["kv_published"], &ps["kv_fetched"], &ps["kv_failed"]),
        (&json!(1), &json!(1), &json!(0)),
        "{ps}"
    );
    assert_eq!(
        (&ds["kv_fetched"], &ds["kv_failed"]),
        (&json!(1), &json!(0))
    );
    assert_eq!(ps["kv_rooms_open"], 0);
    // The prefix cache is the prefill's: a repeat hits it there.
    let (pre, dec) = p.pair("/generate", &body, 12).await;
    assert_eq!(pre["meta_info"]["cached_tokens"], 2);
    assert_eq!(dec["meta_info"]["cached_tokens"], 0);
}

#[tokio::test]
async fn chat_and_completions_pair_up() {
    let p = pd(5000, 1).await;
    let (pre, dec) = p.pair("/v1/chat/completions", &chat_body(3), 21).await;
    assert_eq!(pre["choices"][0]["message"]["content"], " tok0");
    assert_eq!(pre["usage"]["completion_tokens"], 1);
    assert_eq!(dec["choices"][0]["message"]["content"], " tok0 tok1 tok2");
    assert_eq!(dec["usage"]["completion_tokens"], 3);
    assert_eq!(dec["usage"]["prompt_tokens"], pre["usage"]["prompt_tokens"]);

    let body = json!({"prompt": "once upon a time", "max_tokens": 2});
    let (pre, dec) = p.pair("/v1/completions", &body, 22).await;
    assert_eq!(pre["choices"][0]["text"], " tok0");
    assert_eq!(dec["choices"][0]["text"], " tok0 tok1");
    assert_eq!(dec["usage"]["prompt_tokens"], 4);
    assert_eq!(p.decode.stats().await["kv_fetched"], 2);
    assert_eq!(p.prefill.stats().await["kv_fetched"], 2);
}

#[tokio::test]
async fn streams_pair_up_on_every_route() {
    let p = pd(5000, 1).await;
    let body = json!({"text": "abcdefgh", "sampling_params": {"max_new_tokens": 3}});
    let (pre, dec) = p.pair_stream("/generate", &body, 31).await;
    assert_eq!(pre.len(), 2, "{pre:?}");
    assert_eq!(pre[0]["text"], " tok0");
    assert_eq!(pre[0]["meta_info"]["finish_reason"]["type"], "length");
    assert_eq!(dec.len(), 4, "{dec:?}");
    assert_eq!(dec[2]["text"], " tok0 tok1 tok2");
    assert_eq!(dec[3], "[DONE]");

    let (pre, dec) = p
        .pair_stream("/v1/chat/completions", &chat_body(2), 32)
        .await;
    let content = |events: &[Value]| -> String {
        events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect()
    };
    assert_eq!(content(&pre), " tok0");
    assert_eq!(content(&dec), " tok0 tok1");
    assert!(dec.iter().all(|e| e.get("error").is_none()), "{dec:?}");

    let body = json!({"prompt": "once upon a time", "max_tokens": 2});
    let (pre, dec) = p.pair_stream("/v1/completions", &body, 33).await;
    let text = |events: &[Value]| -> String {
        events
            .iter()
            .filter_map(|e| e["choices"][0]["text"].as_str())
            .collect()
    };
    assert_eq!(text(&pre), " tok0");
    assert_eq!(text(&dec), " tok0 tok1");
    assert_eq!(dec.last().unwrap(), "[DONE]");
    assert_eq!(p.decode.stats().await["kv_fetched"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_stream_headers_come_before_the_kv() {
    let p = pd(5000, 1).await;
    let body = with_bootstrap(
        &json!({"text": "abcd", "stream": true, "sampling_params": {"max_new_tokens": 2}}),
        "127.0.0.1",
        json!(p.port),
        json!(41),
    );
    // No prefill yet: the decode still answers its headers at once.
    let t = Instant::now();
    let d = p
        .decode
        .client
        .post(p.decode.url("/generate"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(d.status(), 200);
    assert!(t.elapsed() < Duration::from_secs(2));
    let (_, load) = p.decode.get("/get_load").await;
    assert_eq!(load[0]["num_waiting_reqs"], 1, "waiting for its KV: {load}");
    let pre = p.prefill.post_raw("/generate", &body.to_string()).await;
    assert_eq!(pre.status(), 200);
    let (pre, dec) = tokio::join!(pre.text(), d.text());
    assert_eq!(sse_events(&pre.unwrap())[0]["text"], " tok0");
    let events = sse_events(&dec.unwrap());
    assert_eq!(events[1]["text"], " tok0 tok1");
}

/// Runs a decode request that must fail with a KV-transfer error within
/// about `SHORT_MS`; returns its message.
async fn decode_fails(decode: &Sim, path: &str, body: Value) -> String {
    let t = Instant::now();
    let r = decode.post_raw(path, &body.to_string()).await;
    let message = assert_error(r, 500).await;
    assert!(
        t.elapsed() < Duration::from_millis(SHORT_MS + 1500),
        "took {:?}",
        t.elapsed()
    );
    assert!(message.contains("KV transfer failed"), "{message}");
    message
}

#[tokio::test]
async fn wrong_room_fails_both_sides_after_the_timeout() {
    let p = pd(SHORT_MS, 1).await;
    let body = chat_body(2);
    let pre = with_bootstrap(&body, "127.0.0.1", json!(p.port), json!(51));
    let dec = with_bootstrap(&body, "127.0.0.1", json!(p.port), json!(52));
    let t = Instant::now();
    let ((ps, pv), (ds, dv)) = p.send("/v1/chat/completions", pre, dec).await;
    // Both waited for their peer for the whole timeout.
    assert!(t.elapsed() >= Duration::from_millis(SHORT_MS));
    assert!(t.elapsed() < Duration::from_millis(SHORT_MS + 1500));
    assert_eq!((ps, ds), (500, 500), "{pv} {dv}");
    assert_eq!(pv["type"], "InternalServerError");
    assert!(
        dv["message"].as_str().unwrap().contains("52"),
        "names the room: {dv}"
    );
    let ps = p.prefill.stats().await;
    assert_eq!(
        (&ps["kv_published"], &ps["kv_failed"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(ps["kv_fetched"], 0);
    // Nothing left behind: the room expired, the fetch was withdrawn.
    assert_eq!(ps["kv_rooms_open"], 0);
    assert_eq!(p.decode.stats().await["kv_failed"], 1);
    assert!(p.prefill.idle().await && p.decode.idle().await);
}

#[tokio::test]
async fn wrong_port_and_dead_prefill_fail_the_decode() {
    let p = pd(SHORT_MS, 1).await;
    let body = json!({"text": "abcd", "sampling_params": {"max_new_tokens": 2}});
    // Nothing listens there.
    let closed = closed_port().await;
    let b = with_bootstrap(&body, "127.0.0.1", json!(closed), json!(61));
    let msg = decode_fails(&p.decode, "/generate", b).await;
    assert!(msg.contains("unreachable"), "{msg}");
    // The prefill's HTTP port is not its bootstrap port.
    let http_port: u16 = p.prefill.url.rsplit(':').next().unwrap().parse().unwrap();
    let b = with_bootstrap(&body, "127.0.0.1", json!(http_port), json!(62));
    let msg = decode_fails(&p.decode, "/generate", b).await;
    assert!(msg.contains("404"), "{msg}");
    // The right bootstrap server, but its prefill never comes.
    let b = with_bootstrap(&body, "127.0.0.1", json!(p.port), json!(63));
    let t = Instant::now();
    decode_fails(&p.decode, "/generate", b).await;
    assert!(t.elapsed() >= Duration::from_millis(SHORT_MS));
    // A wrong host.
    let b = with_bootstrap(&body, "127.0.0.2", json!(closed), json!(64));
    decode_fails(&p.decode, "/generate", b).await;
    assert_eq!(p.decode.stats().await["kv_failed"], 4);
    assert_eq!(p.decode.stats().await["kv_fetched"], 0);
    assert_eq!(p.prefill.stats().await["kv_rooms_open"], 0);
}

#[tokio::test]
async fn failed_streams_end_with_an_error_event() {
    let p = pd(SHORT_MS, 1).await;
    let closed = closed_port().await;
    for path in ["/generate", "/v1/chat/completions", "/v1/completions"] {
        let body = json!({"text": "abcd", "prompt": "abcd", "stream": true, "max_tokens": 2,
                          "messages": [{"role": "user", "content": "x"}]});
        let b = with_bootstrap(&body, "127.0.0.1", json!(closed), json!(71));
        let r = p.decode.post_raw(path, &b.to_string()).await;
        assert_eq!(r.status(), 200, "{path}: headers go out before the KV");
        let events = sse_events(&r.text().await.unwrap());
        assert_eq!(events.len(), 2, "{path}: {events:?}");
        let e = &events[0]["error"];
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .starts_with("KV transfer failed"),
            "{e}"
        );
        assert_eq!(e["code"], 500);
        assert_eq!(events[1], "[DONE]");
    }
    // A prefill whose room nobody fetches fails its stream the same way.
    let b = with_bootstrap(&chat_body(2), "127.0.0.1", json!(p.port), json!(72));
    let mut b = b;
    b["stream"] = json!(true);
    let r = p
        .prefill
        .post_raw("/v1/chat/completions", &b.to_string())
        .await;
    let events = sse_events(&r.text().await.unwrap());
    assert_eq!(events[0]["error"]["code"], 500, "{events:?}");
    assert_eq!(p.prefill.stats().await["kv_rooms_open"], 0);
}

#[tokio::test]
async fn mismatched_prompt_fails_the_decode() {
    let p = pd(SHORT_MS, 1).await;
    let pre = with_bootstrap(
        &json!({"text": "the prefill's prompt"}),
        "127.0.0.1",
        json!(p.port),
        json!(81),
    );
    let dec = with_bootstrap(
        &json!({"text": "another prompt"}),
        "127.0.0.1",
        json!(p.port),
        json!(81),
    );
    let ((ps, _), (ds, dv)) = p.send("/generate", pre, dec).await;
    // The prefill's KV was taken: it succeeds; the decode sees it is not
    // the KV of its prompt.
    assert_eq!(ps, 200);
    assert_eq!(ds, 500);
    assert!(
        dv["message"]
            .as_str()
            .unwrap()
            .contains("not the KV of this prompt"),
        "{dv}"
    );
}

#[tokio::test]
async fn null_port_means_the_decodes_own_bootstrap_port() {
    let prefill = start(config(DisaggregationMode::Prefill, 5000, 1)).await;
    let port = bootstrap_port(&prefill).await;
    let decode = start(SimConfig {
        disaggregation_bootstrap_port: port,
        ..config(DisaggregationMode::Decode, 5000, 1)
    })
    .await;
    let body = with_bootstrap(&chat_body(2), "127.0.0.1", Value::Null, json!(91));
    let (p, d) = tokio::join!(
        prefill.post("/v1/chat/completions", body.clone()),
        decode.post("/v1/chat/completions", body.clone())
    );
    assert_eq!((p.0.as_u16(), d.0.as_u16()), (200, 200), "{} {}", p.1, d.1);
    assert_eq!(d.1["usage"]["completion_tokens"], 2);
    // Absent is null too.
    let mut body = with_bootstrap(&chat_body(1), "127.0.0.1", Value::Null, json!(92));
    body.as_object_mut().unwrap().remove("bootstrap_port");
    let (p, d) = tokio::join!(
        prefill.post("/v1/chat/completions", body.clone()),
        decode.post("/v1/chat/completions", body)
    );
    assert_eq!((p.0.as_u16(), d.0.as_u16()), (200, 200), "{} {}", p.1, d.1);

    // A decode whose own port is elsewhere fails the same request.
    let other = start(SimConfig {
        disaggregation_bootstrap_port: closed_port().await,
        ..config(DisaggregationMode::Decode, SHORT_MS, 1)
    })
    .await;
    let body = with_bootstrap(&chat_body(1), "127.0.0.1", Value::Null, json!(93));
    decode_fails(&other, "/v1/chat/completions", body).await;
}

#[tokio::test]
async fn batches_use_one_room_per_item() {
    let p = pd(5000, 1).await;
    let body =
        json!({"text": ["first prompt", "second one"], "sampling_params": {"max_new_tokens": 2}});
    let b = with_bootstrap(
        &body,
        "127.0.0.1",
        json!([p.port, p.port]),
        json!([101, 102]),
    );
    let ((ps, pv), (ds, dv)) = p.send("/generate", b.clone(), b).await;
    assert_eq!((ps, ds), (200, 200), "{pv} {dv}");
    assert_eq!(pv[1]["text"], " tok0");
    assert_eq!(dv[0]["text"], " tok0 tok1");
    assert_eq!(dv[1]["index"], 1);
    assert_eq!(p.decode.stats().await["kv_fetched"], 2);

    // Token-id batches, streamed.
    let body = json!({"input_ids": [[1, 2, 3], [4, 5]], "stream": true,
                      "sampling_params": {"max_new_tokens": 1}});
    let (pre, dec) = p.pair_stream_batch(&body, [103, 104]).await;
    assert_eq!(pre.len(), 3, "{pre:?}");
    assert_eq!(dec.len(), 3, "{dec:?}");

    // Each item is checked against its own room: swapped rooms fail.
    let pd_short = pd(SHORT_MS, 1).await;
    let body = json!({"text": ["first prompt", "second one"]});
    let pre = with_bootstrap(&body, "127.0.0.1", json!(pd_short.port), json!([105, 106]));
    let dec = with_bootstrap(&body, "127.0.0.1", json!(pd_short.port), json!([106, 105]));
    let (_, (ds, dv)) = pd_short.send("/generate", pre, dec).await;
    assert_eq!(ds, 500, "{dv}");
}

impl Pd {
    /// [`Pd::pair_stream`] for a `/generate` batch with per-item rooms.
    async fn pair_stream_batch(&self, body: &Value, rooms: [u64; 2]) -> (Vec<Value>, Vec<Value>) {
        let b = with_bootstrap(body, "127.0.0.1", json!(self.port), json!(rooms));
        let s = b.to_string();
        let (p, d) = tokio::join!(
            self.prefill.post_raw("/generate", &s),
            self.decode.post_raw("/generate", &s)
        );
        let (p, d) = tokio::join!(p.text(), d.text());
        (sse_events(&p.unwrap()), sse_events(&d.unwrap()))
    }
}

#[tokio::test]
async fn seeds_ranks_follow_explicit_fields_or_the_room() {
    let p = pd_speaking(WireProfile::Legacy, 5000, 4).await;
    let body = json!({"text": "abcd", "sampling_params": {"max_new_tokens": 1}});
    // room % 4 == 2 on both sides.
    p.pair("/generate", &body, 4 * 1000 + 2).await;
    // Explicit ranks: data_parallel_rank on the prefill,
    // data_parallel_rank_decode on the decode (which ignores the first).
    let body = json!({"prompt": "abcd", "max_tokens": 1,
                      "data_parallel_rank": 1, "data_parallel_rank_decode": 3});
    p.pair("/v1/completions", &body, 4 * 1000 + 6).await;
    let ps = p.prefill.stats().await;
    let ds = p.decode.stats().await;
    assert_eq!(ps["by_rank"], json!([0, 1, 1, 0]), "{ps}");
    assert_eq!(ps["kv_fetched_by_rank"], json!([0, 1, 1, 0]), "{ps}");
    assert_eq!(ds["by_rank"], json!([0, 0, 1, 1]), "{ds}");
    assert_eq!(ds["kv_fetched_by_rank"], json!([0, 0, 1, 1]), "{ds}");
    // The request log says where each ran.
    let (_, log) = p.decode.get("/_sim/requests").await;
    let ranks: Vec<&Value> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["dp_rank"])
        .collect();
    assert_eq!(ranks, [&json!(2), &json!(3)]);
}

#[tokio::test]
async fn missing_bootstrap_fields_are_bad_requests() {
    let p = pd(SHORT_MS, 1).await;
    let routes = [
        ("/generate", json!({"text": "abcd"})),
        ("/v1/chat/completions", chat_body(1)),
        ("/v1/completions", json!({"prompt": "abcd"})),
    ];
    for (path, body) in &routes {
        for sim in [&p.prefill, &p.decode] {
            let mut no_room = with_bootstrap(body, "127.0.0.1", json!(p.port), json!(1));
            no_room.as_object_mut().unwrap().remove("bootstrap_room");
            let msg = assert_error(sim.post_raw(path, &no_room.to_string()).await, 400).await;
            assert!(msg.contains("bootstrap_room"), "{msg}");
            let mut no_host = with_bootstrap(body, "127.0.0.1", json!(p.port), json!(1));
            no_host.as_object_mut().unwrap().remove("bootstrap_host");
            let msg = assert_error(sim.post_raw(path, &no_host.to_string()).await, 400).await;
            assert!(msg.contains("bootstrap_host"), "{msg}");
            let bad_room = with_bootstrap(body, "127.0.0.1", json!(p.port), json!("1"));
            assert_error(sim.post_raw(path, &bad_room.to_string()).await, 400).await;
            let bad_port = with_bootstrap(body, "127.0.0.1", json!("x"), json!(1));
            assert_error(sim.post_raw(path, &bad_port.to_string()).await, 400).await;
        }
    }
    // A batch needs one room per item.
    let b = with_bootstrap(&json!({"text": ["a", "b"]}), "h", Value::Null, json!(1));
    assert_error(p.decode.post_raw("/generate", &b.to_string()).await, 400).await;
    // Nothing was published or fetched.
    assert_eq!(p.prefill.stats().await["kv_published"], 0);
    assert_eq!(p.decode.stats().await["kv_failed"], 0);
    // Without disaggregation the fields are not needed.
    let (status, _) = start(fast())
        .await
        .post("/generate", json!({"text": "abcd"}))
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn logprobs_prompt_on_prefill_output_on_decode() {
    let p = pd(5000, 1).await;
    let body = json!({"input_ids": [5, 6, 7], "return_logprob": true,
                      "sampling_params": {"max_new_tokens": 2}});
    let (pre, dec) = p.pair("/generate", &body, 111).await;
    let input = pre["meta_info"]["input_token_logprobs"].as_array().unwrap();
    assert_eq!(input.len(), 3, "{pre}");
    assert_eq!(input[0], json!([null, 5, null]));
    assert_eq!(input[2][1], 7);
    assert!(input[2][0].as_f64().unwrap() < 0.0);
    assert_eq!(
        pre["meta_info"]["output_token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(dec["meta_info"]["input_token_logprobs"], json!([]));
    let output = dec["meta_info"]["output_token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(output.len(), 2);
    assert!(output[1][0].as_f64().unwrap() < 0.0);
    // Not asked, not sent.
    let body = json!({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1}});
    let (pre, _) = p.pair("/generate", &body, 112).await;
    assert!(pre["meta_info"].get("input_token_logprobs").is_none());
    // Without disaggregation both come from the one worker.
    let (_, v) = start(fast())
        .await
        .post(
            "/generate",
            json!({"text": "abcdefgh", "return_logprob": true, "sampling_params": {"max_new_tokens": 3}}),
        )
        .await;
    assert_eq!(
        v["meta_info"]["input_token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        v["meta_info"]["output_token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[tokio::test]
async fn openai_logprobs_cover_generated_tokens() {
    let p = pd(5000, 1).await;
    let mut body = chat_body(3);
    body["logprobs"] = json!(true);
    let (pre, dec) = p.pair("/v1/chat/completions", &body, 131).await;
    let content = |v: &Value| {
        v["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .clone()
    };
    assert_eq!(content(&pre).len(), 1);
    let dec_lp = content(&dec);
    assert_eq!(dec_lp.len(), 3);
    assert_eq!(dec_lp[2]["token"], " tok2");
    assert_eq!(dec_lp[2]["bytes"], json!(" tok2".as_bytes()));
    // The prefill's first token is the decode's first token.
    assert_eq!(content(&pre)[0], dec_lp[0]);
    let (pre, _) = p.pair("/v1/chat/completions", &chat_body(1), 132).await;
    assert!(pre["choices"][0]["logprobs"].is_null());

    // Completions, streamed: one logprob per token chunk, the same numbers
    // /generate reports for the same prompt.
    let sim = start(fast()).await;
    let (_, gen) = sim
        .post(
            "/generate",
            json!({"text": "abcdefgh", "return_logprob": true, "sampling_params": {"max_new_tokens": 2}}),
        )
        .await;
    let expected: Vec<Value> = gen["meta_info"]["output_token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[0].clone())
        .collect();
    let body = json!({"prompt": "abcdefgh", "max_tokens": 2, "logprobs": 0});
    let (_, v) = sim.post("/v1/completions", body.clone()).await;
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!([" tok0", " tok1"]));
    assert_eq!(lp["text_offset"], json!([0, 5]));
    assert_eq!(lp["token_logprobs"], json!(expected));
    let mut body = body;
    body["stream"] = json!(true);
    let r = sim.post_raw("/v1/completions", &body.to_string()).await;
    let streamed: Vec<Value> = sse_events(&r.text().await.unwrap())
        .iter()
        .filter_map(|e| {
            e["choices"][0]["logprobs"]["token_logprobs"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(streamed, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_hanging_up_leave_nothing_behind() {
    let p = pd(5000, 1).await;
    let body = json!({"text": "abcd", "sampling_params": {"max_new_tokens": 1}});
    // A decode waiting for its KV, whose client leaves.
    let b = with_bootstrap(&body, "127.0.0.1", json!(p.port), json!(121));
    let r = p
        .decode
        .client
        .post(p.decode.url("/generate"))
        .json(&b)
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(r.is_err());
    // A prefill waiting to be fetched, whose client leaves.
    let b = with_bootstrap(&body, "127.0.0.1", json!(p.port), json!(122));
    let r = p
        .prefill
        .client
        .post(p.prefill.url("/generate"))
        .json(&b)
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(r.is_err());
    // Well before the 5 s timeout, everything is released on both sides.
    let t = Instant::now();
    assert!(p.decode.idle().await, "{}", p.decode.stats().await);
    assert!(p.prefill.idle().await, "{}", p.prefill.stats().await);
    loop {
        if p.prefill.stats().await["kv_rooms_open"] == 0 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(2), "rooms still open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The withdrawn room is not served to a late decode.
    let url = format!("http://127.0.0.1:{}/kv/122?timeout_ms=50", p.port);
    let r = reqwest::get(url).await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn binary_prints_both_listening_lines() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sglang-sim-worker"))
        .args([
            "--port",
            "0",
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            "0",
            "--log-level",
            "warn",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let main = lines.next_line().await.unwrap().unwrap();
    let boot = lines.next_line().await.unwrap().unwrap();
    let url = main
        .strip_prefix("sglang-sim-worker listening on ")
        .unwrap()
        .to_string();
    let boot_url = boot
        .strip_prefix("sglang-sim-worker bootstrap listening on ")
        .unwrap();
    let boot_port: u64 = boot_url.rsplit(':').next().unwrap().parse().unwrap();
    let info: Value = reqwest::get(format!("{url}/get_server_info"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["disaggregation_mode"], "prefill");
    assert_eq!(info["disaggregation_bootstrap_port"], boot_port);
    assert_eq!(info["disaggregation_timeout_ms"], 5000);
    let r = reqwest::get(format!("{boot_url}/health")).await.unwrap();
    assert_eq!(r.status(), 200);
    child.kill().await.unwrap();
}

/// Current SGLang: a request runs on `routed_dp_rank`; the decode finds its
/// KV on prefill rank `disagg_prefill_dp_rank`; a prefill rank that
/// contradicts the room (room % dp_size) without that field fails.
#[tokio::test]
async fn upstream_ranks_follow_routed_and_disagg_prefill_fields() {
    let p = pd_speaking(WireProfile::Upstream, 5000, 4).await;
    let body = json!({"prompt": "abcd", "max_tokens": 1});
    // Prefill on rank 2 (room % 4 == 2 agrees), decode on rank 3 fetching
    // from prefill rank 2.
    let mut prefill = with_bootstrap(&body, "127.0.0.1", json!(p.port), json!(4 * 1000 + 2));
    prefill["routed_dp_rank"] = json!(2);
    let mut decode = prefill.clone();
    decode["routed_dp_rank"] = json!(3);
    decode["disagg_prefill_dp_rank"] = json!(2);
    let ((ps, pv), (ds, dv)) = p.send("/v1/completions", prefill, decode).await;
    assert_eq!((ps, ds), (200, 200), "{pv} {dv}");
    let (pst, dst) = (p.prefill.stats().await, p.decode.stats().await);
    assert_eq!(pst["by_rank"], json!([0, 0, 1, 0]), "{pst}");
    assert_eq!(dst["by_rank"], json!([0, 0, 0, 1]), "{dst}");
    // The KV came from prefill rank 2.
    assert_eq!(pst["kv_fetched_by_rank"], json!([0, 0, 1, 0]), "{pst}");
    // The seeds' decode field means nothing to current SGLang: the decode
    // runs on routed_dp_rank.
    let mut prefill = with_bootstrap(&body, "127.0.0.1", json!(p.port), json!(4 * 1000 + 1));
    prefill["routed_dp_rank"] = json!(1);
    let mut decode = prefill.clone();
    decode["data_parallel_rank_decode"] = json!(0);
    let ((ps, _), (ds, _)) = p.send("/v1/completions", prefill, decode).await;
    assert_eq!((ps, ds), (200, 200));
    assert_eq!(p.decode.stats().await["by_rank"], json!([0, 1, 0, 1]));
    // A prefill rank that contradicts the room fails the prefill.
    let mut prefill = with_bootstrap(&body, "127.0.0.1", json!(p.port), json!(4 * 1000 + 2));
    prefill["routed_dp_rank"] = json!(1);
    let (status, v) = p.prefill.post("/v1/completions", prefill).await;
    assert_eq!(status.as_u16(), 500, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("follow_bootstrap_room"),
        "{v}"
    );
}
