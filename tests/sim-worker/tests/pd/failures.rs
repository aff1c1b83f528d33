//! What fails, and what a failure leaves behind: wrong rooms and ports, a
//! dead prefill, mismatched prompts, missing fields, clients hanging up.

use super::*;

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
