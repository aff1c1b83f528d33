//! The picker's own launch line, against a stand-in API server holding
//! the manifest's pool.

use super::*;

/// The Deployment's launch line (its ports swapped for free ones, its
/// address for loopback) and its environment (the Secret's token standing
/// in for a made-up one), pointed at a stand-in API server holding the
/// manifest's pool: the pool's pods become workers, health answers on the
/// probes' port while the gRPC port speaks only TLS, and the admin port
/// takes changes only with the token.
#[tokio::test]
async fn the_pickers_launch_line_serves_the_pool_of_the_manifest() {
    let dir = fresh_dir(&format!("sglang-gie-{}", std::process::id())).unwrap();
    let fake = FakeKube::start().await.unwrap();
    let pool_docs = recipe_docs(POOL);
    let pool = find_doc(&pool_docs, "InferencePool", Some("sglang"));
    let namespace = text(&pool["metadata"]["namespace"]);
    let worker_port = free_port();
    let mut spec: serde_json::Value = serde_json::to_value(&pool["spec"]).unwrap();
    spec["targetPorts"] = serde_json::json!([{ "number": worker_port }]);
    fake.put_pool(&namespace, &text(&pool["metadata"]["name"]), spec);
    let labels: Vec<(String, String)> = pool["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| (text(k), text(v)))
        .collect();
    let labels: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let worker = SimWorker::spawn_at(&dir, "127.0.0.10", worker_port, &[], None).unwrap();
    worker.wait_healthy(Duration::from_secs(20)).await.unwrap();
    fake.put(pod(&namespace, "w0", &labels, &[], "127.0.0.10", true));

    let (grpc, health, admin) = (free_port(), free_port(), free_port());
    let mut args = picker_args();
    for (name, value) in [
        ("--host", "127.0.0.1".to_string()),
        ("--grpc-port", grpc.to_string()),
        ("--grpc-health-port", health.to_string()),
        ("--admin-port", admin.to_string()),
    ] {
        let i = args.iter().position(|a| a == name).unwrap();
        args[i + 1] = value;
    }
    let kubeconfig = fake.kubeconfig(&dir).unwrap();
    let (token_var, _) = admin_token_env(&picker_deployment());
    let token = format!("gie-e2e-{}", std::process::id());
    let _picker = Proc::spawn_env(
        "picker",
        &release_bin("sglang-envoy-control-plane"),
        &args,
        &dir,
        &[
            ("KUBECONFIG".to_string(), kubeconfig.display().to_string()),
            (token_var, token.clone()),
        ],
    )
    .unwrap();
    let list = format!("http://127.0.0.1:{admin}/list_workers");
    let want = format!("http://127.0.0.10:{worker_port}");
    let served = wait_until(Duration::from_secs(15), || async {
        let Ok(r) = reqwest::get(&list).await else {
            return false;
        };
        let v: serde_json::Value = r.json().await.unwrap_or_default();
        v["urls"]
            .as_array()
            .is_some_and(|u| u.len() == 1 && u[0] == want.as_str())
    })
    .await;
    assert!(served, "the pool's pod is a worker");

    let mut client = HealthClient::new(channel(health).await);
    for service in ["readiness", "liveness"] {
        let status = client
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service}");
    }
    let plain = HealthClient::new(channel(grpc).await)
        .check(HealthCheckRequest::default())
        .await;
    assert!(plain.is_err(), "the ext_proc port speaks TLS only");

    // Changes need the Secret's token: refused without it (401) and with
    // another (403); with it the request passes to the handler, which
    // wants a url (400).
    let add = format!("http://127.0.0.1:{admin}/add_worker");
    let http = reqwest::Client::new();
    for (bearer, status) in [
        (None, 401),
        (Some("not-the-token"), 403),
        (Some(&*token), 400),
    ] {
        let mut r = http.post(&add);
        if let Some(b) = bearer {
            r = r.bearer_auth(b);
        }
        let got = r.send().await.unwrap().status().as_u16();
        assert_eq!(got, status, "POST /add_worker with {bearer:?}");
    }
}

async fn channel(port: u16) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}
