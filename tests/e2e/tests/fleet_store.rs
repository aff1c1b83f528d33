//! Several control planes sharing one worker list through a real Redis
//! (`--fleet-store-url`): a change made through one control plane's admin
//! API reaches the other within a second, a restarted control plane comes
//! back with the list as it stands, and the store's outage fails no
//! request.

use std::time::{Duration, Instant};

use serde_json::json;
use sglang_envoy_e2e::{redis, wait_until, SimWorker, Stack, StackOptions};

const GEN: &str = r#"{"text":"hello","sampling_params":{"max_new_tokens":1}}"#;

/// Whether `/workers` at `stack` lists `url` at all.
async fn lists(stack: &Stack, url: &str) -> bool {
    stack.get_json("/workers").await["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|w| w["url"] == url)
}

/// POSTs `path` (with `body`, if any) to `stack`'s admin port; its status.
async fn admin(stack: &Stack, path: &str, body: Option<serde_json::Value>) -> u16 {
    let mut r = reqwest::Client::new().post(stack.admin_url(path));
    if let Some(body) = body {
        r = r.json(&body);
    }
    r.send().await.map_or(0, |r| r.status().as_u16())
}

/// Sends `n` requests through `stack`; all must succeed.
async fn all_served(stack: &Stack, n: usize, what: &str) {
    for i in 0..n {
        let r = stack.post("/generate", GEN).await;
        assert_eq!(r.status(), 200, "{what}, request {i}");
    }
}

#[tokio::test]
async fn workers_changed_through_one_control_plane_reach_the_other() {
    let Some(mut redis) = redis::Store::start("fleet-store").await else {
        return;
    };
    let store = redis.flags.clone();
    let first = Stack::start(StackOptions {
        workers: 2,
        policy: "round_robin".into(),
        cp_args: store.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    // The second starts with no worker of its own (and, as every stack's
    // control plane, a state file).
    let mut second = Stack::start(StackOptions {
        workers: 0,
        policy: "round_robin".into(),
        cp_args: store,
        ..Default::default()
    })
    .await
    .unwrap();
    second.wait_fleet_of(&first).await;
    all_served(&second, 4, "through the second").await;

    // Added through the first: the second soon routes to it (the store
    // syncs every 50 ms; 5 s leaves room for a busy machine, and the time it
    // took is printed).
    let extra = SimWorker::start(&first.dir, &[]).await.unwrap();
    let added = Instant::now();
    let body = json!({ "url": extra.url });
    assert_eq!(admin(&first, "/workers", Some(body)).await, 202);
    let reached = wait_until(Duration::from_secs(5), || async {
        second.post("/generate", GEN).await.status() == 200 && extra.served().await > 0
    })
    .await;
    assert!(
        reached,
        "the second control plane did not route to a worker added through the first within 5 s:\n{}",
        second.control_plane_log()
    );
    eprintln!(
        "added through one, routed to by the other after {:?}",
        added.elapsed()
    );

    // Removed through the second: the first soon stops listing it.
    let path = format!("/remove_worker?url={}", extra.url);
    assert_eq!(admin(&second, &path, None).await, 200);
    let gone = wait_until(Duration::from_secs(5), || async {
        !lists(&first, &extra.url).await
    })
    .await;
    assert!(
        gone,
        "the first control plane still lists the removed worker"
    );

    // Changed while the second is down: it comes back with the change,
    // though its state file still names the worker removed meanwhile.
    second.kill_control_plane();
    let late = SimWorker::start(&first.dir, &[]).await.unwrap();
    let path = format!("/add_worker?url={}", late.url);
    assert_eq!(admin(&first, &path, None).await, 200);
    let dropped = first.workers[1].url.clone();
    let path = format!("/remove_worker?url={dropped}");
    assert_eq!(admin(&first, &path, None).await, 200);
    second.restart_control_plane().await.unwrap();
    assert!(
        second
            .wait_marked(&late.url, true, Duration::from_secs(5))
            .await,
        "the restarted control plane does not list the worker added while it was down"
    );
    let settled = wait_until(Duration::from_secs(5), || async {
        !lists(&second, &dropped).await
    })
    .await;
    assert!(
        settled,
        "the worker removed while the second was down came back there"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !lists(&first, &dropped).await,
        "the second's state file put a removed worker back in the store"
    );
    assert!(
        !lists(&second, &extra.url).await,
        "the removed worker came back"
    );

    // The store dies: no request fails, and a change made meanwhile
    // reaches the other control plane once a new, empty store is up.
    const UP: &str = "sgl_router_fleet_store_up";
    assert_eq!(first.metric(UP).await, 1.0, "the store answers");
    redis.kill();
    let down = wait_until(Duration::from_secs(2), || async {
        first.metric(UP).await == 0.0 && second.metric(UP).await == 0.0
    })
    .await;
    assert!(down, "{UP} still says the killed store answers");
    all_served(&first, 10, "through the first, store down").await;
    all_served(&second, 10, "through the second, store down").await;
    let path = format!("/remove_worker?url={}", late.url);
    assert_eq!(admin(&first, &path, None).await, 200);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        lists(&second, &late.url).await,
        "with the store down, the second cannot have heard of the removal"
    );
    redis.restart().await;
    let caught_up = wait_until(Duration::from_secs(3), || async {
        !lists(&second, &late.url).await
    })
    .await;
    assert!(
        caught_up,
        "the removal made while the store was down never reached the second:\n{}",
        second.control_plane_log()
    );
    assert_eq!(second.metric(UP).await, 1.0, "the store is back");
    // The empty store did not empty the fleet.
    for w in &first.workers[..1] {
        assert!(lists(&second, &w.url).await, "{} was lost", w.url);
        assert!(lists(&first, &w.url).await, "{} was lost", w.url);
    }
    all_served(&first, 10, "through the first, store back").await;
    all_served(&second, 10, "through the second, store back").await;
}
