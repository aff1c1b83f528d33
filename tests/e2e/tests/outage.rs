//! A control-plane outage under steady load: the control plane is killed,
//! kept down for a while and started again. What each test asserts, per
//! front door (the picker setup fails closed and skips both; see
//! `front_door::a_picker_fails_closed_at_once_and_routes_again_when_back`):
//!
//! - `ten_seconds_without_the_control_plane_fail_no_request` (10 s down,
//!   4 clients, two workers): through the wasm filter and the ext_proc front
//!   door alike, no request fails, at least 200 are served while the
//!   control plane is down, each worker serves at least a quarter of them,
//!   Envoy tries the dead control plane at most 140 times (the filter's
//!   80 and its EDS streams' 60) and the filter logs at most 80 lines (not
//!   once or thrice per request),
//!   and the restarted control plane routes again, knows the worker added at
//!   run time (from its state file) and counts loads back to zero.
//! - `pd_fleet_keeps_serving_while_the_control_plane_is_down` (5 s down,
//!   3 clients, 2 prefills and 1 decode): through the wasm filter at most 3
//!   requests fail (a request whose prefill half was in the killed process
//!   gets the decode's KV timeout, at most one per client), at least 50 are
//!   served during the outage, each after a KV handshake, some with prefill
//!   halves the filter sent itself. Through the ext_proc front door every
//!   request sent during the outage fails: the worker refuses the decode
//!   half (400), at least 10 times; of the 3 requests in flight at the kill
//!   (one per client) some may still be served or fail with the KV timeout,
//!   3 at most in all. In both, PD requests are served again once the
//!   control plane is back.
//! - `vms_that_served_nothing_yet_fall_back_on_their_worker_list` (wasm
//!   only): a VM polls the worker list from its start, not from its first
//!   request; the control plane killed before the VMs' first requests,
//!   none fails.
//! - `an_envoy_started_while_the_control_plane_was_down_serves_soon_after`
//!   (wasm and ext_proc): an Envoy started with the control plane down,
//!   which kept it down 15 s more, serves within 2.5 s of its return (its
//!   worker list, over EDS, follows within the reconnect backoff's 1 s).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sglang_envoy_e2e::{burst, wait_until, FrontDoor, PdOptions, SimWorker, Stack, StackOptions};

/// Requests served during the 10 s outage, at least: 4 closed-loop clients
/// each get a short answer every few ms on loopback; a fallback that
/// stalled or failed would serve none.
const SERVED_IN_TEN_SECONDS: u64 = 200;
/// PD requests served during the 5 s outage through the wasm filter, at
/// least (3 clients; each request is two exchanges and a KV handshake); on
/// a machine that served fewer a second before the outage, that many.
const PD_SERVED_IN_FIVE_SECONDS: u64 = 50;

/// Envoy's count of connections opened (or tried) to the control plane.
const CONTROL_PLANE_CONNECTIONS: &str = "cluster.sglang_control_plane.upstream_cx_total";
/// The wasm filter's count of requests it routed itself, in Envoy's stats.
const LOCAL_FALLBACKS: &str = "wasmcustom.sglang_router_local_fallbacks";
/// Connections the wasm filter's one VM may try to a dead control plane
/// in 10 s, at most (about 40 measured): its session reopens and its probes each back off from
/// 100 ms to 2 s (9 tries each in 10 s), and the worker list is asked every
/// second (10). A filter that called once per request would try at least
/// 200 times.
const MAX_TRIES_IN_TEN_SECONDS: u64 = 80;
/// Connections Envoy's own EDS streams (the workers' and the prefill
/// workers' clusters) may try to a dead control plane in 10 s, at most:
/// envoy/'s configs reopen each within 1 s (a jittered backoff from 0.1 s),
/// about 20 tries each. 89 were measured in all, with the filter's.
const EDS_TRIES_IN_TEN_SECONDS: u64 = 60;

/// Waits until the outage fallback knows the fleet: the wasm filter has
/// fetched the control plane's list of healthy workers since this call, or
/// Envoy's EDS cluster `cluster` (the ext_proc front door's fallback) has
/// `endpoints` endpoints.
async fn fallback_knows(stack: &Stack, cluster: &str, endpoints: u64) -> bool {
    if FrontDoor::current() == FrontDoor::Wasm {
        stack
            .wait_worker_list_fetched(Duration::from_secs(10))
            .await
    } else {
        let stat = format!("cluster.{cluster}.membership_total");
        wait_until(Duration::from_secs(10), || async {
            stack.envoy_stat(&stat).await == Some(endpoints)
        })
        .await
    }
}

/// Waits until `counter` has grown by `by` from its value now.
async fn grows_by(counter: &AtomicU64, by: u64, timeout: Duration) -> bool {
    let from = counter.load(Ordering::Relaxed);
    wait_until(timeout, || async {
        counter.load(Ordering::Relaxed) >= from + by
    })
    .await
}

/// Healthy workers according to the control plane's own `/health`.
async fn healthy_workers(stack: &Stack) -> u64 {
    let Ok(r) = reqwest::get(stack.admin_url("/health")).await else {
        return 0;
    };
    let health: serde_json::Value = r.json().await.unwrap_or_default();
    health["healthy_workers"].as_u64().unwrap_or(0)
}

/// A VM opens its session with its first request, but polls the worker
/// list from its start: one that has served nothing yet when the control
/// plane dies routes on that list like the others. A change once held the
/// poll back until a VM's first session was up, and a VM's first request
/// after a control plane stopped got 503 (the compose HA test). 4 VMs,
/// the readiness probe reaches one; 2 s later (two polls each) the control
/// plane is killed and 16 clients send requests on new connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vms_that_served_nothing_yet_fall_back_on_their_worker_list() {
    if FrontDoor::current() != FrontDoor::Wasm {
        eprintln!("skipped: the wasm filter's own worker list");
        return;
    }
    let mut stack = Stack::start(StackOptions {
        workers: 2,
        envoy_concurrency: 4,
        ..Default::default()
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stack.kill_control_plane();
    let url = stack.url("/v1/chat/completions");
    let failed = burst(&url, 16, Duration::from_millis(400), short_chat).await;
    let fallbacks = stack.envoy_stat(LOCAL_FALLBACKS).await.unwrap_or(0);
    assert!(
        failed.is_empty(),
        "{} failed, the first: {:?}\n{}",
        failed.len(),
        &failed[..failed.len().min(3)],
        stack.envoy_log()
    );
    assert!(fallbacks >= 16, "{fallbacks} requests routed on the list");
}

/// An Envoy started while the control plane is down has no worker list:
/// its EDS stream keeps failing, and Envoy's own reconnect backoff grows
/// to 30 s with full jitter, so once the control plane was back Envoy
/// answered 503 `no healthy upstream` for up to that long (25 s in one run
/// by hand). envoy/'s configs bound the backoff to 1 s.
#[tokio::test]
async fn an_envoy_started_while_the_control_plane_was_down_serves_soon_after() {
    if FrontDoor::current() == FrontDoor::Picker {
        eprintln!("skipped: the picker setup fails closed (front_door.rs)");
        return;
    }
    let mut stack = Stack::start(StackOptions {
        workers: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    stack.kill_control_plane();
    // Ready once its EDS wait (initial_fetch_timeout) has passed.
    stack.restart_envoy().await.unwrap();
    tokio::time::sleep(Duration::from_secs(15)).await;
    stack.restart_control_plane().await.unwrap();
    let back = Instant::now();
    let url = stack.url("/v1/models");
    let served = wait_until(Duration::from_secs(40), || async {
        matches!(reqwest::get(&url).await, Ok(r) if r.status() == 200)
    })
    .await;
    let took = back.elapsed();
    assert!(served, "never served again:\n{}", stack.envoy_log());
    assert!(
        took < Duration::from_millis(2500),
        "served {took:?} after the control plane returned"
    );
}

/// A short chat request; `i` makes each client's prompt its own.
fn short_chat(i: usize) -> String {
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": format!("client {i} says hello")}],
        "max_tokens": 4
    })
    .to_string()
}

#[tokio::test]
async fn ten_seconds_without_the_control_plane_fail_no_request() {
    if FrontDoor::current() == FrontDoor::Picker {
        // Full duplex fails closed: `front_door::a_picker_fails_closed_...`.
        eprintln!("skipped: the picker setup fails closed");
        return;
    }
    let mut stack = Stack::start(StackOptions {
        workers: 1,
        policy: "round_robin".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    // A worker added at run time: it must survive the restart too.
    let added = SimWorker::start(&stack.dir, &[]).await.unwrap();
    let r = reqwest::Client::new()
        .post(stack.admin_url("/workers"))
        .json(&json!({"url": added.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    // The control plane has probed it healthy...
    assert!(
        wait_until(Duration::from_secs(10), || async {
            healthy_workers(&stack).await == 2
        })
        .await,
        "the added worker was never healthy"
    );
    // ...and the fallback has a worker list that includes it.
    assert!(
        fallback_knows(&stack, "sglang_workers", 2).await,
        "the fallback never learned of the added worker"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut clients = Vec::new();
    for c in 0..4 {
        let (url, stop, ok, failed) = (
            stack.url("/v1/chat/completions"),
            stop.clone(),
            ok.clone(),
            failed.clone(),
        );
        clients.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut i = 0u64;
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let body = json!({
                    "model": "m",
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": format!("client {c} request {i}")}],
                });
                match client.post(&url).json(&body).send().await {
                    Ok(r) if r.status() == 200 => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        failures.push(format!(
                            "{}: {}",
                            r.status(),
                            r.text().await.unwrap_or_default()
                        ));
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        failures.push(e.to_string());
                    }
                }
            }
            failures
        }));
    }

    // The load is under way before the kill.
    assert!(
        grows_by(&ok, 20, Duration::from_secs(10)).await,
        "no load before the outage ({} failed)",
        failed.load(Ordering::Relaxed)
    );
    let before_outage = ok.load(Ordering::Relaxed);
    let attempts_before = stack.envoy_stat(CONTROL_PLANE_CONNECTIONS).await;
    let fallbacks_before = stack.envoy_stat(LOCAL_FALLBACKS).await.unwrap_or(0);
    let log_before = stack.envoy_log().len();
    stack.kill_control_plane();
    let served_before: Vec<u64> = vec![stack.workers[0].served().await, added.served().await];
    // The outage: ten seconds, however many requests they hold.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let during = ok.load(Ordering::Relaxed) - before_outage;
    let served_during = [
        stack.workers[0].served().await - served_before[0],
        added.served().await - served_before[1],
    ];
    let attempts = stack.envoy_stat(CONTROL_PLANE_CONNECTIONS).await;
    let attempts = attempts.unwrap_or(0) - attempts_before.unwrap_or(0);
    let fallbacks = stack.envoy_stat(LOCAL_FALLBACKS).await.unwrap_or(0) - fallbacks_before;
    let filter_warnings = stack
        .envoy_log()
        .get(log_before..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("wasm log"))
        .count();
    stack.restart_control_plane().await.unwrap();
    // The restarted control plane routes the load again (the filter's
    // session comes back within 2 s; ext_proc opens a stream per request).
    let routed_again = wait_until(Duration::from_secs(15), || async {
        stack.metric("sgl_router_requests_total").await >= 20.0
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for c in clients {
        failures.extend(c.await.unwrap());
    }

    eprintln!(
        "{during} served during the outage, by worker {served_during:?}; \
         {attempts} connections tried to the control plane, {filter_warnings} filter log lines, \
         {fallbacks} counted as routed by the filter"
    );
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        during >= SERVED_IN_TEN_SECONDS,
        "only {during} requests served while the control plane was down"
    );
    assert!(
        served_during.iter().all(|&n| n >= during / 4),
        "the fallback spreads over both workers: {served_during:?}"
    );
    if FrontDoor::current() == FrontDoor::Wasm {
        // The filter stops calling a control plane that refused: its tries
        // follow its backoff, not the requests (each of which used to make
        // a call, and write three warnings, of its own).
        assert!(
            attempts <= MAX_TRIES_IN_TEN_SECONDS + EDS_TRIES_IN_TEN_SECONDS,
            "{attempts} connections tried to the dead control plane while {during} requests were served"
        );
        assert!(
            filter_warnings <= MAX_TRIES_IN_TEN_SECONDS as usize,
            "{filter_warnings} filter log lines while {during} requests were served"
        );
        // What the log no longer says per request, Envoy's stats count:
        // every request served in the outage but those of the 4 clients
        // that had their answer before the kill.
        assert!(
            fallbacks + 4 >= during,
            "{fallbacks} counted as routed by the filter, {during} served during the outage"
        );
    }
    assert!(
        routed_again,
        "the restarted control plane routed {} requests",
        stack.metric("sgl_router_requests_total").await
    );
    // The restarted control plane knows the admin-added worker...
    let listed = stack.get_json("/list_workers").await;
    let urls = listed["urls"].as_array().unwrap();
    assert_eq!(urls.len(), 2, "{listed}");
    assert!(urls.iter().any(|u| u == &added.url));
    // ...and its load counts return to zero: nothing counted twice or lost.
    assert!(
        stack.wait_loads_zero(Duration::from_secs(5)).await,
        "{:?}",
        stack.loads().await
    );
    let after = stack.get_json("/workers").await;
    assert_eq!(after["in_flight"], 0, "{after}");
}

/// Sends chat requests from `clients` tasks until `stop`; returns failures.
fn load(
    stack: &Stack,
    clients: usize,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<Vec<String>>> {
    (0..clients)
        .map(|c| {
            let (url, stop, ok) = (stack.url("/v1/chat/completions"), stop.clone(), ok.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let t0 = std::time::Instant::now();
                let mut failures = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let body = json!({
                        "model": "m",
                        "max_tokens": 3,
                        "stream": i % 2 == 0,
                        "messages": [{"role": "user", "content": format!("pd client {c} request {i}")}],
                    });
                    let started = std::time::Instant::now();
                    // When and how long: a failure's timing tells a lost
                    // prefill half (the KV timeout) from a stuck request.
                    let timed = |what: String| {
                        format!("{what} (sent {:?} after the first, took {:?})", started - t0, started.elapsed())
                    };
                    match client.post(&url).json(&body).send().await {
                        Ok(r) if r.status() == 200 => {
                            let text = r.text().await.unwrap_or_default();
                            if text.contains("\"error\"") {
                                failures.push(timed(text));
                            } else {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Ok(r) => failures.push(timed(format!("{}: {}", r.status(), r.text().await.unwrap_or_default()))),
                        Err(e) => failures.push(timed(e.to_string())),
                    }
                }
                failures
            })
        })
        .collect()
}

#[tokio::test]
async fn pd_fleet_keeps_serving_while_the_control_plane_is_down() {
    if FrontDoor::current() == FrontDoor::Picker {
        // Full duplex fails closed: `front_door::a_picker_fails_closed_...`.
        eprintln!("skipped: the picker setup fails closed");
        return;
    }
    let mut stack = Stack::start(StackOptions {
        pd: Some(PdOptions {
            prefills: 2,
            decodes: 1,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    // The filter's list says PD and names both prefills (ext_proc: EDS
    // names the decode; that fallback has no prefill half).
    assert!(
        fallback_knows(&stack, "sglang_workers", 1).await,
        "the fallback never learned of the fleet"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let load_started = std::time::Instant::now();
    let clients = load(&stack, 3, stop.clone(), ok.clone());
    assert!(
        grows_by(&ok, 10, Duration::from_secs(10)).await,
        "no load before the outage"
    );
    stack.kill_control_plane();
    let killed_at = std::time::Instant::now();
    let before = ok.load(Ordering::Relaxed);
    // What the clients got through per second before the outage: the
    // outage's bound scales with it (a slower machine serves fewer).
    let rate_before = before as f64 / (killed_at - load_started).as_secs_f64();
    let fetched_before = stack.decodes[0].stats().await["kv_fetched"]
        .as_u64()
        .unwrap_or(0);
    // The outage: five seconds, however many requests they hold.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let during = ok.load(Ordering::Relaxed) - before;
    let fetched_during = stack.decodes[0].stats().await["kv_fetched"]
        .as_u64()
        .unwrap_or(0)
        - fetched_before;
    stack.restart_control_plane().await.unwrap();
    // PD requests are served again once the control plane is back (the
    // filter's session returns within 2 s; ext_proc asks per request).
    let served_again = grows_by(&ok, 10, Duration::from_secs(15)).await;
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for c in clients {
        failures.extend(c.await.unwrap());
    }
    eprintln!(
        "{during} served during the outage, {} failed in all",
        failures.len()
    );
    assert!(served_again, "no PD request served after the restart");
    if FrontDoor::current().is_ext_proc() {
        // Envoy's ext_proc filter can only fail open: the decode half goes
        // out without bootstrap fields and the worker refuses it (400), at
        // once rather than after a KV timeout. As with the filter below, a
        // request decided just before the kill (at most one per client)
        // lost its prefill half with the process and fails with the KV
        // timeout instead, or was past its handshake and is served.
        let refused = failures.iter().filter(|f| f.starts_with("400")).count();
        let kv_lost = failures
            .iter()
            .filter(|f| f.contains("KV transfer failed"))
            .count();
        assert!(
            kv_lost <= 3 && refused + kv_lost == failures.len(),
            "{} failures: {:?}",
            failures.len(),
            &failures[..failures.len().min(3)]
        );
        // Refusals come at once: the clients meet many in five seconds.
        assert!(
            refused >= 10,
            "only {refused} requests refused during the outage"
        );
        // Only the requests in flight at the kill, one per client, were
        // served or lost their prefill half; every later one was refused.
        assert!(
            during + kv_lost as u64 <= 3,
            "{during} PD requests served without the control plane, {kv_lost} lost"
        );
        return;
    }
    // The prefill half of a request decided just before the kill lived in
    // the killed process: that request's decode waits for a KV cache nobody
    // sends and fails with the worker's KV timeout. At most one per client
    // can be caught that way; every other request must succeed.
    assert!(
        failures.len() <= 3 && failures.iter().all(|f| f.contains("KV transfer failed")),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    // Up to the three clients may wait out a KV timeout (3 s of the 5);
    // a fifth of the rate before is still many times what a fallback that
    // waited for the dead control plane's deadline on each request serves.
    let least = PD_SERVED_IN_FIVE_SECONDS.min(rate_before as u64).max(10);
    assert!(
        during >= least,
        "only {during} served during the outage, under {least} ({rate_before:.0}/s before; killed {:?} after the load started); failures: {failures:?}",
        killed_at - load_started
    );
    // Up to one request per client was already past its handshake at the kill.
    assert!(
        fetched_during + 3 >= during,
        "every answer needed a KV handshake: {fetched_during} < {during}"
    );
    // The filter built the bootstrap fields itself meanwhile.
    let local = stack.prefills[0]
        .requests()
        .await
        .iter()
        .chain(stack.prefills[1].requests().await.iter())
        .filter(|r| r["body"].as_str().is_some_and(|b| b.contains("-envoy\"")))
        .count();
    assert!(
        local > 0,
        "no prefill request came from the filter's fallback"
    );
    assert!(
        stack.wait_loads_zero(Duration::from_secs(5)).await,
        "{:?}",
        stack.loads().await
    );
}
