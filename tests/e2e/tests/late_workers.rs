//! Workers that start after the router, and workers that come back after an
//! outage, serve within 5 s of their `/health` answering, with the default
//! health-check interval of 60 s: a worker that is not healthy is probed on
//! a fast schedule, not once a minute.

use std::time::{Duration, Instant};

use sglang_envoy_e2e::{
    expect_openai_error, free_port, wait_until, SimWorker, Stack, StackOptions,
};

const GEN: &str = r#"{"text":"hello","sampling_params":{"max_new_tokens":1}}"#;
/// How soon after its `/health` answers a worker must get requests.
const WITHIN: Duration = Duration::from_secs(5);

/// sglang-router's default interval: only the fast schedule can meet WITHIN.
fn default_interval() -> Vec<String> {
    vec!["--health-check-interval-secs".into(), "60".into()]
}

/// Sends requests (every ~50 ms) until every worker in `watch` has served
/// one or `timeout` passes; returns, per worker, how long after its
/// `/health` first answered it served its first request (`None`: never).
async fn serve_delays(
    stack: &Stack,
    watch: &[&SimWorker],
    timeout: Duration,
) -> Vec<Option<Duration>> {
    let start = Instant::now();
    let mut up: Vec<Option<Instant>> = vec![None; watch.len()];
    let mut served: Vec<Option<Instant>> = vec![None; watch.len()];
    while start.elapsed() < timeout && served.iter().any(Option::is_none) {
        for (i, w) in watch.iter().enumerate() {
            if up[i].is_none() && w.is_up().await {
                up[i] = Some(Instant::now());
            }
        }
        let _ = stack.post("/generate", GEN).await;
        for (i, w) in watch.iter().enumerate() {
            if served[i].is_none() && up[i].is_some() && w.served().await > 0 {
                served[i] = Some(Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    up.iter()
        .zip(&served)
        .map(|(u, s)| Some(s.as_ref()?.duration_since(*u.as_ref()?)))
        .collect()
}

#[tokio::test]
async fn workers_started_after_the_router_serve_within_5s_of_answering() {
    let ports = [free_port(), free_port()];
    let mut cp_args = default_interval();
    cp_args.push("--worker-urls".into());
    cp_args.extend(ports.iter().map(|p| format!("http://127.0.0.1:{p}")));
    let stack = Stack::start(StackOptions {
        workers: 0,
        policy: "round_robin".into(),
        cp_args,
        ..Default::default()
    })
    .await
    .unwrap();
    // The router is up (it did not wait for its workers) and says so.
    let listed = stack.get_json("/workers").await;
    assert_eq!(listed["total"], 2, "both workers are registered: {listed}");
    expect_openai_error(stack.post("/generate", GEN).await, 503).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let late: Vec<SimWorker> = ports
        .iter()
        .map(|&p| SimWorker::spawn(&stack.dir, p, &[]).unwrap())
        .collect();
    let watch: Vec<&SimWorker> = late.iter().collect();
    let delays = serve_delays(&stack, &watch, Duration::from_secs(30)).await;
    for (w, d) in late.iter().zip(&delays) {
        let d = d.unwrap_or_else(|| panic!("{} never served", w.url));
        eprintln!("{} served {d:?} after its /health answered", w.url);
        assert!(d < WITHIN, "{} served {d:?} after answering", w.url);
    }
}

#[tokio::test]
async fn a_worker_back_from_an_outage_serves_within_5s_of_answering() {
    let mut stack = Stack::start(StackOptions {
        workers: 2,
        policy: "round_robin".into(),
        cp_args: default_interval(),
        ..Default::default()
    })
    .await
    .unwrap();
    let down_url = stack.workers[1].url.clone();
    stack.workers[1].kill();
    let stopped = Instant::now();

    // Traffic meanwhile: Envoy fails requests over to the live worker and
    // the control plane takes the dead one out.
    let (s, down_url) = (&stack, down_url.as_str());
    let noticed = wait_until(Duration::from_secs(5), || async move {
        assert_eq!(s.post("/generate", GEN).await.status(), 200);
        s.get_json("/workers").await["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|w| w["url"] == down_url && w["is_healthy"] == false)
    })
    .await;
    assert!(noticed, "the stopped worker is still marked healthy");
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(stopped.elapsed())).await;

    stack.workers[1].restart().unwrap();
    let delays = serve_delays(&stack, &[&stack.workers[1]], Duration::from_secs(30)).await;
    let d = delays[0].expect("the restarted worker never served");
    eprintln!("served {d:?} after its /health answered again");
    assert!(d < WITHIN, "served {d:?} after answering again");
}
