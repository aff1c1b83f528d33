//! A control plane told to stop (SIGTERM: a rolling update, `docker
//! stop`) while another serves beside it: it drains instead of dropping
//! what it runs (`control-plane/src/shutdown.rs`), so no client request
//! fails. The test that matters is PD: a control plane that simply exited
//! would drop the prefill halves it sent, each decode would then wait for
//! KV that never comes, and its client would get an error (it did: 3
//! requests of 3 in flight failed with 500, in 3 runs of 3).
//!
//! Through the wasm filter, its session moves to the other control plane;
//! through ext_proc, Envoy opens the next requests' streams there (with a
//! retry, in `envoy/envoy-ext-proc.yaml`, for a stream that met the closed
//! port before Envoy ejected it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use sglang_envoy_e2e::{
    free_port, in_rotation, redis, wait_until, FrontDoor, PdOptions, Stack, StackOptions,
};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// The wasm filter's count of requests it routed itself, in Envoy's stats.
const LOCAL_FALLBACKS: &str = "wasmcustom.sglang_router_local_fallbacks";

/// Closed-loop clients: enough that the stopped control plane has prefills
/// in flight when the signal comes, also when it takes half of them
/// (ext_proc).
const CLIENTS: usize = 6;

/// A PD chat request whose prompt takes the simulated prefill server about
/// 150 ms (0.5 ms a token, about 4 bytes a token), so that prefills are in
/// flight whenever the signal comes.
fn chat(i: usize) -> String {
    let words = "the quick brown fox jumps over the lazy dog ".repeat(28);
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": format!("{i} {words}")}],
        "max_tokens": 3,
    })
    .to_string()
}

/// The filter sessions open on `stack`'s control plane.
async fn sessions(stack: &Stack) -> f64 {
    stack.metric("sgl_router_filter_sessions").await
}

/// Sends requests through `base` until `stop`, recording each status.
async fn client(id: usize, base: String, stop: Arc<AtomicBool>, record: Arc<Mutex<Vec<u16>>>) {
    let http = reqwest::Client::new();
    let mut i = id * 1000;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let status = match http
            .post(format!("{base}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(chat(i))
            .send()
            .await
        {
            Ok(r) => {
                let status = r.status().as_u16();
                // The whole answer, so a broken one counts as failed.
                match r.text().await {
                    Ok(text) if status == 200 && !text.contains("\"choices\"") => 599,
                    Ok(_) => status,
                    Err(_) => 598,
                }
            }
            Err(_) => 597,
        };
        record.lock().unwrap().push(status);
    }
}

#[tokio::test]
async fn a_control_plane_stopped_under_pd_load_lets_its_prefills_finish() {
    if FrontDoor::current() == FrontDoor::Picker {
        // An InferencePool gateway's cluster to its pickers, and what it
        // does when one goes away, are the gateway's (deploy/gie).
        eprintln!("skipped: the picker's failover is its gateway's");
        return;
    }
    let Some(store) = redis::Store::start("drain").await else {
        return;
    };
    let store_args = store.flags.clone();
    let wasm = FrontDoor::current() == FrontDoor::Wasm;
    let grpc = [free_port(), free_port()];
    // The first control plane, with the PD fleet, starts alone: Envoy's
    // one filter session opens on it.
    let first = Stack::start(StackOptions {
        pd: Some(PdOptions::default()),
        worker_args: [
            "--prefill-us-per-token",
            "500",
            "--decode-us-per-token",
            "100",
        ]
        .map(String::from)
        .to_vec(),
        cp_args: store_args.clone(),
        cp_grpc_port: Some(grpc[0]),
        more_control_planes: vec![grpc[1]],
        ..Default::default()
    })
    .await
    .unwrap();
    // The second takes the fleet from the store.
    let second = Stack::start(StackOptions {
        pd: Some(PdOptions {
            prefills: 0,
            decodes: 0,
            ..Default::default()
        }),
        cp_args: store_args,
        cp_grpc_port: Some(grpc[1]),
        ..Default::default()
    })
    .await
    .unwrap();
    second.wait_fleet_of(&first).await;
    // The second's port refused connections while the first's Envoy
    // started, which ejected it for a while (outlier detection): with the
    // first gone too, Envoy would ignore the ejection (its panic mode).
    let in_rotation = wait_until(Duration::from_secs(15), || {
        in_rotation(&first.envoy_admin, grpc[1])
    })
    .await;
    assert!(
        in_rotation,
        "Envoy never took the second control plane back"
    );
    // Through the wasm filter, the control plane that holds its one
    // session is stopped (the first, unless that session opened before it
    // answered); through ext_proc, whose streams Envoy spreads over both,
    // the first.
    let with_session = wait_until(Duration::from_secs(10), || async {
        !wasm || sessions(&first).await + sessions(&second).await >= 1.0
    })
    .await;
    assert!(with_session, "the filter opened no session");
    let base = first.base.clone();
    let first_stopped = !wasm || sessions(&first).await >= 1.0;
    let (mut stopped, other) = if first_stopped {
        (first, second)
    } else {
        (second, first)
    };

    // The readiness probe's question may have met the second's port
    // before it listened.
    // The clients' Envoy is the first stack's.
    let fallbacks_before = if first_stopped { &stopped } else { &other }
        .envoy_stat(LOCAL_FALLBACKS)
        .await
        .unwrap_or(0);
    let stop = Arc::new(AtomicBool::new(false));
    let record = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| tokio::spawn(client(id, base.clone(), stop.clone(), record.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = record.lock().unwrap().len();
    assert!(
        stopped.signal_control_plane("TERM"),
        "no control plane to stop"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }

    assert!(
        stopped.control_plane_exits(Duration::from_secs(10)).await,
        "the stopped control plane did not exit"
    );
    let statuses = record.lock().unwrap().clone();
    let after = statuses.len() - before;
    let log = stopped.control_plane_log();
    // What it said it waited for when the signal came.
    let in_flight = log
        .lines()
        .find(|l| l.contains("draining"))
        .and_then(|l| l.split("prefills=").nth(1))
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|v| v.parse::<u64>().ok());
    eprintln!(
        "{} requests ({before} before the signal), {in_flight:?} prefills in flight at it",
        statuses.len()
    );
    let failed: Vec<u16> = statuses.iter().copied().filter(|&s| s != 200).collect();
    assert!(
        failed.is_empty(),
        "failed requests: {failed:?}\n{}",
        log.lines()
            .filter(|l| l.contains("drain"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(after >= CLIENTS, "only {after} requests after the signal");
    // It had prefills to wait for, or this test proves nothing.
    assert!(
        in_flight.is_some_and(|n| n >= 1),
        "no prefill in flight when the signal came ({in_flight:?}):\n{log}"
    );
    assert!(log.contains("drained"), "it did not wait for them:\n{log}");

    // The rest were routed by the other control plane, none by the
    // filter on its own.
    if wasm {
        assert!(sessions(&other).await >= 1.0, "the session did not move");
        let envoy = if first_stopped { &stopped } else { &other };
        let fallbacks = envoy.envoy_stat(LOCAL_FALLBACKS).await.unwrap_or(0);
        assert_eq!(
            fallbacks - fallbacks_before,
            0,
            "requests routed by the filter on its own"
        );
    }
}

/// A PD control plane (`cp_args` more flags) with a prefill of about
/// 2.5 s in flight, and the request waiting for it.
async fn with_a_slow_prefill(
    cp_args: Vec<String>,
) -> (Stack, JoinHandle<reqwest::Result<reqwest::Response>>) {
    let stack = Stack::start(StackOptions {
        pd: Some(PdOptions::default()),
        // About 2.5 s of prefill for the prompt below: under the decode's
        // KV wait (3 s), so the request is still whole when it is checked.
        worker_args: [
            "--prefill-us-per-token",
            "20000",
            "--decode-us-per-token",
            "100",
        ]
        .map(String::from)
        .to_vec(),
        cp_args,
        ..Default::default()
    })
    .await
    .unwrap();
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "slow ".repeat(100)}],
        "max_tokens": 2,
    })
    .to_string();
    let request = stack.post_spawned("/v1/chat/completions", body);
    // Returned once the prefill runs, not after a fixed time that a slow
    // machine may end before the control plane sent it.
    let prefill = &stack.prefills[0];
    assert!(
        wait_until(Duration::from_secs(2), || async {
            prefill.stats().await["in_flight"].as_u64() > Some(0)
        })
        .await,
        "the prefill never started"
    );
    (stack, request)
}

/// A control plane told twice to stop (Ctrl-C, then Ctrl-C again) stops
/// waiting: the first signal drains, and it keeps running while a prefill
/// it sent runs; the second ends it at once.
#[tokio::test]
async fn told_twice_it_stops_waiting() {
    if FrontDoor::current() != FrontDoor::Wasm {
        eprintln!("skipped: the control plane's own behaviour; one pass is enough");
        return;
    }
    let (mut stack, request) = with_a_slow_prefill(Vec::new()).await;
    assert!(stack.signal_control_plane("TERM"));
    assert!(
        !stack.control_plane_exits(Duration::from_secs(1)).await,
        "it did not wait for its prefill"
    );
    assert!(stack.signal_control_plane("TERM"));
    assert!(
        stack.control_plane_exits(Duration::from_millis(500)).await,
        "told twice, it still waited"
    );
    let log = stack.control_plane_log();
    assert!(log.contains("told again to stop"), "{log}");
    request.abort();
}

/// `service`'s status on the gRPC health service of `client` (`None` when
/// it does not answer).
async fn status(client: &HealthClient<Channel>, service: &str) -> Option<ServingStatus> {
    let request = HealthCheckRequest {
        service: service.to_string(),
    };
    let answer = client.clone().check(request).await.ok()?;
    ServingStatus::try_from(answer.into_inner().status).ok()
}

/// While it drains, the control plane's gRPC health (what a gateway checks
/// on `--grpc-health-port`) says it takes no new work, and that it lives:
/// a liveness probe that restarted it would cut its prefill short.
#[tokio::test]
async fn draining_it_says_it_is_not_ready_but_alive() {
    if FrontDoor::current() != FrontDoor::Wasm {
        eprintln!("skipped: the control plane's own behaviour; one pass is enough");
        return;
    }
    let port = free_port();
    let (mut stack, request) =
        with_a_slow_prefill(vec!["--grpc-health-port".into(), port.to_string()]).await;
    let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = HealthClient::new(channel);
    const NOT_ALIVE: [&str; 4] = [
        "",
        "readiness",
        "inference-extension",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ];
    for service in NOT_ALIVE {
        assert_eq!(
            status(&client, service).await,
            Some(ServingStatus::Serving),
            "{service:?} before the signal"
        );
    }
    assert!(stack.signal_control_plane("TERM"));
    let not_ready = wait_until(Duration::from_secs(1), || async {
        status(&client, "readiness").await == Some(ServingStatus::NotServing)
    })
    .await;
    assert!(not_ready, "still ready while draining");
    for service in NOT_ALIVE {
        assert_eq!(
            status(&client, service).await,
            Some(ServingStatus::NotServing),
            "{service:?} while draining"
        );
    }
    assert_eq!(
        status(&client, "liveness").await,
        Some(ServingStatus::Serving)
    );
    assert!(
        !stack.control_plane_exits(Duration::ZERO).await,
        "it exited before it was checked: the test shows nothing"
    );
    assert!(stack.signal_control_plane("TERM"));
    request.abort();
}
