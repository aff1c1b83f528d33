//! Prefill/decode disaggregation: a prefill and a decode worker hand the KV
//! over through the prefill's bootstrap server, as a PD router drives them.

#[path = "../common/mod.rs"]
mod common;
mod failures;
mod fields;

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
