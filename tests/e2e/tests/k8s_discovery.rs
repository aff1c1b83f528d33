//! Kubernetes service discovery (`--service-discovery`), against a stand-in
//! API server ([`FakeKube`]: no API server can run on the test machines).
//! Simulated workers stand for pods: each listens on its own loopback
//! address and the shared `--service-discovery-port`, as pods do on their
//! IPs.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use sglang_envoy_e2e::fake_kube::{pod, FakeKube};
use sglang_envoy_e2e::{free_port, fresh_dir, wait_until, SimWorker, Stack, StackOptions};

/// Simulated workers at 127.0.0.N:port for each N.
async fn pods_at(
    dir: &std::path::Path,
    port: u16,
    hosts: &[u8],
    args: &[String],
) -> Vec<SimWorker> {
    let mut out = Vec::new();
    for n in hosts {
        let w = SimWorker::spawn_at(dir, &format!("127.0.0.{n}"), port, args, None).unwrap();
        w.wait_healthy(Duration::from_secs(20)).await.unwrap();
        out.push(w);
    }
    out
}

async fn discovering(fake: &FakeKube, dir: &std::path::Path, cp_args: &[&str]) -> Stack {
    let kubeconfig = fake.kubeconfig(dir).unwrap();
    Stack::start(StackOptions {
        workers: 0,
        policy: "round_robin".into(),
        cp_args: cp_args.iter().map(|s| s.to_string()).collect(),
        cp_env: vec![("KUBECONFIG".into(), kubeconfig.display().to_string())],
        ..Default::default()
    })
    .await
    .unwrap()
}

fn urls(v: &Value, key: &str) -> BTreeSet<String> {
    v[key]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|u| u.as_str().map(str::to_string))
        .collect()
}

/// Waits until `/list_workers` (`key`: urls, prefill or decode) is `want`.
async fn wait_for(stack: &Stack, key: &str, want: &[String]) {
    let want: BTreeSet<String> = want.iter().cloned().collect();
    let ok = wait_until(Duration::from_secs(10), || async {
        urls(&stack.get_json("/list_workers").await, key) == want
    })
    .await;
    assert!(
        ok,
        "{key}: {:?}, want {want:?}",
        stack.get_json("/list_workers").await
    );
}

#[tokio::test]
async fn pods_with_the_labels_serve_while_ready_and_leave_when_relabelled_or_deleted() {
    let dir = fresh_dir(&format!("sglang-k8s-{}", std::process::id())).unwrap();
    let fake = FakeKube::start().await.unwrap();
    let port = free_port();
    let workers = pods_at(&dir, port, &[2, 3, 4], &[]).await;
    let url = |n: u8| format!("http://127.0.0.{n}:{port}");
    let port_text = port.to_string();
    // sglang-router's own launch line for discovery (sgl-router README, "Service
    // Discovery"), unchanged but for the port the local pods serve on.
    let stack = discovering(
        &fake,
        &dir,
        &[
            "--service-discovery",
            "--selector",
            "app=sglang-worker",
            "role=inference",
            "--service-discovery-namespace",
            "sglang-system",
            "--service-discovery-port",
            &port_text,
        ],
    )
    .await;
    let labels = [("app", "sglang-worker"), ("role", "inference")];
    fake.put(pod("sglang-system", "a", &labels, &[], "127.0.0.2", true));
    fake.put(pod("sglang-system", "b", &labels, &[], "127.0.0.3", false));
    fake.put(pod(
        "sglang-system",
        "c",
        &[("app", "sglang-worker")],
        &[],
        "127.0.0.4",
        true,
    ));
    fake.put(pod("other", "d", &labels, &[], "127.0.0.4", true));
    wait_for(&stack, "urls", &[url(2)]).await;
    for i in 0..4 {
        let r = stack
            .post("/generate", &format!(r#"{{"text":"to a {i}"}}"#))
            .await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(workers[0].served().await, 4);

    // b becomes ready: it joins.
    fake.put(pod("sglang-system", "b", &labels, &[], "127.0.0.3", true));
    wait_for(&stack, "urls", &[url(2), url(3)]).await;
    // a loses a label: it leaves, b alone serves.
    fake.put(pod(
        "sglang-system",
        "a",
        &[("app", "sglang-worker")],
        &[],
        "127.0.0.2",
        true,
    ));
    wait_for(&stack, "urls", &[url(3)]).await;
    for i in 0..4 {
        let r = stack
            .post("/generate", &format!(r#"{{"text":"to b {i}"}}"#))
            .await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(workers[0].served().await, 4, "a serves no more");
    assert_eq!(workers[1].served().await, 4);
    // b is deleted: no worker is left.
    fake.delete("sglang-system", "b");
    wait_for(&stack, "urls", &[]).await;
    let r = stack.post("/generate", r#"{"text":"nobody"}"#).await;
    assert_eq!(r.status(), 503);
}

#[tokio::test]
async fn pd_roles_come_from_their_selectors_and_bootstrap_ports_from_annotations() {
    let dir = fresh_dir(&format!("sglang-k8s-pd-{}", std::process::id())).unwrap();
    let fake = FakeKube::start().await.unwrap();
    let port = free_port();
    let port_text = port.to_string();
    let stack = discovering(
        &fake,
        &dir,
        &[
            "--pd-disaggregation",
            "--service-discovery",
            "--prefill-selector",
            "app=sglang",
            "component=prefill",
            "--decode-selector",
            "app=sglang",
            "component=decode",
            "--service-discovery-port",
            &port_text,
        ],
    )
    .await;
    let bootstrap = free_port().to_string();
    let mode = |m: &str| vec!["--disaggregation-mode".to_string(), m.to_string()];
    let mut prefill_args = mode("prefill");
    prefill_args.extend([
        "--disaggregation-bootstrap-port".to_string(),
        bootstrap.clone(),
    ]);
    let _prefill_pod = pods_at(&dir, port, &[5], &prefill_args).await;
    let decode_pod = pods_at(&dir, port, &[6], &mode("decode")).await;
    let prefill = [("app", "sglang"), ("component", "prefill")];
    let decode = [("app", "sglang"), ("component", "decode")];
    fake.put(pod(
        "ns",
        "p",
        &prefill,
        &[("sglang.ai/bootstrap-port", &bootstrap)],
        "127.0.0.5",
        true,
    ));
    fake.put(pod("ns", "d", &decode, &[], "127.0.0.6", true));
    fake.put(pod("ns", "x", &[("app", "sglang")], &[], "127.0.0.7", true));
    let (p, d) = (
        format!("http://127.0.0.5:{port}"),
        format!("http://127.0.0.6:{port}"),
    );
    wait_for(&stack, "prefill", std::slice::from_ref(&p)).await;
    wait_for(&stack, "decode", std::slice::from_ref(&d)).await;
    let workers = stack.get_json("/workers").await;
    let entry = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == p.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(entry["bootstrap_port"].to_string(), bootstrap, "{workers}");
    // A PD request works: the decode pod gets the prefill pod's KV from the
    // annotated bootstrap port.
    let r = stack
        .post(
            "/generate",
            r#"{"text":"pd","sampling_params":{"max_new_tokens":2}}"#,
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    assert_eq!(decode_pod[0].served().await, 1);
    fake.delete("ns", "p");
    wait_for(&stack, "prefill", &[]).await;
    wait_for(&stack, "decode", std::slice::from_ref(&d)).await;
}

/// An endpoint picker's launch: `--pool-name` serves the InferencePool's
/// pods, one worker per pod and target port; the pool may come after the
/// picker.
#[tokio::test]
async fn an_inference_pools_pods_are_its_workers() {
    let dir = fresh_dir(&format!("sglang-k8s-pool-{}", std::process::id())).unwrap();
    let fake = FakeKube::start().await.unwrap();
    let (p1, p2) = (free_port(), free_port());
    let mut workers = pods_at(&dir, p1, &[8], &[]).await;
    workers.extend(pods_at(&dir, p2, &[8], &[]).await);
    let stack = discovering(
        &fake,
        &dir,
        &["--pool-name", "sglang", "--pool-namespace", "llm"],
    )
    .await;
    fake.put(pod(
        "llm",
        "m",
        &[("app", "sglang")],
        &[],
        "127.0.0.8",
        true,
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        urls(&stack.get_json("/list_workers").await, "urls").is_empty(),
        "no pool yet"
    );
    fake.put_pool(
        "llm",
        "sglang",
        serde_json::json!({
            "selector": {"matchLabels": {"app": "sglang"}},
            "targetPorts": [{"number": p1}, {"number": p2}],
            "endpointPickerRef": {"name": "sglang-picker", "port": {"number": 9002}},
        }),
    );
    wait_for(
        &stack,
        "urls",
        &[
            format!("http://127.0.0.8:{p1}"),
            format!("http://127.0.0.8:{p2}"),
        ],
    )
    .await;
    for i in 0..4 {
        let r = stack
            .post("/generate", &format!(r#"{{"text":"pool {i}"}}"#))
            .await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(workers[0].served().await + workers[1].served().await, 4);
    assert!(
        workers[0].served().await > 0 && workers[1].served().await > 0,
        "both ports serve"
    );
    fake.delete("llm", "m");
    wait_for(&stack, "urls", &[]).await;
}
