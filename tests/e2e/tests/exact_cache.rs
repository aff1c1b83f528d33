//! Routing on the exact cache state the workers publish, through Envoy:
//! simulated workers tokenize with a model's files (`--tokenizer-path`, a
//! byte-level BPE and a ChatML template written by the test) and publish
//! KV events; the control plane, given the same files, tokenizes each
//! request, hashes its pages as SGLang does and looks them up in the
//! index built from the events.
//!
//! The approximate tree knows only what this router sent. These tests
//! make it wrong on purpose: a prefix cached by traffic sent straight to a
//! worker, and a prefix the worker dropped. The router must follow the
//! events in both cases.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sglang_envoy_e2e::kv_events::{
    caught_up, direct, kv, sim_last_seq, subscribed_and_reset, CONFIG,
};
use sglang_envoy_e2e::{fresh_dir, wait_until, SimWorker, Stack, StackOptions};

/// A system prompt long enough to fill many 16-token pages.
fn system_prompt(tag: &str) -> String {
    (0..120)
        .map(|i| format!("{tag} rule {i} of the house. "))
        .collect()
}

fn chat_with(system: &str, question: &str) -> String {
    json!({"model": "m", "max_tokens": 1, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": question}
    ]})
    .to_string()
}

/// A directory with the fixture model's files. Kept: the workers and
/// control planes that read it outlive this function.
/// Numbered: tests run side by side, and [`fresh_dir`] empties a
/// directory of the same name.
fn model_dir(tag: &str) -> String {
    static DIRS: AtomicUsize = AtomicUsize::new(0);
    let n = DIRS.fetch_add(1, Ordering::Relaxed);
    let model = fresh_dir(&format!(
        "sglang-e2e-model-{}-{tag}-{n}",
        std::process::id()
    ))
    .expect("a model directory")
    .keep();
    sglang_envoy_prompt::fixture::write_model_files(&model).expect("model files written");
    model.display().to_string()
}

/// Flags of workers that publish KV events and tokenize with `model`.
fn worker_args(model: &str) -> Vec<String> {
    vec![
        "--kv-events-config".into(),
        CONFIG.into(),
        "--tokenizer-path".into(),
        model.into(),
        "--enable-cache-report".into(),
    ]
}

/// Sends a chat `body` straight to `worker`, behind the router's back.
async fn behind_the_back(worker: &SimWorker, body: String) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", worker.url))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map(|r| r.status().as_u16());
    assert_eq!(r.ok(), Some(200));
}

/// Tests run side by side in one process: a stack's model files must not
/// be removed and written again under it by another test that starts a
/// stack with the same policy (the control plane then saw no directory
/// and did not start).
#[test]
fn each_stack_has_its_own_model_directory() {
    let first = model_dir("twice");
    let second = model_dir("twice");
    assert_ne!(first, second);
    assert!(std::path::Path::new(&first)
        .join("tokenizer.json")
        .is_file());
    for dir in [first, second] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

async fn start(policy: &str) -> Stack {
    start_with(policy, &model_dir(policy), &[]).await
}

/// Three workers publishing KV events with `extra` flags, tokenizing with
/// `model` as the control plane does.
async fn start_with(policy: &str, model: &str, extra: &[String]) -> Stack {
    let mut worker_args = worker_args(model);
    worker_args.extend_from_slice(extra);
    Stack::start(StackOptions {
        workers: 3,
        policy: policy.into(),
        worker_args,
        cp_args: vec!["--tokenizer-path".into(), model.into()],
        ..Default::default()
    })
    .await
    .expect("stack starts")
}

/// Sends `body` through Envoy; the index of the worker that served it and
/// the cached tokens it reported.
async fn routed(stack: &Stack, body: &str) -> (usize, u64) {
    routed_among(stack, &stack.workers, body).await
}

/// [`routed`] for a stack whose workers are `workers` (another stack's).
async fn routed_among(stack: &Stack, workers: &[SimWorker], body: &str) -> (usize, u64) {
    let before = futures::future::join_all(workers.iter().map(|w| w.served())).await;
    let r = stack.post("/v1/chat/completions", body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap_or_default();
    let after = futures::future::join_all(workers.iter().map(|w| w.served())).await;
    let served = (0..after.len())
        .find(|&i| after[i] > before[i])
        .expect("a worker served it");
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (served, cached)
}

async fn follows_the_events(policy: &str) {
    let stack = start(policy).await;
    subscribed_and_reset(&stack).await;
    let system = system_prompt("alpha");
    // Worker 1 caches the system prompt from traffic this router never
    // saw: only its events tell.
    let (holder, evicted) = (1, 2);
    direct(&stack.workers[holder], "warm-up").await;
    behind_the_back(&stack.workers[holder], chat_with(&system, "first question")).await;
    assert!(caught_up(&stack, &stack.workers[holder]).await);
    for i in 0..5 {
        let (served, cached) = routed(&stack, &chat_with(&system, &format!("question {i}"))).await;
        assert_eq!(
            served,
            holder,
            "request {i} went elsewhere: {}",
            kv(&stack, &stack.workers[holder]).await
        );
        assert!(cached > 0, "request {i} found nothing cached");
    }

    // The holder drops everything (AllBlocksCleared) and another worker
    // caches the prompt behind the router's back. The tree still says the
    // holder; within a second the router must say the other.
    let flushed = reqwest::Client::new()
        .post(format!("{}/flush_cache", stack.workers[holder].url))
        .send()
        .await
        .map(|r| r.status().as_u16());
    assert_eq!(flushed.ok(), Some(200));
    behind_the_back(&stack.workers[evicted], chat_with(&system, "elsewhere")).await;
    let changed = Instant::now();
    // The router's view follows within a second: nothing left on the old
    // holder, the new holder's batch applied.
    let (old, new) = (&stack.workers[holder], &stack.workers[evicted]);
    let followed = wait_until(Duration::from_secs(1), || async {
        let last = sim_last_seq(new).await;
        kv(&stack, old).await["blocks"] == 0
            && last.is_some()
            && kv(&stack, new).await["ranks"][0]["last_seq"].as_i64() == last
    })
    .await;
    assert!(
        followed,
        "the router's view did not follow within 1 s ({:?}): {}",
        changed.elapsed(),
        kv(&stack, new).await
    );
    for j in 0..3 {
        let (served, cached) = routed(&stack, &chat_with(&system, &format!("later {j}"))).await;
        assert_eq!(served, evicted, "request {j} after the move");
        assert!(cached > 0);
    }
    let metrics = stack.metrics().await;
    assert!(
        metrics.contains("sgl_router_exact_cache_decisions_total{reason=\"events\"}"),
        "{metrics}"
    );
    let v = kv(&stack, &stack.workers[evicted]).await;
    assert_eq!(v["routing"], "events", "{v}");
}

/// The share of `stack`'s self-checks that agreed, and how many there were.
async fn agreement(stack: &Stack) -> (f64, u64) {
    let (mut checked, mut agreed) = (0, 0);
    for w in &stack.workers {
        let v = kv(stack, w).await;
        checked += v["checked"].as_u64().unwrap_or(0);
        agreed += v["agreed"].as_u64().unwrap_or(0);
    }
    (agreed as f64 / checked.max(1) as f64, checked)
}

#[tokio::test]
async fn predicted_cached_tokens_agree_with_what_the_workers_report() {
    let stack = start("cost_aware").await;
    subscribed_and_reset(&stack).await;
    let systems: Vec<String> = ["red", "green", "blue"]
        .iter()
        .map(|t| system_prompt(t))
        .collect();
    let mut sent = 0;
    for round in 0..12 {
        for (k, system) in systems.iter().enumerate() {
            // Chat, streamed every other round (usage in its last event).
            let mut body: Value =
                serde_json::from_str(&chat_with(system, &format!("q{round}"))).unwrap_or_default();
            if round % 2 == 1 {
                body["stream"] = json!(true);
                body["stream_options"] = json!({"include_usage": true});
            }
            let r = stack.post("/v1/chat/completions", &body.to_string()).await;
            assert_eq!(r.status(), 200);
            let _ = r.bytes().await;
            // Plain text, which the workers tokenize with the BOS.
            let text = format!("{system} completion {round}");
            let r = stack
                .post(
                    "/v1/completions",
                    &json!({"model": "m", "max_tokens": 1, "prompt": text}).to_string(),
                )
                .await;
            assert_eq!(r.status(), 200);
            let _ = r.bytes().await;
            let r = stack
                .post(
                    "/generate",
                    &json!({"text": format!("{system} generate {round} {k}"),
                            "sampling_params": {"max_new_tokens": 1}})
                    .to_string(),
                )
                .await;
            assert_eq!(r.status(), 200);
            let _ = r.bytes().await;
            sent += 3;
        }
    }
    let (share, checked) = agreement(&stack).await;
    assert!(
        checked as f64 >= 0.95 * sent as f64,
        "{checked} of {sent} checked"
    );
    assert!(share >= 0.99, "agreement {share} over {checked}");
    for w in &stack.workers {
        let v = kv(&stack, w).await;
        assert_eq!(v["routing"], "events", "{v}");
    }
}

/// A router whose chat template differs from the workers' predicts wrong
/// cached tokens: its self-check must notice and route on the tree.
#[tokio::test]
async fn a_template_that_differs_from_the_workers_is_caught_by_the_self_check() {
    let model = model_dir("wrong");
    // The router's template adds a line the workers' does not.
    let wrong = std::path::Path::new(&model).join("wrong.jinja");
    std::fs::write(
        &wrong,
        format!(
            "router-only preamble\n{}",
            sglang_envoy_prompt::fixture::CHAT_TEMPLATE
        ),
    )
    .expect("template written");
    let stack = Stack::start(StackOptions {
        workers: 2,
        policy: "cost_aware".into(),
        worker_args: worker_args(&model),
        cp_args: vec![
            "--tokenizer-path".into(),
            model,
            "--chat-template".into(),
            wrong.display().to_string(),
        ],
        ..Default::default()
    })
    .await
    .expect("stack starts");
    subscribed_and_reset(&stack).await;
    let system = system_prompt("mismatch");
    for i in 0..60 {
        let r = stack
            .post(
                "/v1/chat/completions",
                &chat_with(&system, &format!("q{i}")),
            )
            .await;
        assert_eq!(r.status(), 200);
        let _ = r.bytes().await;
    }
    let (share, checked) = agreement(&stack).await;
    assert!(checked >= 55, "{checked}");
    assert!(share < 0.9, "the wrong template agreed {share}");
    let routing: Vec<Value> =
        futures::future::join_all(stack.workers.iter().map(|w| kv(&stack, w)))
            .await
            .into_iter()
            .map(|v| v["routing"].clone())
            .collect();
    assert!(routing.contains(&json!("tree")), "{routing:?}");
    assert!(
        stack.control_plane_log().contains("KV-event self-check"),
        "logged loudly"
    );
}

#[tokio::test]
async fn cost_aware_follows_the_workers_kv_events() {
    follows_the_events("cost_aware").await;
}

#[tokio::test]
async fn cache_aware_follows_the_workers_kv_events() {
    follows_the_events("cache_aware").await;
}

/// Two routers (each its own Envoy and control plane) in front of the same
/// workers, fed by the same events: for prompts whose prefixes were cached
/// behind both routers' backs, both choose the worker that holds them.
#[tokio::test]
async fn two_control_planes_fed_by_the_same_events_choose_alike() {
    let a = start("cost_aware").await;
    let urls: Vec<String> = a.workers.iter().map(|w| w.url.clone()).collect();
    let mut cp_args = vec!["--worker-urls".to_string()];
    cp_args.extend(urls);
    cp_args.extend(["--tokenizer-path".into(), model_dir("second")]);
    let b = Stack::start(StackOptions {
        workers: 0,
        policy: "cost_aware".into(),
        cp_args,
        ..Default::default()
    })
    .await
    .expect("second stack starts");
    subscribed_and_reset(&a).await;
    for w in &a.workers {
        let subscribed = wait_until(Duration::from_secs(15), || async {
            kv(&b, w).await["ranks"][0]["subscribed"] == true
        })
        .await;
        assert!(subscribed, "{}", kv(&b, w).await);
    }
    // Each worker gets a system prompt of its own, straight from a client.
    let systems: Vec<String> = (0..3)
        .map(|i| system_prompt(&format!("shared{i}")))
        .collect();
    for (w, system) in a.workers.iter().zip(&systems) {
        behind_the_back(w, chat_with(system, "warm")).await;
    }
    for w in &a.workers {
        assert!(caught_up(&a, w).await);
        let last = kv(&a, w).await["ranks"][0]["last_seq"].clone();
        let same = wait_until(Duration::from_secs(10), || async {
            kv(&b, w).await["ranks"][0]["last_seq"] == last
        })
        .await;
        assert!(same, "the second control plane applied what the first did");
    }
    for k in 0..6 {
        let system = &systems[k % 3];
        let (via_a, _) = routed(&a, &chat_with(system, &format!("a{k}"))).await;
        let (via_b, _) = routed_among(&b, &a.workers, &chat_with(system, &format!("b{k}"))).await;
        assert_eq!((via_a, via_b), (k % 3, k % 3), "prompt {k}");
    }
}

/// A worker that restarts comes back with an empty cache and publishes
/// nothing until it stores something: what the router's index said it held
/// must not keep drawing requests to it. The test kills the worker the
/// router prefers for a prompt, lets the health checks see it down (a
/// restarted SGLang takes minutes to load its model), starts it again, and
/// caches the prompt on another worker behind the router's back: the router
/// must choose that one.
#[tokio::test]
async fn a_restarted_worker_is_not_preferred_for_what_it_held() {
    let mut stack = start("cost_aware").await;
    subscribed_and_reset(&stack).await;
    let system = system_prompt("restart");
    let (holder, other) = (1, 2);
    direct(&stack.workers[holder], "warm-up").await;
    behind_the_back(&stack.workers[holder], chat_with(&system, "first")).await;
    assert!(caught_up(&stack, &stack.workers[holder]).await);
    for i in 0..3 {
        let (served, _) = routed(&stack, &chat_with(&system, &format!("before {i}"))).await;
        assert_eq!(served, holder, "request {i} before the restart");
    }

    stack.workers[holder].kill();
    let url = stack.workers[holder].url.clone();
    assert!(
        stack
            .wait_marked(&url, false, Duration::from_secs(15))
            .await,
        "the killed worker was never marked unhealthy"
    );
    stack.workers[holder].restart().expect("worker restarts");
    assert!(
        stack.wait_marked(&url, true, Duration::from_secs(15)).await,
        "the restarted worker never came back"
    );
    // The new process holds nothing, and the router knows it at once.
    let forgotten = wait_until(Duration::from_secs(1), || async {
        kv(&stack, &stack.workers[holder]).await["blocks"] == 0
    })
    .await;
    assert!(
        forgotten,
        "the router still thinks the restarted worker holds blocks: {}",
        kv(&stack, &stack.workers[holder]).await
    );
    behind_the_back(&stack.workers[other], chat_with(&system, "elsewhere")).await;
    assert!(caught_up(&stack, &stack.workers[other]).await);
    for j in 0..3 {
        let (served, cached) = routed(&stack, &chat_with(&system, &format!("after {j}"))).await;
        assert_eq!(
            served,
            other,
            "request {j} after the restart: {}",
            kv(&stack, &stack.workers[holder]).await
        );
        assert!(cached > 0, "request {j} found nothing cached");
    }
    // The restarted worker's events are live again: what it stores now is
    // known (its SUB socket reconnected to the new process).
    behind_the_back(
        &stack.workers[holder],
        chat_with(&system_prompt("new"), "q"),
    )
    .await;
    assert!(
        caught_up(&stack, &stack.workers[holder]).await,
        "no event from the restarted worker: {}",
        kv(&stack, &stack.workers[holder]).await
    );
}

/// A worker whose small cache evicts a prompt's pages publishes
/// `BlockRemoved`: within a second the router prefers the worker that
/// still holds the whole prompt, though its tree (which saw the evicted
/// worker serve that prompt) says otherwise.
#[tokio::test]
async fn pages_a_worker_evicts_stop_drawing_requests_within_a_second() {
    let model = model_dir("evict");
    let system = system_prompt("evict");
    let other_system = system_prompt("other");
    // Each worker's cache holds one and a half system prompts: caching a
    // second one evicts the tail of the first.
    let tokens = sglang_envoy_prompt::PromptTokenizer::from_dir(std::path::Path::new(&model))
        .expect("the fixture model loads")
        .tokens("/v1/chat/completions", chat_with(&system, "q").as_bytes())
        .expect("the prompt tokenizes")
        .ids
        .len();
    let cache = (tokens * 3 / 2).to_string();
    let stack = start_with("cost_aware", &model, &["--cache-tokens".into(), cache]).await;
    subscribed_and_reset(&stack).await;
    let (holder, other) = (1, 2);
    behind_the_back(&stack.workers[holder], chat_with(&system, "first")).await;
    assert!(caught_up(&stack, &stack.workers[holder]).await);
    for i in 0..3 {
        let (served, cached) = routed(&stack, &chat_with(&system, &format!("before {i}"))).await;
        assert_eq!(served, holder, "request {i} before the eviction");
        assert!(cached > 0);
    }
    // The other worker caches the whole prompt; then the holder caches
    // another one, which evicts the first one's tail.
    behind_the_back(&stack.workers[other], chat_with(&system, "elsewhere")).await;
    let before = kv(&stack, &stack.workers[holder]).await["blocks"].as_u64();
    behind_the_back(&stack.workers[holder], chat_with(&other_system, "evict")).await;
    let evicted = Instant::now();
    let followed = wait_until(Duration::from_secs(1), || async {
        let mut all = true;
        for w in [holder, other] {
            let last = sim_last_seq(&stack.workers[w]).await;
            all &= last.is_some()
                && kv(&stack, &stack.workers[w]).await["ranks"][0]["last_seq"].as_i64() == last;
        }
        all
    })
    .await;
    assert!(
        followed,
        "the router's view did not follow within 1 s ({:?})",
        evicted.elapsed()
    );
    let sim = sglang_envoy_e2e::kv_events::sim_kv(&stack.workers[holder], None).await;
    let v = kv(&stack, &stack.workers[holder]).await;
    assert!(
        v["blocks"].as_u64() < before.map(|b| b + tokens as u64 / 16),
        "the holder's evicted pages are still counted: {v} (sim: {sim})"
    );
    for j in 0..3 {
        let (served, cached) = routed(&stack, &chat_with(&system, &format!("after {j}"))).await;
        assert_eq!(served, other, "request {j} after the eviction: {v}");
        assert!(
            cached as usize >= tokens / 2,
            "request {j}: {cached} cached of {tokens}"
        );
    }
}
