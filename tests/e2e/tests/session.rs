//! The filter's session stream (one per Envoy worker thread) through a real
//! Envoy: many answers in flight on it each reach the request that asked,
//! ends are counted by the time the client has its answer, a frozen or
//! killed control plane sends waiting requests to the fallback at once
//! and the stream comes back, and the requests of an Envoy that died are
//! released at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use sglang_envoy_e2e::{wait_until, FrontDoor, Stack, StackOptions};

/// Requests in the big run, and how many different routing keys they use.
const REQUESTS: usize = 10_000;
const KEYS: usize = 1_000;

/// For each routing key the workers received: the workers that got it.
async fn homes_of_keys(stack: &Stack) -> (BTreeMap<String, BTreeSet<usize>>, usize) {
    let mut homes: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    let mut served = 0;
    for (i, w) in stack.workers.iter().enumerate() {
        for r in w.requests().await {
            if r["path"] != "/v1/completions" {
                continue;
            }
            served += 1;
            let key = r["headers"]["x-smg-routing-key"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            homes.entry(key).or_default().insert(i);
        }
    }
    (homes, served)
}

/// Whether the filter's session is up within `within` (one VM: one
/// session).
async fn session_up(stack: &Stack, within: Duration) -> bool {
    wait_until(within, || async {
        stack.metric("sgl_router_filter_sessions").await == 1.0
    })
    .await
}

/// A stack of `options` whose filter has its session and its worker list
/// (polled every second), so that a fallback knows the workers.
async fn stack_with_session_and_workers(options: StackOptions) -> Stack {
    let stack = Stack::start(options).await.unwrap();
    assert!(session_up(&stack, Duration::from_secs(5)).await);
    assert!(
        stack
            .wait_worker_list_fetched(Duration::from_secs(10))
            .await,
        "the filter never fetched the worker list"
    );
    stack
}

/// The filter's deadline for an answer on the session (`route_timeout_ms`).
const ROUTE_TIMEOUT: Duration = Duration::from_millis(500);

/// Questions the filter sent to the fallback because the session broke
/// under them (its warning in Envoy's log).
fn stranded_questions(stack: &Stack) -> usize {
    stack
        .envoy_log()
        .lines()
        .filter_map(|l| {
            l.trim_end()
                .split("); ")
                .nth(1)?
                .strip_suffix(" questions fall back")
        })
        .filter_map(|n| n.trim().parse::<usize>().ok())
        .sum()
}

/// The questions the control plane took on session streams.
async fn session_questions(stack: &Stack) -> f64 {
    stack
        .metric("sgl_router_filter_session_messages_total{kind=\"route\"}")
        .await
}

/// With the control plane frozen (SIGSTOP), sends `body` to `path` and,
/// once its question is on the session stream, kills the control plane.
/// Returns the request's status and how long it took from being sent.
///
/// A filter that found the control plane frozen has stopped asking it
/// (`filter/src/reach.rs`): it is first thawed until it takes a question
/// on a session again, then frozen again, so that the next question goes out and waits.
///
/// The question is on the stream when Envoy has sent more bytes to the
/// control plane since the request began. Nothing else sends any then: the
/// answers to the requests before were reported before their clients
/// had them, and the wait for a worker-list fetch stuck on the frozen
/// control plane (the filter starts no other for 5 s) comes first.
async fn kill_while_a_question_waits(
    stack: &mut Stack,
    path: &str,
    body: serde_json::Value,
) -> (u16, Duration) {
    assert!(stack.signal_control_plane("CONT"));
    // Asked on a session again, not only with calls: the frozen one's
    // stream was given up, and the next opens after its backoff.
    let asked_before = session_questions(stack).await;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            burst(stack, 1, "thawed").await;
            session_questions(stack).await > asked_before
        })
        .await,
        "the thawed control plane was not asked on a session again"
    );
    assert!(stack.signal_control_plane("STOP"));
    let active = "cluster.sglang_control_plane.upstream_rq_active";
    let tx = "cluster.sglang_control_plane.upstream_cx_tx_bytes_total";
    assert!(
        wait_until(Duration::from_secs(5), || async {
            stack.envoy_stat(active).await.unwrap_or(0) >= 2
        })
        .await,
        "no worker-list fetch waits on the frozen control plane (active calls: {:?})",
        stack.envoy_stat(active).await
    );
    let sent_before = stack.envoy_stat(tx).await.unwrap_or(0);
    let stranded_before = stranded_questions(stack);
    let url = stack.url(path);
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let r = reqwest::Client::new()
            .post(url)
            .json(&body)
            .timeout(Duration::from_secs(20))
            .send()
            .await;
        (r.map_or(0, |r| r.status().as_u16()), started.elapsed())
    });
    // Polled often: the question has less than its deadline left.
    let deadline = Instant::now() + Duration::from_secs(5);
    while stack.envoy_stat(tx).await.unwrap_or(0) <= sent_before {
        assert!(Instant::now() < deadline, "the question never went out");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stack.kill_control_plane();
    let (status, took) = waiting.await.unwrap();
    assert!(
        wait_until(Duration::from_secs(2), || async {
            stranded_questions(stack) > stranded_before
        })
        .await,
        "no question fell back when the session broke:\n{}",
        stack.envoy_log()
    );
    (status, took)
}

#[tokio::test]
async fn ten_thousand_answers_each_reach_the_request_that_asked() {
    // `manual`: a routing key's first request picks a worker and the key
    // stays there. An answer handed to the wrong request would send that
    // request's key to another key's worker, splitting it (7 times in 8).
    let stack_started = Instant::now();
    let stack = Stack::start(StackOptions {
        workers: 8,
        policy: "manual".into(),
        envoy_concurrency: 4,
        worker_args: vec![
            "--prefill-us-per-token".into(),
            "1".into(),
            "--decode-us-per-token".into(),
            "1000".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let started = Instant::now();
    // Keys interleaved, answers of 1-12 tokens: completions in random order.
    let results: Vec<u16> = futures::stream::iter(0..REQUESTS)
        .map(|i| {
            let client = client.clone();
            let url = stack.url("/v1/completions");
            async move {
                let tokens = 1 + (i * 7919) % 12;
                let body =
                    json!({"model": "m", "prompt": format!("request {i}"), "max_tokens": tokens});
                let r = client
                    .post(url)
                    .header("x-smg-routing-key", format!("key-{}", i % KEYS))
                    .json(&body)
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await;
                r.map_or(0, |r| r.status().as_u16())
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let elapsed = started.elapsed();
    // Through the wasm filter, read at once, with no wait: every end was
    // counted before its client had the answer. ext_proc learns of an end
    // when Envoy closes its stream, after the client has the answer
    // (loads_read_zero_right_after_each_answer says more): a short wait.
    if FrontDoor::current() == FrontDoor::Wasm {
        let loads = stack.loads().await;
        assert!(
            !loads.is_empty() && loads.iter().all(|(_, l)| *l == 0),
            "{loads:?}"
        );
    } else {
        assert!(
            stack.wait_loads_zero(Duration::from_secs(5)).await,
            "{:?}",
            stack.loads().await
        );
    }

    let failed = results.iter().filter(|s| **s != 200).count();
    assert_eq!(failed, 0, "{failed} of {REQUESTS} requests failed");
    let (homes, served) = homes_of_keys(&stack).await;
    assert_eq!(served, REQUESTS, "every request reaches a worker once");
    assert_eq!(homes.len(), KEYS);
    let split: Vec<_> = homes.iter().filter(|(_, w)| w.len() > 1).collect();
    assert!(split.is_empty(), "keys split over workers: {split:?}");
    eprintln!("{REQUESTS} requests in {elapsed:?}");

    if FrontDoor::current() == FrontDoor::Wasm {
        // One session per Envoy worker thread, and the questions went on
        // them: the control plane's cluster saw a handful of calls (the
        // sessions and the worker-list polls, one a second per thread, so
        // more on a slower machine), not one per request.
        assert_eq!(stack.metric("sgl_router_filter_sessions").await, 4.0);
        // Answers to questions read together went down together (the
        // filter asked for batches), and each still reached its request
        // (the keys above).
        let answers = stack
            .metric("sgl_router_filter_session_answers_total")
            .await;
        let messages = stack
            .metric("sgl_router_filter_session_answer_messages_total")
            .await;
        assert!(
            answers >= REQUESTS as f64 && messages < answers,
            "{answers} answers in {messages} messages"
        );
        let calls = stack
            .envoy_stat("cluster.sglang_control_plane.upstream_rq_total")
            .await
            .unwrap_or(u64::MAX);
        let polls = 4 * (stack_started.elapsed().as_secs() + 2);
        assert!(
            calls < polls + 50,
            "{calls} calls to the control plane ({polls} worker-list polls at most)"
        );
    }
}

#[tokio::test]
async fn loads_read_zero_right_after_each_answer() {
    if FrontDoor::current() != FrontDoor::Wasm {
        // ext_proc learns of the end when Envoy closes its stream, after
        // the client has the answer (it does not watch JSON answers' bodies).
        eprintln!("the wasm filter reports the end before the answer's last byte; ext_proc after");
        return;
    }
    let stack = Stack::with_workers(2).await;
    assert!(session_up(&stack, Duration::from_secs(5)).await);
    loads_zero_after_each_answer(&stack, 100, "one by one").await;
}

#[tokio::test]
async fn loads_read_zero_after_answers_sent_before_the_session_is_up() {
    if FrontDoor::current() != FrontDoor::Wasm {
        eprintln!("the wasm filter's session only");
        return;
    }
    // A VM opens its session on the tick after its first request: with a
    // tick a minute away, every request here comes before it, as a fresh
    // Envoy's first requests do (the quick start's test caught a client
    // that read its request in /get_loads).
    let stack = Stack::start(StackOptions {
        workers: 2,
        filter_options: r#", "report_interval_ms": 60000"#.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    loads_zero_after_each_answer(&stack, 20, "before the session").await;
    assert_eq!(stack.metric("sgl_router_filter_sessions").await, 0.0);
}

/// Sends `n` completions one by one; after each answer the loads read zero.
async fn loads_zero_after_each_answer(stack: &Stack, n: usize, tag: &str) {
    // One client, kept alive: the loads are read within a millisecond or
    // so of the answer.
    let client = reqwest::Client::new();
    for i in 0..n {
        let body = json!({"model": "m", "prompt": format!("{tag} {i}"), "max_tokens": 3});
        let r = client
            .post(stack.url("/v1/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        let loads = read_json(&client, &stack.url("/get_loads")).await;
        let busy: Vec<_> = loads["workers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["load"] != 0)
            .collect();
        assert!(busy.is_empty(), "after request {i}: {loads}");
        // The worker list shows the same count.
        let listed = read_json(&client, &stack.url("/workers")).await;
        assert_eq!(listed["in_flight"], 0, "after request {i}: {listed}");
    }
}

/// GETs `url` with `client` (kept alive, so the read follows the answer
/// at once) and reads its JSON.
async fn read_json(client: &reqwest::Client, url: &str) -> serde_json::Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

/// Sends `n` completions at once; their statuses and how long each took.
async fn burst(stack: &Stack, n: usize, tag: &str) -> Vec<(u16, Duration)> {
    let stack = Arc::new(stack.url("/v1/completions"));
    let sends = (0..n).map(|i| {
        let url = stack.clone();
        let tag = tag.to_string();
        tokio::spawn(async move {
            let started = Instant::now();
            let body = json!({"model": "m", "prompt": format!("{tag} {i}"), "max_tokens": 2});
            let status = reqwest::Client::new()
                .post(url.as_str())
                .json(&body)
                .timeout(Duration::from_secs(20))
                .send()
                .await
                .map_or(0, |r| r.status().as_u16());
            (status, started.elapsed())
        })
    });
    futures::future::join_all(sends)
        .await
        .into_iter()
        .map(|r| r.unwrap_or((0, Duration::MAX)))
        .collect()
}

#[tokio::test]
async fn questions_waiting_on_a_frozen_or_killed_control_plane_fall_back_and_the_stream_returns() {
    if FrontDoor::current() != FrontDoor::Wasm {
        eprintln!("the session stream is the wasm filter's; ext_proc has the outage suite");
        return;
    }
    let mut stack = stack_with_session_and_workers(StackOptions {
        policy: "round_robin".into(),
        ..Default::default()
    })
    .await;

    // Frozen: the questions wait on the stream until their deadline
    // (route_timeout_ms, 500 ms), then fall back.
    assert!(stack.signal_control_plane("STOP"));
    let frozen = burst(&stack, 8, "frozen").await;
    for (status, took) in &frozen {
        assert_eq!(*status, 200, "{frozen:?}");
        assert!(
            *took >= Duration::from_millis(400),
            "answered while frozen: {frozen:?}"
        );
        assert!(
            *took < Duration::from_secs(3),
            "waited too long: {frozen:?}"
        );
    }
    // Still frozen: the filter no longer waits for it. One request in a
    // while is its probe and waits the deadline; the others go to the
    // fallback at once (each used to wait 500 ms).
    let mut waited = Vec::new();
    for i in 0..12 {
        let (status, took) = burst(&stack, 1, &format!("still frozen {i}")).await[0];
        assert_eq!(status, 200);
        waited.push(took);
    }
    eprintln!("while frozen: {waited:?}");
    let slow = waited
        .iter()
        .filter(|t| **t >= Duration::from_millis(400))
        .count();
    assert!(
        slow <= 3,
        "{slow} of 12 requests waited for the frozen control plane: {waited:?}"
    );
    // A probe waits one deadline: a call that ran into its timeout (which
    // Envoy reports as UNAVAILABLE, as a draining replica's refusal) is
    // not asked again.
    assert!(
        waited.iter().all(|t| *t < 2 * ROUTE_TIMEOUT),
        "a request waited more than one deadline: {waited:?}"
    );

    // Killed while a question waits: it falls back when the stream breaks,
    // before its deadline, which is at least 500 ms after the request was
    // sent (the filter asks once the request is in).
    let (status, took) = kill_while_a_question_waits(
        &mut stack,
        "/v1/completions",
        json!({"model": "m", "prompt": "waiting", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        took < ROUTE_TIMEOUT,
        "took {took:?}: not before the deadline"
    );

    // Back: the session reopens and decisions are the control plane's again.
    stack.restart_control_plane().await.unwrap();
    assert!(
        session_up(&stack, Duration::from_secs(10)).await,
        "the session did not come back"
    );
    let routed_before = stack.metric("sgl_router_requests_total").await;
    let after = burst(&stack, 8, "after").await;
    assert!(after.iter().all(|(s, _)| *s == 200), "{after:?}");
    let routed = stack.metric("sgl_router_requests_total").await - routed_before;
    assert_eq!(
        routed, 8.0,
        "requests routed by the control plane after it returned"
    );
    assert!(stack.wait_loads_zero(Duration::from_secs(2)).await);
}

#[tokio::test]
async fn an_envoy_killed_under_load_has_its_requests_released_at_once() {
    let mut stack = Stack::start(StackOptions {
        worker_args: vec!["--decode-us-per-token".into(), "20000".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    // 16 requests of ~4 s each are in flight when Envoy dies.
    let url = stack.url("/v1/completions");
    let _clients: Vec<_> = (0..16)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let body = json!({"model": "m", "prompt": format!("long {i}"), "max_tokens": 200});
                reqwest::Client::new().post(url).json(&body).send().await
            })
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(5), || async {
            counted(&stack).await == 16
        })
        .await,
        "loads before the crash: {:?}",
        stack.admin_loads().await
    );
    stack.kill_envoy();
    let killed = Instant::now();
    assert!(
        wait_until(Duration::from_secs(2), || async {
            counted(&stack).await == 0
        })
        .await,
        "loads 2 s after Envoy died: {:?} (the requests would end in ~4 s)",
        stack.admin_loads().await
    );
    eprintln!("released {:?} after the crash", killed.elapsed());
}

/// Requests the control plane counts, read from its own admin port.
async fn counted(stack: &Stack) -> u64 {
    stack.admin_loads().await.iter().map(|(_, l)| *l).sum()
}

#[tokio::test]
async fn pd_requests_ask_and_wait_for_their_prefill_on_the_session() {
    if FrontDoor::current() != FrontDoor::Wasm {
        eprintln!("the session stream is the wasm filter's");
        return;
    }
    let stack = Stack::start(StackOptions {
        pd: Some(sglang_envoy_e2e::PdOptions::default()),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(session_up(&stack, Duration::from_secs(5)).await);
    // The worker list (polled every second) says PD: bodies go with the
    // first question, so no NeedBody round trip either.
    assert!(
        stack
            .wait_worker_list_fetched(Duration::from_secs(10))
            .await,
        "the filter never fetched the worker list"
    );
    let calls = || async {
        stack
            .envoy_stat("cluster.sglang_control_plane.upstream_rq_total")
            .await
            .unwrap_or(0)
    };
    let before = calls().await;
    let started = Instant::now();
    for i in 0..40 {
        let body = format!(
            r#"{{"model":"m","max_tokens":2,"messages":[{{"role":"user","content":"pd {i}"}}]}}"#
        );
        let r = stack.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
    let made = calls().await - before;
    // Only the worker-list polls of the time it took (one a second, each
    // second begun counting, and two for the edges of the window); one
    // call per request would be 40.
    let polls = started.elapsed().as_secs_f64().ceil() as u64 + 2;
    assert!(
        made <= polls,
        "{made} calls for 40 PD requests in {:?}",
        started.elapsed()
    );
    // Every prefill half was answered for: the decodes all got their KV.
    assert_eq!(stack.decodes[0].stats().await["kv_fetched"], 40);
}

/// One PD chat request (`stream` or not) with a 20 s client timeout: its
/// status (0: none) and how long it took.
async fn pd_request(stack: &Stack, tag: &str, stream: bool) -> (u16, Duration, String) {
    let started = Instant::now();
    let r = reqwest::Client::new()
        .post(stack.url("/v1/chat/completions"))
        .json(&json!({
            "model": "m",
            "max_tokens": 2,
            "stream": stream,
            "messages": [{"role": "user", "content": tag}],
        }))
        .timeout(Duration::from_secs(20))
        .send()
        .await;
    let (status, text) = match r {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
        Err(e) => (0, e.to_string()),
    };
    (status, started.elapsed(), text)
}

#[tokio::test]
async fn pd_questions_that_fall_back_from_the_stream_get_their_local_prefills_outcome() {
    if FrontDoor::current() != FrontDoor::Wasm {
        eprintln!("the session stream is the wasm filter's");
        return;
    }
    let mut stack = stack_with_session_and_workers(StackOptions {
        pd: Some(sglang_envoy_e2e::PdOptions::default()),
        ..Default::default()
    })
    .await;

    // Frozen: each question waits on the stream until its deadline, which
    // the root context's tick finds; the fallback then runs as the root,
    // and so does the prefill half the filter sends itself. Its outcome
    // must still reach the request, whose decode answer's head waits for
    // it (once, that outcome went to the root and was dropped: the client
    // waited for ever).
    assert!(stack.signal_control_plane("STOP"));
    for (i, stream) in [false, true].into_iter().enumerate() {
        let (status, took, text) = pd_request(&stack, &format!("frozen {i}"), stream).await;
        assert_eq!(status, 200, "took {took:?}: {text}");
        assert!(!text.contains("\"error\""), "{text}");
        assert!(took < Duration::from_secs(3), "took {took:?}");
    }

    // Killed while a question waits: the broken stream sends it to the
    // fallback before its deadline (at least 500 ms after the request was
    // sent), again as the root.
    let (status, took) = kill_while_a_question_waits(
        &mut stack,
        "/v1/chat/completions",
        json!({
            "model": "m",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "waiting"}],
        }),
    )
    .await;
    assert_eq!(status, 200, "took {took:?}");
    assert!(
        took < ROUTE_TIMEOUT,
        "took {took:?}: not before the deadline"
    );
    // The prefill halves came from the filter (its request ids end so).
    let local = stack.prefills[0]
        .requests()
        .await
        .iter()
        .filter(|r| r["body"].as_str().is_some_and(|b| b.contains("-envoy\"")))
        .count();
    assert_eq!(local, 3, "prefill halves sent by the filter");
}
