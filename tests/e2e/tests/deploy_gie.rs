//! `deploy/gie/`: the InferencePool and its endpoint picker agree with each
//! other and with the workers of `deploy/control-plane.yaml`, and the
//! picker's own launch line serves the pool the manifest describes (against
//! the stand-in API server: no Kubernetes can run here).

use std::process::Command;
use std::time::Duration;

use serde_yaml::Value;
use sglang_envoy_e2e::fake_kube::{pod, FakeKube};
use sglang_envoy_e2e::gateway::{find_doc, recipe_docs};
use sglang_envoy_e2e::{free_port, fresh_dir, release_bin, wait_until, Proc, SimWorker};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const POOL: &str = "deploy/gie/inferencepool.yaml";
const PICKER: &str = "deploy/gie/picker.yaml";

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// The picker container's arguments.
fn picker_args() -> Vec<String> {
    let docs = recipe_docs(PICKER);
    let deployment = find_doc(&docs, "Deployment", Some("sglang-picker"));
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(text)
        .collect()
}

/// The value after `flag` in `args`.
fn flag(args: &[String], flag: &str) -> String {
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag}"));
    args[i + 1].clone()
}

#[test]
fn the_pool_names_the_picker_and_the_picker_serves_the_pool() {
    let pool_docs = recipe_docs(POOL);
    let pool = find_doc(&pool_docs, "InferencePool", Some("sglang"));
    let picker_docs = recipe_docs(PICKER);
    let args = picker_args();
    let deployment = find_doc(&picker_docs, "Deployment", Some("sglang-picker"));
    let namespace = text(&pool["metadata"]["namespace"]);

    // The pool's picker is this Service, on the picker's gRPC port.
    let epp = &pool["spec"]["endpointPickerRef"];
    let service = find_doc(&picker_docs, "Service", Some(&text(&epp["name"])));
    assert_eq!(text(&service["metadata"]["namespace"]), namespace);
    let port = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| text(&p["port"]) == text(&epp["port"]["number"]))
        .expect("the Service has the picker's port");
    assert_eq!(text(&port["targetPort"]), flag(&args, "--grpc-port"));
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["template"]["metadata"]["labels"]
    );

    // The picker serves this pool, in its namespace.
    assert_eq!(flag(&args, "--pool-name"), text(&pool["metadata"]["name"]));
    assert_eq!(flag(&args, "--pool-namespace"), namespace);
    assert_eq!(text(&deployment["metadata"]["namespace"]), namespace);
    assert!(
        args.iter().any(|a| a == "--secure-serving"),
        "gateways speak TLS to it"
    );

    // Probes ask the plaintext health port for names it answers.
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    for (probe, service) in [
        ("readinessProbe", "readiness"),
        ("livenessProbe", "liveness"),
    ] {
        assert_eq!(
            text(&container[probe]["grpc"]["port"]),
            flag(&args, "--grpc-health-port")
        );
        assert_eq!(text(&container[probe]["grpc"]["service"]), service);
    }

    // Its account may read the pool and the pods, nothing more.
    let account = text(&deployment["spec"]["template"]["spec"]["serviceAccountName"]);
    let binding = find_doc(&picker_docs, "RoleBinding", Some("sglang-picker"));
    assert_eq!(text(&binding["subjects"][0]["name"]), account);
    let role = find_doc(
        &picker_docs,
        "Role",
        Some(&text(&binding["roleRef"]["name"])),
    );
    let group = text(&pool["apiVersion"])
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let rules = role["rules"].as_sequence().unwrap();
    for (api_group, resource) in [("", "pods"), (group.as_str(), "inferencepools")] {
        let rule = rules
            .iter()
            .find(|r| {
                r["resources"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .any(|x| text(x) == resource)
            })
            .unwrap_or_else(|| panic!("no rule for {resource}"));
        assert!(rule["apiGroups"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|g| text(g) == api_group));
        let verbs: Vec<String> = rule["verbs"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(text)
            .collect();
        assert_eq!(verbs, ["get", "list", "watch"], "{resource}");
    }

    // The pool's pods are the workers deploy/control-plane.yaml describes.
    let k8s = recipe_docs("deploy/control-plane.yaml");
    let workers = find_doc(&k8s, "Service", Some("sglang-workers"));
    assert_eq!(
        pool["spec"]["selector"]["matchLabels"],
        workers["spec"]["selector"]
    );
    assert_eq!(
        text(&pool["spec"]["targetPorts"][0]["number"]),
        text(&workers["spec"]["ports"][0]["targetPort"])
    );

    // The route sends the gateway's traffic to the pool.
    let route = find_doc(&pool_docs, "HTTPRoute", Some("sglang"));
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(text(&backend["kind"]), "InferencePool");
    assert_eq!(text(&backend["name"]), text(&pool["metadata"]["name"]));
    assert_eq!(text(&backend["group"]), group);

    // Every flag is one the control plane takes.
    let help = Command::new(release_bin("sglang-envoy-control-plane"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for a in args.iter().filter(|a| a.starts_with("--")) {
        assert!(help.contains(a.as_str()), "{a} is not a control-plane flag");
    }
}

/// The Deployment's launch line (its ports swapped for free ones, its
/// address for loopback), pointed at a stand-in API server holding the
/// manifest's pool: the pool's pods become workers, and health answers on
/// the probes' port while the gRPC port speaks only TLS.
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
    let _picker = Proc::spawn_env(
        "picker",
        &release_bin("sglang-envoy-control-plane"),
        &args,
        &dir,
        &[("KUBECONFIG".to_string(), kubeconfig.display().to_string())],
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
}

async fn channel(port: u16) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}
