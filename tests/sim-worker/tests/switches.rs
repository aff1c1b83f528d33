//! The `/_sim/config` switches, and cancellation when clients hang up.

mod common;

use std::time::{Duration, Instant};

use common::{assert_error, fast, start};
use futures::StreamExt;
use serde_json::json;
use sglang_sim_worker::SimConfig;

const CHAT: &str = r#"{"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn fail_status_fails_inference_until_reset() {
    let sim = start(fast()).await;
    let v = sim.configure(json!({"fail_status": 503})).await;
    assert_eq!(v["fail_status"], 503);
    for path in ["/generate", "/v1/chat/completions", "/v1/embeddings"] {
        let body = r#"{"text":"x","input":"x","messages":[{"role":"user","content":"x"}]}"#;
        assert_error(sim.post_raw(path, body).await, 503).await;
    }
    // Health and info are not affected.
    let r = sim.client.get(sim.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(sim.get("/v1/models").await.0, 200);

    sim.configure(json!({"fail_status": 500})).await;
    let msg = assert_error(sim.post_raw("/v1/chat/completions", CHAT).await, 500).await;
    assert!(msg.contains("500"), "{msg}");

    let v = sim.configure(json!({"fail_status": null})).await;
    assert!(v["fail_status"].is_null());
    assert_eq!(
        sim.post_raw("/v1/chat/completions", CHAT).await.status(),
        200
    );
    // Failed requests were received (counted) but none is left in flight.
    let stats = sim.stats().await;
    assert_eq!(stats["requests_total"], 5, "{stats}");
    assert_eq!(stats["in_flight"], 0, "{stats}");
}

#[tokio::test]
async fn healthy_switch_drives_health_endpoints() {
    let sim = start(fast()).await;
    sim.configure(json!({"healthy": false})).await;
    for path in ["/health", "/health_generate"] {
        let r = sim.client.get(sim.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 503, "{path}");
    }
    // Inference still works: health is only what the router probes.
    assert_eq!(
        sim.post_raw("/v1/chat/completions", CHAT).await.status(),
        200
    );
    sim.configure(json!({"healthy": true})).await;
    for path in ["/health", "/health_generate"] {
        let r = sim.client.get(sim.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_holds_requests_until_lifted() {
    let sim = start(fast()).await;
    sim.configure(json!({"stall": true})).await;
    let pending = tokio::spawn({
        let client = sim.client.clone();
        let url = sim.url("/generate");
        async move {
            let r = client
                .post(url)
                .body(r#"{"text":"x"}"#)
                .send()
                .await
                .unwrap();
            (r.status(), Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pending.is_finished(), "a stalled request was answered");
    assert_eq!(sim.stats().await["in_flight"], 1);
    let lifted = Instant::now();
    let v = sim.configure(json!({"stall": false})).await;
    assert_eq!(v["stall"], false);
    let (status, answered) = pending.await.unwrap();
    assert_eq!(status, 200);
    assert!(answered >= lifted);
    assert!(sim.idle().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_request_is_dropped_when_the_client_leaves() {
    let sim = start(fast()).await;
    sim.configure(json!({"stall": true})).await;
    let r = sim
        .client
        .post(sim.url("/v1/chat/completions"))
        .body(CHAT)
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(r.is_err(), "the request should have timed out");
    assert!(sim.idle().await, "{}", sim.stats().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_streams_release_their_load() {
    let sim = start(SimConfig {
        decode_us_per_token: 20_000,
        ..fast()
    })
    .await;
    let body = r#"{"stream":true,"max_tokens":200,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = sim.post_raw("/v1/chat/completions", body).await;
    assert_eq!(r.status(), 200);
    let mut s = r.bytes_stream();
    assert!(s.next().await.is_some());
    let (_, load) = sim.get("/get_load").await;
    assert_eq!(load[0]["num_reqs"], 1, "{load}");
    assert_eq!(sim.stats().await["in_flight"], 1);
    drop(s);
    // 200 tokens would take 4 s; hanging up ends the work at once.
    let t = Instant::now();
    assert!(sim.idle().await, "{}", sim.stats().await);
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timing_switches_apply_at_runtime() {
    let sim = start(fast()).await;
    let t = Instant::now();
    sim.post_raw(
        "/generate",
        r#"{"text":"x","sampling_params":{"max_new_tokens":10}}"#,
    )
    .await;
    assert!(t.elapsed() < Duration::from_millis(150));

    let v = sim
        .configure(json!({"decode_us_per_token": 30_000, "prefill_us_per_token": 5}))
        .await;
    assert_eq!(
        v,
        json!({"fail_status": null, "stall": false, "healthy": true,
               "prefill_us_per_token": 5, "decode_us_per_token": 30_000})
    );
    assert_eq!(sim.get("/_sim/config").await.1, v);
    let t = Instant::now();
    let r = sim
        .post_raw(
            "/generate",
            r#"{"text":"y","stream":true,"sampling_params":{"max_new_tokens":10}}"#,
        )
        .await;
    r.text().await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(290),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn bad_config_changes_are_refused() {
    let sim = start(fast()).await;
    for body in [
        r#"{"stal": true}"#,
        r#"{"fail_status": 200}"#,
        r#"{"fail_status": "500"}"#,
        r#"{"healthy": "no"}"#,
        r#"{"decode_us_per_token": -1}"#,
        "not json",
    ] {
        assert_error(sim.post_raw("/_sim/config", body).await, 400).await;
    }
    // Refused changes are not half-applied.
    let r = sim
        .post_raw("/_sim/config", r#"{"stall": true, "healthy": 3}"#)
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(sim.get("/_sim/config").await.1["stall"], false);
}

#[tokio::test]
async fn api_key_guards_all_but_health_as_sglang_does() {
    let sim = start(SimConfig {
        api_key: Some("sk-w".into()),
        health_delay_ms: 0,
        ..fast()
    })
    .await;
    let body = json!({"text": "hi", "sampling_params": {"max_new_tokens": 1}});
    let (status, v) = sim.post("/generate", body.clone()).await;
    assert_eq!(
        (status.as_u16(), v),
        (401, json!({"error": "Unauthorized"}))
    );
    assert_eq!(sim.get("/get_server_info").await.0, 401);
    assert_eq!(sim.get("/health").await.0, 200);
    let r = sim
        .client
        .post(sim.url("/generate"))
        .bearer_auth("sk-w")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// `/v1/loads` and `/get_load` report the same sequences per rank, in
/// their own shapes, counting requests from anyone (here sent straight to
/// the worker); `dp_rank` filters and an unknown section is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_load_routes_count_running_and_waiting_per_rank() {
    let sim = start(SimConfig {
        decode_us_per_token: 20_000,
        dp_size: 2,
        ..fast()
    })
    .await;
    let body = r#"{"stream":true,"max_tokens":200,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = sim.post_raw("/v1/chat/completions", body).await;
    assert_eq!(r.status(), 200);
    let mut s = r.bytes_stream();
    assert!(s.next().await.is_some());

    let (status, v) = sim.get("/v1/loads").await;
    assert_eq!(status, 200, "{v}");
    assert!(v["timestamp"].as_str().unwrap().contains('T'), "{v}");
    assert!(v["version"].is_string(), "{v}");
    let loads = v["loads"].as_array().unwrap();
    assert_eq!(loads.len(), 2, "{v}");
    let running: Vec<u64> = loads
        .iter()
        .map(|l| l["num_running_reqs"].as_u64().unwrap())
        .collect();
    assert_eq!(running.iter().sum::<u64>(), 1, "{v}");
    assert!(loads
        .iter()
        .all(|l| l["num_waiting_reqs"] == 0 && l["queues"]["waiting"] == 0));
    let busy = running.iter().position(|&n| n == 1).unwrap();
    assert!(loads[busy]["num_used_tokens"].as_u64().unwrap() > 0, "{v}");

    let (_, old) = sim.get("/get_load").await;
    assert_eq!(old[busy]["num_reqs"], 1, "{old}");
    assert_eq!(old[1 - busy]["num_reqs"], 0, "{old}");

    let (_, one) = sim
        .get(&format!("/v1/loads?dp_rank={busy}&include=core"))
        .await;
    let one = one["loads"].as_array().unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0]["dp_rank"], busy);
    assert!(one[0].get("queues").is_none());
    let (status, _) = sim.get("/v1/loads?include=everything").await;
    assert_eq!(status, 400);

    drop(s);
    assert!(sim.idle().await, "{}", sim.stats().await);
    let (_, v) = sim.get("/v1/loads").await;
    assert!(
        v["loads"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["num_running_reqs"] == 0),
        "{v}"
    );
}
