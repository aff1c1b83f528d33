//! Model-aware routing through Envoy: with two models served, each
//! request reaches only the workers serving its model, an unknown model is
//! smg's 404 `model_not_found`, and a one-model fleet still takes any name
//! (sglang-router's behaviour).

use std::time::Duration;

use serde_json::{json, Value};
use sglang_envoy_e2e::{free_port, wait_until, PdOptions, SimWorker, Stack, StackOptions};

fn model_args(model: &str) -> Vec<String> {
    let mut args = StackOptions::default().worker_args;
    args.extend(["--model-path".to_string(), model.to_string()]);
    args
}

async fn chat(stack: &Stack, model: &str) -> reqwest::Response {
    stack
        .post(
            "/v1/chat/completions",
            &json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                .to_string(),
        )
        .await
}

/// Two workers serving `alpha` (the stack's), two serving `beta` (added
/// through the admin API), all healthy and reachable through Envoy.
async fn two_models() -> (Stack, Vec<SimWorker>) {
    let stack = Stack::start(StackOptions {
        workers: 2,
        policy: "round_robin".into(),
        worker_args: model_args("alpha"),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let mut betas = Vec::new();
    for _ in 0..2 {
        let w = SimWorker::start(&stack.dir, &model_args("beta"))
            .await
            .unwrap();
        let r = client
            .post(stack.admin_url(&format!("/add_worker?url={}", w.url)))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        betas.push(w);
    }
    let ready = wait_until(Duration::from_secs(20), || async {
        let list = stack.get_json("/workers").await;
        let healthy = list["workers"]
            .as_array()
            .map(|ws| ws.iter().filter(|w| w["is_healthy"] == true).count())
            .unwrap_or(0);
        healthy == 4 && chat(&stack, "beta").await.status() == 200
    })
    .await;
    assert!(ready, "the beta workers never took requests");
    (stack, betas)
}

/// Inference requests each worker received.
async fn served(workers: &[SimWorker]) -> Vec<u64> {
    served_refs(&workers.iter().collect::<Vec<_>>()).await
}

async fn served_refs(workers: &[&SimWorker]) -> Vec<u64> {
    let mut n = Vec::new();
    for w in workers {
        n.push(w.served().await);
    }
    n
}

#[tokio::test]
async fn each_model_reaches_only_its_workers() {
    let (stack, betas) = two_models().await;
    let (alpha_before, beta_before) = (served(&stack.workers).await, served(&betas).await);

    for _ in 0..8 {
        let r = chat(&stack, "alpha").await;
        assert_eq!(r.status(), 200);
    }
    let alpha_after = served(&stack.workers).await;
    assert_eq!(
        served(&betas).await,
        beta_before,
        "no alpha request on beta"
    );
    for (before, after) in alpha_before.iter().zip(&alpha_after) {
        assert!(
            after > before,
            "round robin over both alpha workers: {alpha_after:?}"
        );
    }

    for _ in 0..8 {
        assert_eq!(chat(&stack, "beta").await.status(), 200);
    }
    assert_eq!(
        served(&stack.workers).await,
        alpha_after,
        "no beta request on alpha"
    );
    let beta_after = served(&betas).await;
    assert_eq!(
        beta_after.iter().sum::<u64>() - beta_before.iter().sum::<u64>(),
        8
    );

    // /workers shows what each serves.
    let list = stack.get_json("/workers").await;
    let mut models: Vec<String> = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["model_id"].as_str().unwrap_or_default().to_string())
        .collect();
    models.sort();
    assert_eq!(models, ["alpha", "alpha", "beta", "beta"]);

    // /v1/models lists both, as smg lists them (one worker knows only its own).
    let list = stack.get_json("/v1/models").await;
    assert_eq!(list["object"], "list", "{list}");
    let mut ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    ids.sort();
    assert_eq!(ids, ["alpha", "beta"]);
}

#[tokio::test]
async fn an_unknown_model_is_404_model_not_found_and_no_model_goes_anywhere() {
    let (stack, betas) = two_models().await;
    let total = |a: Vec<u64>, b: Vec<u64>| a.iter().chain(&b).sum::<u64>();
    let before = total(served(&stack.workers).await, served(&betas).await);

    let r = chat(&stack, "gamma").await;
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    assert_eq!(
        r.headers()
            .get("x-smg-error-code")
            .and_then(|v| v.to_str().ok()),
        Some("model_not_found")
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(
        v["error"]["message"],
        "No worker available for model 'gamma'"
    );
    assert_eq!(
        total(served(&stack.workers).await, served(&betas).await),
        before,
        "a refused request reaches no worker"
    );

    // /generate without a model: any worker, both models' included.
    for _ in 0..8 {
        let r = stack
            .post(
                "/generate",
                r#"{"text":"hello","sampling_params":{"max_new_tokens":1}}"#,
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    let alpha: u64 = served(&stack.workers).await.iter().sum();
    let beta: u64 = served(&betas).await.iter().sum();
    assert_eq!(alpha + beta, before + 8);
    assert!(
        alpha > 0 && beta > 0,
        "round robin spans both models: {alpha} {beta}"
    );
}

#[tokio::test]
async fn a_one_model_fleet_takes_any_model_name() {
    let stack = Stack::with_workers(2).await;
    for _ in 0..4 {
        // The workers serve `sim-model`; sglang-router never read the name.
        assert_eq!(chat(&stack, "m").await.status(), 200);
    }
    assert_eq!(served(&stack.workers).await.iter().sum::<u64>(), 4);
    let list = stack.get_json("/workers").await;
    assert!(list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["model_id"] == "sim-model"));
    // One model: a worker answers /v1/models itself, as with sglang-router.
    let models = stack.get_json("/v1/models").await;
    assert_eq!(models["data"][0]["id"], "sim-model");
    assert_eq!(
        models["data"][0]["root"], "sim-model",
        "the worker's own answer"
    );
}

#[tokio::test]
async fn pd_prefill_and_decode_both_follow_the_model() {
    // The stack's own flags come first; these add the model.
    let alpha = vec!["--model-path".to_string(), "alpha".to_string()];
    let stack = Stack::start(StackOptions {
        policy: "round_robin".into(),
        pd: Some(PdOptions {
            prefill_args: alpha.clone(),
            decode_args: alpha,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let beta = model_args("beta");
    let bootstrap = free_port();
    let beta_prefill = SimWorker::start_pd(&stack.dir, "prefill", bootstrap, &beta)
        .await
        .unwrap();
    let beta_decode = SimWorker::start_pd(&stack.dir, "decode", free_port(), &beta)
        .await
        .unwrap();
    let client = reqwest::Client::new();
    for query in [
        format!(
            "url={}&worker_type=prefill&bootstrap_port={bootstrap}",
            beta_prefill.url
        ),
        format!("url={}&worker_type=decode", beta_decode.url),
    ] {
        let r = client
            .post(stack.admin_url(&format!("/add_worker?{query}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    let ready = wait_until(Duration::from_secs(20), || async {
        stack.get_json("/workers").await["healthy"] == 4
            && chat(&stack, "beta").await.status() == 200
    })
    .await;
    if !ready {
        let r = chat(&stack, "beta").await;
        panic!(
            "the beta pair never took requests: {} {} {}",
            stack.get_json("/workers").await,
            r.status(),
            r.text().await.unwrap_or_default()
        );
    }

    let all = [
        &stack.prefills[0],
        &stack.decodes[0],
        &beta_prefill,
        &beta_decode,
    ];
    let before = served_refs(&all).await;
    for _ in 0..4 {
        assert_eq!(chat(&stack, "beta").await.status(), 200);
    }
    let after = served_refs(&all).await;
    assert_eq!(
        after[..2],
        before[..2],
        "alpha's prefill and decode took no beta request"
    );
    assert_eq!(after[2] - before[2], 4, "beta's prefill took each");
    assert_eq!(after[3] - before[3], 4, "beta's decode took each");

    let r = chat(&stack, "gamma").await;
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
}

#[tokio::test]
async fn a_worker_added_before_it_is_up_gets_its_model_once_healthy() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        worker_args: model_args("alpha"),
        ..Default::default()
    })
    .await
    .unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let r = reqwest::Client::new()
        .post(stack.admin_url("/workers"))
        .json(&json!({ "url": url }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
    // Registered while nothing answers there: no model known yet.
    let registered = wait_until(Duration::from_secs(10), || async {
        let list = stack.get_json("/workers").await;
        list["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["url"] == url.as_str() && w["model_id"] == "unknown")
        })
    })
    .await;
    assert!(registered, "{}", stack.get_json("/workers").await);

    let late = SimWorker::spawn(&stack.dir, port, &model_args("beta")).unwrap();
    // Until its model is read the fleet serves one model and any name goes
    // anywhere; the health checker reads it once the worker is up.
    let learned = wait_until(Duration::from_secs(20), || async {
        let list = stack.get_json("/workers").await;
        list["workers"].as_array().is_some_and(|ws| {
            ws.iter().any(|w| {
                w["url"] == url.as_str() && w["model_id"] == "beta" && w["is_healthy"] == true
            })
        })
    })
    .await;
    assert!(learned, "{}", stack.get_json("/workers").await);
    let before = (stack.workers[0].served().await, late.served().await);
    for _ in 0..4 {
        assert_eq!(chat(&stack, "beta").await.status(), 200);
    }
    assert_eq!(
        stack.workers[0].served().await,
        before.0,
        "alpha took no beta request"
    );
    assert_eq!(late.served().await, before.1 + 4);
}
