//! Several control planes, all active (issue 28): three control planes
//! sharing one worker list through a real Redis, two Envoys whose cluster
//! `sglang_control_plane` lists all three, and steady load through both.
//! One control plane is killed (SIGKILL) and later restarted, a worker is
//! added through another, and Redis is killed and restarted: no client
//! request fails in any phase, and no question waits for its deadline or
//! falls back to the filter's own routing: a broken session's questions go
//! to a live replica at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sglang_envoy_e2e::{free_port, redis, wait_until, FrontDoor, SimWorker, Stack, StackOptions};

/// Client tasks sending at once, spread over both Envoys.
const CLIENTS: usize = 8;
/// Prompt families: each shares a long prefix, as chat sessions do.
const FAMILIES: usize = 6;

/// One request's outcome.
struct Outcome {
    phase: &'static str,
    status: u16,
    /// What a failed request was answered.
    error: String,
    latency: Duration,
    prompt_tokens: u64,
    cached_tokens: u64,
}

/// What the clients record, and the phase they are in.
#[derive(Default)]
struct Record {
    phase: Mutex<&'static str>,
    outcomes: Mutex<Vec<Outcome>>,
    stop: AtomicBool,
}

fn body(family: usize, turn: usize) -> String {
    let prefix = format!("family {family} shares this system prompt. ").repeat(40);
    json!({
        "text": format!("{prefix} turn {turn}"),
        "sampling_params": {"max_new_tokens": 4},
    })
    .to_string()
}

/// One client: requests through `bases` in turn until told to stop.
async fn client(id: usize, bases: Vec<String>, record: Arc<Record>) {
    let http = reqwest::Client::new();
    let mut turn = 0;
    while !record.stop.load(Ordering::Relaxed) {
        turn += 1;
        let base = &bases[(id + turn) % bases.len()];
        let family = (id * 7 + turn) % FAMILIES;
        let phase = *record.phase.lock().unwrap();
        let started = Instant::now();
        let sent = http
            .post(format!("{base}/generate"))
            .timeout(Duration::from_secs(30))
            .header("content-type", "application/json")
            .body(body(family, turn))
            .send()
            .await;
        let (status, meta, error) = match sent {
            Ok(r) => {
                let status = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                let v: Value = serde_json::from_str(&text).unwrap_or_default();
                let error = if status == 200 { String::new() } else { text };
                (status, v["meta_info"].clone(), error)
            }
            Err(e) => (0, Value::Null, e.to_string()),
        };
        record.outcomes.lock().unwrap().push(Outcome {
            phase,
            status,
            error,
            latency: started.elapsed(),
            prompt_tokens: meta["prompt_tokens"].as_u64().unwrap_or(0),
            cached_tokens: meta["cached_tokens"].as_u64().unwrap_or(0),
        });
    }
}

/// Starts a phase, lasting `for_` while the clients run.
async fn phase(record: &Record, name: &'static str, for_: Duration) {
    *record.phase.lock().unwrap() = name;
    tokio::time::sleep(for_).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_control_planes_lose_one_and_no_request_notices() {
    if FrontDoor::current() == FrontDoor::Picker {
        // An InferencePool gateway's cluster to its pickers, and what it
        // does when one dies, are the gateway's (deploy/gie).
        eprintln!("skipped: the picker's failover is its gateway's");
        return;
    }
    let Some(mut store) = redis::Store::start("replicas").await else {
        return;
    };
    let store_args = store.flags.clone();
    let grpc = [free_port(), free_port(), free_port()];
    // Each Envoy's cluster lists every control plane, its own first (the
    // order a DNS name's addresses come in does not matter).
    let options = |i: usize, workers: usize| StackOptions {
        workers,
        cp_args: store_args.clone(),
        cp_grpc_port: Some(grpc[i]),
        more_control_planes: (1..3).map(|k| grpc[(i + k) % 3]).collect(),
        // Two filter VMs per Envoy: two sessions each.
        envoy_concurrency: 2,
        ..Default::default()
    };
    let mut first = Stack::start(options(0, 3)).await.unwrap();
    let second = Stack::start(options(1, 0)).await.unwrap();
    let third = Stack::start(options(2, 0)).await.unwrap();
    for stack in [&second, &third] {
        stack.wait_fleet_of(&first).await;
    }

    // What the Envoys logged before the load (a VM's first question, asked
    // before its session is up, may have met a control plane not started
    // yet) is not this test's.
    let logged_before = [first.envoy_log().len(), second.envoy_log().len()];
    let record = Arc::new(Record::default());
    *record.phase.lock().unwrap() = "steady";
    let bases = vec![first.base.clone(), second.base.clone()];
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| tokio::spawn(client(id, bases.clone(), record.clone())))
        .collect();

    tokio::time::sleep(Duration::from_secs(3)).await;
    // The first Envoy's sessions opened while only the first control plane
    // ran: killing it breaks them under load.
    first.kill_control_plane();
    phase(&record, "one killed", Duration::from_secs(4)).await;
    *record.phase.lock().unwrap() = "restarting";
    first.restart_control_plane().await.unwrap();
    phase(&record, "restarted", Duration::from_secs(3)).await;

    // Added through the third: every control plane soon has it.
    *record.phase.lock().unwrap() = "worker added";
    let extra = SimWorker::start(&store.dir, &[]).await.unwrap();
    let added = Instant::now();
    let r = reqwest::Client::new()
        .post(third.admin_url("/workers"))
        .json(&json!({ "url": extra.url }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    // The store's sync runs every 50 ms; 5 s leaves room for a busy machine
    // (the time it took is printed below).
    for stack in [&first, &second, &third] {
        let left = Duration::from_secs(5).saturating_sub(added.elapsed());
        assert!(
            stack.wait_marked(&extra.url, true, left).await,
            "a control plane did not have the worker added through another within 5 s"
        );
    }
    eprintln!(
        "added through one, listed by all three after {:?}",
        added.elapsed()
    );
    // A prompt no worker has seen goes to the one with the emptiest cache,
    // the new one, through either Envoy (whichever replica answers).
    for (i, stack) in [&first, &second].into_iter().enumerate() {
        let before = extra.served().await;
        let fresh = json!({"text": format!("never seen before {i}"), "sampling_params": {"max_new_tokens": 1}});
        let r = stack.post("/generate", &fresh.to_string()).await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            extra.served().await,
            before + 1,
            "a new prompt did not go to the new worker"
        );
    }
    eprintln!("routed to through both Envoys after {:?}", added.elapsed());
    tokio::time::sleep(Duration::from_secs(2)).await;

    *record.phase.lock().unwrap() = "store killed";
    store.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    *record.phase.lock().unwrap() = "store restarted";
    store.restart().await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    record.stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }

    let outcomes = record.outcomes.lock().unwrap();
    let mut failed = Vec::new();
    eprintln!("phase            requests  failed  max latency  hit ratio");
    for name in [
        "steady",
        "one killed",
        "restarting",
        "restarted",
        "worker added",
        "store killed",
        "store restarted",
    ] {
        let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.phase == name).collect();
        let bad = of.iter().filter(|o| o.status != 200).count();
        let max = of.iter().map(|o| o.latency).max().unwrap_or_default();
        let prompt: u64 = of.iter().map(|o| o.prompt_tokens).sum();
        let cached: u64 = of.iter().map(|o| o.cached_tokens).sum();
        eprintln!(
            "{name:<16} {:>8}  {bad:>6}  {max:>11.0?}  {:.3}",
            of.len(),
            cached as f64 / prompt.max(1) as f64
        );
        assert!(!of.is_empty(), "no request in phase {name}");
        failed.extend(
            of.iter()
                .filter(|o| o.status != 200)
                .map(|o| (name, o.status, o.error.clone())),
        );
    }
    // A single replica's hit ratio is at most 1: at least 0.95 here is at
    // least 95% of it.
    let prompt: u64 = outcomes.iter().map(|o| o.prompt_tokens).sum();
    let cached: u64 = outcomes.iter().map(|o| o.cached_tokens).sum();
    let hit = cached as f64 / prompt.max(1) as f64;
    eprintln!("hit ratio over the run: {hit:.3}");
    assert!(hit >= 0.95, "hit ratio over the run {hit:.3}");
    let warnings = || {
        [&first, &second]
            .map(|stack| {
                let log = stack.envoy_log();
                let lines: Vec<&str> = log.lines().filter(|l| l.contains("wasm log")).collect();
                lines.join("\n")
            })
            .join("\n----\n")
    };
    assert!(
        failed.is_empty(),
        "failed requests: {failed:?}\nthe filters' warnings:\n{}",
        warnings()
    );

    // No question waited for its deadline or was routed by the filter on
    // its own: each went to a live control plane.
    for (stack, before) in [&first, &second].into_iter().zip(logged_before) {
        let log = stack.envoy_log().split_off(before);
        for sign in [
            "(local fallback)",
            "no answer on the control plane session in time",
        ] {
            let n = log.matches(sign).count();
            assert_eq!(n, 0, "{n} times {sign:?} in Envoy's log:\n{log}");
        }
    }
}

/// Two control planes sharing a real Redis, each behind an Envoy of its
/// own that reaches only it, so which one decides is known: the first
/// with `workers` simulated workers, the second with none until it takes
/// them from the store. `None` where the pass cannot run it.
struct Pair {
    store: redis::Store,
    first: Stack,
    second: Stack,
}

async fn two_control_planes(
    tag: &str,
    workers: usize,
    policy: &str,
    more_args: &[&str],
) -> Option<Pair> {
    if FrontDoor::current() == FrontDoor::Picker {
        eprintln!("skipped: the picker pass runs one control plane per gateway");
        return None;
    }
    let store = redis::Store::start(tag).await?;
    let mut cp_args = store.flags.clone();
    cp_args.extend(more_args.iter().map(|a| a.to_string()));
    let options = |workers: usize| StackOptions {
        workers,
        cp_args: cp_args.clone(),
        policy: policy.into(),
        ..Default::default()
    };
    let first = Stack::start(options(workers)).await.unwrap();
    let second = Stack::start(options(0)).await.unwrap();
    second.wait_fleet_of(&first).await;
    Some(Pair {
        store,
        first,
        second,
    })
}

/// The index of the one worker of `workers` whose served count rose from
/// `before` (`None`: none or several did).
async fn which_served(workers: &[SimWorker], before: &[u64]) -> Option<usize> {
    let mut rose = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        if w.served().await > before[i] {
            rose.push(i);
        }
    }
    (rose.len() == 1).then(|| rose[0])
}

/// Sends family `family`'s turn `turn` through `via`; the index of the
/// worker of `workers` that served it.
async fn route_one(via: &Stack, workers: &[SimWorker], family: usize, turn: usize) -> usize {
    let mut before = Vec::with_capacity(workers.len());
    for w in workers {
        before.push(w.served().await);
    }
    let r = via.post("/generate", &body(family, turn)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    which_served(workers, &before)
        .await
        .expect("exactly one worker serves each request")
}

/// The approximate trees are shared through the store: a prompt family
/// routed through one control plane goes to the same worker when its next
/// turn comes through another one, which never routed it itself. Each
/// Envoy reaches only its own control plane, so which one decides is
/// known.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prompt_routed_through_one_control_plane_is_known_to_the_others() {
    let Some(Pair {
        mut store,
        first,
        second,
    }) = two_control_planes("shared-tree", 4, "cache_aware", &[]).await
    else {
        return;
    };
    const SHARED: usize = 8;
    let mut homes = Vec::with_capacity(SHARED);
    for family in 0..SHARED {
        homes.push(route_one(&first, &first.workers, family, 0).await);
    }
    let mut used = homes.clone();
    used.sort_unstable();
    used.dedup();
    assert!(
        used.len() >= 3,
        "new families spread over the workers: {homes:?}"
    );
    let received = r#"sgl_router_shared_tree_inserts_total{direction="received"}"#;
    let started = Instant::now();
    while second.metric(received).await < SHARED as f64 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the second control plane learned {} of {SHARED} inserts in 2 s",
            second.metric(received).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "the other control plane learned {SHARED} inserts in {} ms",
        started.elapsed().as_millis()
    );
    for (family, home) in homes.iter().enumerate() {
        let now = route_one(&second, &first.workers, family, 1).await;
        assert_eq!(
            now, *home,
            "family {family}: routed to worker {home} through the first control plane, to {now} through the second"
        );
    }
    store.kill();
}

/// `/generate` requests `worker` received (arrivals, so a slow request
/// counts before it ends; health probes do not count).
async fn generates(worker: &SimWorker) -> usize {
    worker
        .requests()
        .await
        .iter()
        .filter(|r| r["path"] == "/generate")
        .count()
}

/// The index of the one worker of `workers` that received a `/generate`
/// since `before`.
async fn which_received(workers: &[SimWorker], before: &[usize]) -> Option<usize> {
    let mut rose = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        if generates(w).await > before[i] {
            rose.push(i);
        }
    }
    (rose.len() == 1).then(|| rose[0])
}

/// Requests in flight are shared through the store: a worker kept busy by
/// one control plane's requests is avoided by another, which sent it
/// nothing and (load reports off) has no other way to know.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_busy_with_one_control_planes_requests_is_avoided_by_the_others() {
    // Only the shared counts can tell the second control plane; the
    // policy that weighs every request in flight (cache_aware looks at
    // loads only past its imbalance thresholds).
    let Some(Pair {
        mut store,
        first,
        second,
    }) = two_control_planes(
        "shared-loads",
        2,
        "cost_aware",
        &["--disable-load-monitoring"],
    )
    .await
    else {
        return;
    };
    let busy = &first.workers[0];
    // Its answers take 0.2 s a token: 4 s for 20 tokens.
    busy.configure(json!({"decode_us_per_token": 200_000}))
        .await;
    let slow = |i: usize| {
        json!({
            // Distinct prefixes: spread by load, not kept together by cache.
            "text": format!("{i} slow request"),
            "sampling_params": {"max_new_tokens": 20},
        })
        .to_string()
    };
    let sent: Vec<_> = (0..4)
        .map(|i| {
            let (url, body) = (first.url("/generate"), slow(i));
            tokio::spawn(async move {
                reqwest::Client::new()
                    .post(url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            })
        })
        .collect();
    let started = Instant::now();
    loop {
        let loads = first.admin_loads().await;
        if loads.iter().any(|(url, l)| *url == busy.url && *l > 0) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the first control plane sent nothing to the slow worker: {loads:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The second control plane counts them once the shared counts reach
    // it (a sync every 50 ms), not after a fixed time. The first's
    // requests to the other worker end in milliseconds, but a count
    // synced before they ended still holds them: wait until the shared
    // counts show only the busy worker loaded, or "avoided" would weigh
    // stale loads (it failed so once in CI, through ext_proc).
    let shared = wait_until(Duration::from_secs(5), || async {
        let loads: Value = reqwest::get(second.admin_url("/get_loads"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or_default();
        let workers = loads["workers"].as_array().cloned().unwrap_or_default();
        !workers.is_empty()
            && workers.iter().all(|w| {
                let loaded = w["routing_load"].as_u64() > Some(0);
                loaded == (w["worker"] == busy.url.as_str())
            })
    })
    .await;
    assert!(
        shared,
        "the second control plane never counted the first's requests"
    );
    for i in 0..6 {
        let mut before = Vec::new();
        for w in &first.workers {
            before.push(generates(w).await);
        }
        // No two share a prefix: only load can set them apart.
        let body = json!({
            "text": format!("{i} is a quick question"),
            "sampling_params": {"max_new_tokens": 1},
        })
        .to_string();
        let r = second.post("/generate", &body).await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            which_received(&first.workers, &before).await,
            Some(1),
            "request {i} through the second control plane went to the worker the first keeps busy"
        );
    }
    for s in sent {
        assert_eq!(s.await.unwrap().ok(), Some(200));
    }
    store.kill();
}

/// An Envoy that starts while two of the three control planes its cluster
/// lists are down (a rollout, a node lost) gets its worker list from the
/// live one within a second or two. Envoy's own reconnect backoff grows to
/// 30 s, and some reconnects go to the dead ones: before envoy/'s configs
/// bounded it to 1 s, half of such starts took 4.5-19 s to serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_envoy_starting_while_two_control_planes_are_down_serves_at_once() {
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        let stack = Stack::start(StackOptions {
            workers: 1,
            // Nothing listens on these.
            more_control_planes: vec![free_port(), free_port()],
            envoy_concurrency: 2,
            ..Default::default()
        })
        .await
        .unwrap();
        slowest = slowest.max(started.elapsed());
        drop(stack);
    }
    assert!(
        slowest < Duration::from_secs(4),
        "the slowest of five Envoys took {slowest:?} to serve"
    );
}
