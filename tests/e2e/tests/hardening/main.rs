//! No client request can take the router down or steer it: each test is one
//! attack from a hostile client through Envoy's client port, and checks the
//! answer (a JSON error or the intended answer, promptly) and that normal
//! traffic afterwards is fully served with loads back to zero.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sglang_envoy_e2e::{expect_openai_error, wait_until, FrontDoor, Stack, StackOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod uploads;

/// `n` ordinary chat requests: how many got 200.
async fn normal_traffic(stack: &Stack, n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        let body = json!({
            "model": "m",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": format!("hello {i}")}],
        });
        if stack
            .post("/v1/chat/completions", &body.to_string())
            .await
            .status()
            == 200
        {
            ok += 1;
        }
    }
    ok
}

/// How many routing decisions the control plane has made.
async fn decisions(stack: &Stack) -> f64 {
    stack
        .metric("sgl_router_decision_duration_seconds_count")
        .await
}

/// Sends raw bytes on a new connection and returns the answer that came
/// back within `wait` (status line, headers and body, complete by its
/// `content-length` or by the connection's end), and how long it took.
async fn raw(stack: &Stack, bytes: &[u8], wait: Duration) -> (String, Duration) {
    let addr = stack.base.trim_start_matches("http://");
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    conn.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 65536];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            if answer_complete(&out) {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(wait, read).await;
    (
        String::from_utf8_lossy(&out).into_owned(),
        started.elapsed(),
    )
}

/// True when `out` holds a whole HTTP/1.1 answer with a `content-length`.
fn answer_complete(out: &[u8]) -> bool {
    let text = String::from_utf8_lossy(out);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .is_some_and(|n| body.len() >= n)
}

/// The JSON body of a raw HTTP/1.1 answer.
fn raw_json(answer: &str) -> Value {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body.trim()).unwrap_or_else(|_| panic!("not JSON: {answer:?}"))
}

#[tokio::test]
async fn deeply_nested_content_is_400_and_the_filter_survives() {
    let stack = Stack::with_workers(1).await;
    let depth = 10_000;
    let attack = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":{}"a"{}}}]}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    for _ in 0..2 {
        let started = Instant::now();
        let r = stack.post("/v1/chat/completions", &attack).await;
        let message = expect_openai_error(r, 400).await;
        assert!(message.contains("deeper than 128"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    assert_eq!(normal_traffic(&stack, 20).await, 20);
    assert_eq!(
        stack.workers[0].served().await,
        20,
        "the deep bodies never reached the worker"
    );
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn many_large_bodies_at_once_stay_within_the_budget() {
    const BODY: usize = 600_000;
    let stack = Stack::start(StackOptions {
        workers: 2,
        max_body_bytes: 1_000_000,
        // Room for three such bodies per Envoy thread (the test's Envoy
        // runs one), and as much for the ext_proc front door.
        filter_options: r#", "max_buffered_bytes": 2000000"#.into(),
        cp_args: vec!["--ext-proc-max-buffered-bytes".into(), "2000000".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    for w in &stack.workers {
        w.configure(json!({"stall": true})).await;
    }
    let big = json!({
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "x".repeat(BODY)}],
    })
    .to_string();
    let sends: Vec<_> = (0..12)
        .map(|_| {
            let url = stack.url("/v1/chat/completions");
            let big = big.clone();
            tokio::spawn(async move {
                let r = reqwest::Client::new()
                    .post(url)
                    .header("content-type", "application/json")
                    .body(big)
                    .send()
                    .await;
                match r {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        (status, r.text().await.unwrap_or_default())
                    }
                    // A refusal sent while the body is still uploading may
                    // reach the client as a reset.
                    Err(_) => (0, String::new()),
                }
            })
        })
        .collect();
    // The held requests wait on the stalled workers; the rest are refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for w in &stack.workers {
        w.configure(json!({"stall": false})).await;
    }
    let mut served = 0;
    let mut refused = 0;
    for s in sends {
        let (status, text) = s.await.unwrap();
        match status {
            200 => served += 1,
            503 => {
                assert!(text.contains("too many request bodies"), "{text}");
                refused += 1;
            }
            0 => refused += 1,
            other => panic!("unexpected {other}: {text}"),
        }
    }
    assert!(served >= 3, "{served} served");
    assert!(
        refused >= 1,
        "nothing was refused: the budget held 12 bodies"
    );
    assert_eq!(served + refused, 12);
    assert_eq!(normal_traffic(&stack, 20).await, 20);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn bodies_over_the_default_grpc_limit_are_routed_not_fallen_back() {
    // 6 MB: over tonic's 4 MiB default, which once made the question fail
    // and the request take the outage fallback, unrouted and uncounted.
    let stack = Stack::with_workers(2).await;
    let before = decisions(&stack).await;
    let big = json!({
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "y".repeat(6_000_000)}],
    })
    .to_string();
    let r = stack.post("/v1/chat/completions", &big).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        decisions(&stack).await,
        before + 1.0,
        "the control plane decided it"
    );
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn paths_the_router_does_not_serve_never_reach_a_worker() {
    let stack = Stack::with_workers(1).await;
    let worker = &stack.workers[0];
    let client = reqwest::Client::new();
    for (method, path) in [
        ("POST", "/_sim/config"),
        ("GET", "/_sim/requests"),
        ("GET", "/_sim/stats"),
        ("POST", "/flush_cache"),
        ("POST", "/update_weights_from_disk"),
        ("POST", "/abort_request"),
        ("GET", "/v1/../_sim/requests"),
        ("GET", "/nothing/here"),
    ] {
        let r = client
            .request(method.parse().unwrap(), stack.url(path))
            .header("content-type", "application/json")
            .body(r#"{"fail_status": 503}"#)
            .send()
            .await
            .unwrap();
        expect_openai_error(r, 404).await;
    }
    // Escaped slashes are refused, not decoded into a served path.
    let r = stack.post("/v1/chat%2Fcompletions", "{}").await;
    let message = expect_openai_error(r, 400).await;
    assert!(message.contains("escaped slashes"), "{message}");
    // So is an encoded NUL, and the message says so rather than blaming
    // slashes the path does not have.
    let r = stack.post("/v1/chat/completions%00", "{}").await;
    let message = expect_openai_error(r, 400).await;
    assert!(message.contains("NUL"), "{message}");
    // The wrong method on a served path.
    let r = client.get(stack.url("/generate")).send().await.unwrap();
    expect_openai_error(r, 405).await;
    // A doubled slash is the served path itself, routed and counted.
    let r = stack.post("//generate", r#"{"text":"x"}"#).await;
    assert_eq!(r.status(), 200);
    // The worker saw only that one request; its switches are untouched.
    assert_eq!(worker.served().await, 1);
    assert_eq!(normal_traffic(&stack, 12).await, 12);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn envoys_own_replies_are_openai_json() {
    let mut stack = Stack::start(StackOptions {
        workers: 1,
        max_body_bytes: 1_000_000,
        ..Default::default()
    })
    .await
    .unwrap();
    let wait = Duration::from_secs(5);
    // HTTP/1.0 (426), Content-Length with Transfer-Encoding (400), headers
    // too large (431): Envoy answers before any filter runs.
    let (a, _) = raw(
        &stack,
        b"GET /v1/models HTTP/1.0\r\nConnection: close\r\n\r\n",
        wait,
    )
    .await;
    if FrontDoor::current() == FrontDoor::Picker {
        // A gateway's picker sees every answer (response headers SEND, no
        // mode override in full duplex), Envoy's codec replies too; Envoy
        // 1.40 resets the stream while ext_proc holds such a reply, so
        // the client's connection closes without one. Nothing reaches a
        // worker either way.
        assert_eq!(a, "", "{a}");
    } else {
        assert!(a.starts_with("HTTP/1.1 426"), "{a}");
        assert_eq!(raw_json(&a)["error"]["code"], 426);
        let (a, _) = raw(
            &stack,
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            wait,
        )
        .await;
        assert!(a.starts_with("HTTP/1.1 400"), "{a}");
        assert_eq!(raw_json(&a)["error"]["type"], "invalid_request_error");
        let huge = format!(
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-big: {}\r\n\r\n",
            "a".repeat(80_000)
        );
        let (a, _) = raw(&stack, huge.as_bytes(), wait).await;
        assert!(a.starts_with("HTTP/1.1 431"), "{a}");
        assert_eq!(raw_json(&a)["error"]["code"], 431);
    }
    // A chunked body over the limit.
    let chunk = "z".repeat(500_000);
    let mut chunked = String::from(
        "POST /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    for _ in 0..6 {
        chunked.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    chunked.push_str("0\r\n\r\n");
    let (a, _) = raw(&stack, chunked.as_bytes(), wait).await;
    assert!(a.starts_with("HTTP/1.1 413"), "{}", &a[..a.len().min(300)]);
    assert_eq!(raw_json(&a)["error"]["code"], 413);
    // The admin API with the control plane down: Envoy's 503, as JSON.
    stack.kill_control_plane();
    let r = reqwest::get(stack.url("/list_workers")).await.unwrap();
    expect_openai_error(r, 503).await;
}

#[tokio::test]
async fn a_body_that_stops_arriving_gets_408_within_5_s() {
    let stack = Stack::with_workers(1).await;
    for head in [
        // Announces 100 bytes, sends 8.
        "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"text\":",
        // Announces a body, sends none.
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
    ] {
        let (a, took) = raw(&stack, head.as_bytes(), Duration::from_secs(8)).await;
        assert!(a.starts_with("HTTP/1.1 408"), "{a}");
        assert_eq!(raw_json(&a)["error"]["type"], "timeout");
        assert!(took < Duration::from_secs(5), "took {took:?}");
    }
    assert_eq!(stack.workers[0].served().await, 0);
    assert_eq!(normal_traffic(&stack, 10).await, 10);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn client_connections_are_limited() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        max_connections: Some(6),
        ..Default::default()
    })
    .await
    .unwrap();
    let addr = stack.base.trim_start_matches("http://").to_string();
    // Start from none (the harness's readiness probes close asynchronously).
    let idle = wait_until(Duration::from_secs(5), || async {
        stack.envoy_stat("http.sglang.downstream_cx_active").await == Some(0)
    })
    .await;
    assert!(idle, "Envoy still holds client connections");
    // Idle connections up to the limit are accepted and kept.
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // One more is closed at once, without an answer.
    let mut extra = TcpStream::connect(&addr).await.unwrap();
    let _ = extra
        .write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), extra.read_to_end(&mut out)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the connection over the limit was served: {:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(
        stack
            .envoy_stat(
                "listener.127.0.0.1_PORT.downstream_global_cx_overflow"
                    .replace("PORT", addr.rsplit(':').next().unwrap())
                    .as_str()
            )
            .await,
        Some(1)
    );
    // Once they are gone, clients are served again.
    drop(held);
    let ok = wait_until(Duration::from_secs(5), || async {
        matches!(reqwest::get(stack.url("/v1/models")).await, Ok(r) if r.status() == 200)
    })
    .await;
    assert!(ok);
}

#[tokio::test]
async fn a_crashed_filter_vm_does_not_outlive_its_request() {
    if FrontDoor::current() != FrontDoor::Wasm {
        return; // a wasm VM's failure policy; ext_proc has no VM
    }
    let stack = Stack::start(StackOptions {
        workers: 1,
        filter_options: r#", "test_trap_header": "x-sglang-test-trap""#.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = reqwest::Client::new()
        .post(stack.url("/generate"))
        .header("x-sglang-test-trap", "1")
        .body(r#"{"text":"x"}"#)
        .send()
        .await
        .unwrap();
    let message = expect_openai_error(r, 503).await;
    assert!(message.contains("filter failed"), "{message}");
    // A new VM takes over within moments (Envoy's reload backoff starts at
    // 10 ms): from then on every request is served.
    let back = wait_until(Duration::from_secs(1), || async {
        normal_traffic(&stack, 1).await == 1
    })
    .await;
    assert!(back, "no request served within 1 s of the crash");
    assert_eq!(normal_traffic(&stack, 20).await, 20);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn a_body_ended_by_trailers_is_refused_not_forwarded_unrouted() {
    let stack = Stack::with_workers(1).await;
    let before = decisions(&stack).await;
    let addr = stack.base.trim_start_matches("http://").to_string();
    let tcp = TcpStream::connect(&addr).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let request = http::Request::builder()
        .method("POST")
        .uri(stack.url("/generate"))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (answer, mut send) = client.send_request(request, false).unwrap();
    send.send_data(bytes::Bytes::from_static(br#"{"text":"x"}"#), false)
        .unwrap();
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-trailer", "1".parse().unwrap());
    send.send_trailers(trailers).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), answer)
        .await
        .expect("an answer within 5 s")
        .unwrap();
    let status = answer.status().as_u16();
    let mut body = answer.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        bytes.extend_from_slice(&chunk.unwrap());
    }
    let v: Value = serde_json::from_slice(&bytes).expect("a JSON answer");
    // The wasm filter never sees the body end (it comes with the trailers)
    // and refuses the request; Envoy hands ext_proc the whole body at the
    // trailers, so it is routed like any other. Never does it reach the
    // worker without a decision.
    match FrontDoor::current() {
        // A picker streams the body in full duplex and sees its end: the
        // trailers; it refuses the body as the wasm filter does.
        FrontDoor::Wasm | FrontDoor::Picker => {
            assert_eq!(status, 400, "{v}");
            assert_eq!(v["error"]["code"], 400);
            assert_eq!(stack.workers[0].served().await, 0);
        }
        FrontDoor::ExtProc => {
            assert_eq!(status, 200, "{v}");
            assert_eq!(decisions(&stack).await, before + 1.0);
        }
    }
    assert_eq!(normal_traffic(&stack, 5).await, 5);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}
