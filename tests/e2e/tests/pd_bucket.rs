//! sglang-router's `bucket` prefill policy through Envoy: with two prefill
//! workers, short prompts go to the first (in URL order) and long ones to
//! the second, as the initial even split of 0..4096 characters says, and
//! each request still completes through its decode worker.

use serde_json::{json, Value};
use sglang_envoy_e2e::{PdOptions, SimWorker, Stack, StackOptions};

/// The `text` of each `/generate` a worker received.
async fn texts(w: &SimWorker) -> Vec<String> {
    w.requests()
        .await
        .iter()
        .filter(|r| r["method"] == "POST")
        .filter_map(|r| {
            let body: Value = serde_json::from_str(r["body"].as_str()?).ok()?;
            Some(body["text"].as_str()?.to_string())
        })
        .collect()
}

#[tokio::test]
async fn prefill_workers_take_prompts_by_length() {
    let stack = Stack::start(StackOptions {
        policy: "round_robin".into(),
        pd: Some(PdOptions {
            prefills: 2,
            decodes: 1,
            ..Default::default()
        }),
        cp_args: vec![
            "--prefill-policy".into(),
            "bucket".into(),
            // No imbalance fallback: the ranges alone decide.
            "--balance-abs-threshold".into(),
            "100000000".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let (short, long) = ("s".repeat(100), "l".repeat(3000));
    for text in [&short, &long, &short, &long, &long, &short] {
        let r = stack
            .post(
                "/generate",
                &json!({"text": text, "sampling_params": {"max_new_tokens": 2}}).to_string(),
            )
            .await;
        assert_eq!(r.status(), 200, "{:?}", r.text().await);
    }
    let mut prefills: Vec<&SimWorker> = stack.prefills.iter().collect();
    prefills.sort_by(|a, b| a.url.cmp(&b.url));
    let first = texts(prefills[0]).await;
    let second = texts(prefills[1]).await;
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(
        first.iter().all(|t| *t == short),
        "short prompts: the first bucket"
    );
    assert_eq!(second.len(), 3);
    assert!(
        second.iter().all(|t| *t == long),
        "long prompts: the second bucket"
    );
    assert_eq!(texts(&stack.decodes[0]).await.len(), 6);
}
