//! Load counts return to zero after every kind of ending, including clients
//! that hang up mid-stream.

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use sglang_envoy_e2e::{Stack, StackOptions};

#[tokio::test]
async fn loads_return_to_zero_after_a_burst_with_cancellations() {
    let stack = Stack::start(StackOptions {
        workers: 2,
        policy: "power_of_two".into(),
        worker_args: vec!["--decode-us-per-token".into(), "5000".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let stack = &stack;

    let finished = (0..20).map(|i| async move {
        let body = format!(r#"{{"text":"finish {i}","sampling_params":{{"max_new_tokens":20}}}}"#);
        assert_eq!(stack.post("/generate", &body).await.status(), 200);
    });
    let cancelled = (0..20).map(|i| async move {
        let body = format!(
            r#"{{"model":"m","stream":true,"max_tokens":200,"messages":[{{"role":"user","content":"cancel {i}"}}]}}"#
        );
        let r = stack.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status(), 200);
        let mut s = r.bytes_stream();
        // Read a first chunk, then hang up: ~1 s of generation left.
        assert!(s.next().await.is_some());
        drop(s);
    });
    // Sampled until it is seen above zero (or 5 s pass), not once at a
    // fixed moment that a slow machine may place before the first request.
    let peak = async {
        let started = std::time::Instant::now();
        loop {
            let sum = stack.loads().await.iter().map(|(_, l)| *l).sum::<u64>();
            if sum > 0 || started.elapsed() > Duration::from_secs(5) {
                return sum;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let (_, _, peak) = tokio::join!(
        futures::future::join_all(finished),
        futures::future::join_all(cancelled),
        peak
    );
    assert!(peak > 0, "loads were never counted during the burst");
    assert!(
        stack.wait_loads_zero(Duration::from_secs(5)).await,
        "loads stuck at {:?}",
        stack.loads().await
    );
    // The workers saw the hang-ups too: nothing is still generating.
    for w in &stack.workers {
        let stats: Value = reqwest::get(format!("{}/_sim/stats", w.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(stats["in_flight"], 0, "{stats}");
    }
    let metrics = reqwest::get(stack.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("sgl_router_requests_total"), "{metrics}");
    assert!(
        metrics.contains("reason=\"client_cancelled\""),
        "cancellations not counted:\n{metrics}"
    );
}
