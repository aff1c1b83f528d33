//! Every shipped way to run the router is safe as shipped: no change to the
//! workers without a credential on any path a client or a neighbour can
//! reach, and the admin API and gRPC port kept off the client path.
//!
//! Checked here from the files themselves: the Envoy templates rendered
//! with render.sh's defaults, docker-compose.yml and `.env.example`, and
//! every Kubernetes manifest under `deploy/` that runs the control plane.
//! The same defaults are exercised on a real Envoy by
//! `admin_security.rs` (the client port refuses changes without a token,
//! and serves no admin route with `ADMIN_ROUTES=off`) and by `compose.rs`
//! (compose's default through its Envoy container).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_yaml::Value;
use sglang_envoy_e2e::manifests::{
    compose, env_of, flags, interpolate_defaults, render, routes, s, strings, yaml_docs,
    LOCAL_ADDRESSES,
};
use sglang_envoy_e2e::{free_port, fresh_dir, read_repo_file, release_bin, repo_root, Proc};

/// The paths of the control plane's health, served on the client port
/// whatever ADMIN_ROUTES says.
const HEALTH: [&str; 3] = ["/health", "/liveness", "/readiness"];

/// A template rendered with only the placeholders set: render.sh's defaults.
fn rendered(template: &str, extra: &[(&str, &str)]) -> Value {
    let mut env: BTreeMap<String, String> = LOCAL_ADDRESSES
        .into_iter()
        .chain([("FILTER_WASM", "/filter/sglang_envoy_filter.wasm")])
        .chain(extra.iter().copied())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.insert(
        "ENVOY_TEMPLATE".into(),
        repo_root().join(template).display().to_string(),
    );
    let tag = template.replace('/', "-");
    serde_yaml::from_str(&render(&env, &tag)).expect("rendered template is YAML")
}

/// Route match path -> cluster, for the routes to the control plane.
fn control_plane_routes(bootstrap: &Value) -> BTreeMap<String, String> {
    routes(bootstrap)
        .iter()
        .filter_map(|r| {
            let cluster = r["route"]["cluster"].as_str()?;
            cluster.starts_with("sglang_control_plane").then(|| {
                let m = &r["match"];
                let path = m["path"]
                    .as_str()
                    .or(m["path_separated_prefix"].as_str())
                    .or(m["prefix"].as_str())
                    .unwrap_or("?");
                (path.to_string(), cluster.to_string())
            })
        })
        .collect()
}

#[test]
fn rendered_templates_show_clients_only_the_control_planes_health() {
    for template in ["envoy/envoy.yaml", "envoy/envoy-ext-proc.yaml"] {
        let shown = control_plane_routes(&rendered(template, &[]));
        let expected: BTreeMap<String, String> = HEALTH
            .iter()
            .map(|p| (p.to_string(), "sglang_control_plane_admin".to_string()))
            .collect();
        assert_eq!(shown, expected, "{template} with render.sh's defaults");

        // ADMIN_ROUTES=on adds the admin API, every route marked as a
        // client's so that the control plane asks for its credential.
        let on = rendered(template, &[("ADMIN_ROUTES", "on")]);
        let shown = control_plane_routes(&on);
        for p in ["/add_worker", "/remove_worker", "/workers", "/metrics"] {
            assert!(
                shown.contains_key(p),
                "{template}: {p} with ADMIN_ROUTES=on"
            );
        }
        assert!(
            shown.values().all(|c| c == "sglang_control_plane_admin"),
            "{template}: no client route reaches the gRPC cluster: {shown:?}"
        );
        for r in routes(&on) {
            if r["route"]["cluster"].as_str() != Some("sglang_control_plane_admin") {
                continue;
            }
            let marked = r["request_headers_to_add"].as_sequence().is_some_and(|hs| {
                hs.iter().any(|h| {
                    h["header"]["key"] == "x-sglang-envoy-client-port"
                        && h["append_action"] == "OVERWRITE_IF_EXISTS_OR_ADD"
                })
            });
            assert!(
                marked,
                "{template}: {:?} is not marked as a client's",
                r["match"]
            );
        }
    }
}

#[test]
fn compose_keeps_the_admin_api_and_grpc_private_by_default() {
    let c = compose();
    let envoy = env_of(&c["services"]["envoy"]);
    let admin_routes = interpolate_defaults(envoy.get("ADMIN_ROUTES").expect("passed to Envoy"));
    assert_eq!(admin_routes, "off", "compose's default");
    let example = read_repo_file(".env.example");
    assert!(
        example.lines().any(|l| l.trim() == "ADMIN_ROUTES=off"),
        ".env.example lists ADMIN_ROUTES with its default"
    );
    assert!(
        example.lines().any(|l| l.trim() == "ADMIN_TOKEN="),
        ".env.example ships no token"
    );
    let cp = &c["services"]["control-plane"];
    let command = interpolate_defaults(&s(&cp["command"]));
    assert!(
        !command.contains("--admin-token"),
        "a token belongs in .env, not in the file"
    );
    let grpc = flags(
        &command
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>(),
    )["--grpc-port"]
        .clone();
    for p in strings(&cp["ports"]) {
        let p = interpolate_defaults(&p);
        assert!(
            p.starts_with("127.0.0.1:"),
            "the control plane publishes {p} beyond the host's loopback"
        );
        assert!(
            !p.ends_with(&format!(":{grpc}")),
            "gRPC {grpc} is published"
        );
    }
}

/// Labels of a pod template or selector.
fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| m.iter().map(|(k, v)| (s(k), s(v))).collect())
        .unwrap_or_default()
}

fn yaml_files(dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml") {
            let rel = p.strip_prefix(repo_root()).unwrap();
            out.push(rel.display().to_string());
        }
    }
}

#[test]
fn kubernetes_control_planes_take_changes_only_with_a_secret_token_and_a_network_policy() {
    let mut files = Vec::new();
    yaml_files(&repo_root().join("deploy"), &mut files);
    let docs: Vec<(String, Value)> = files
        .iter()
        .flat_map(|f| yaml_docs(f).into_iter().map(move |d| (f.clone(), d)))
        .collect();
    let policies: Vec<&Value> = docs
        .iter()
        .filter(|(_, d)| d["kind"] == "NetworkPolicy")
        .map(|(_, d)| d)
        .collect();
    let mut checked = 0;
    for (file, d) in &docs {
        if d["kind"] != "Deployment" {
            continue;
        }
        let pod = &d["spec"]["template"];
        for c in pod["spec"]["containers"].as_sequence().unwrap() {
            if !s(&c["image"]).contains("sglang-envoy-control-plane") {
                continue;
            }
            checked += 1;
            let name = format!("{file}: {}", s(&d["metadata"]["name"]));
            let args = strings(&c["args"]);
            assert!(
                !args.iter().any(|a| a.starts_with("--admin-token")),
                "{name}: a token in the manifest itself"
            );
            let host = flags(&args).get("--host").cloned().unwrap_or_default();
            if host.is_empty() || host == "127.0.0.1" || host == "::1" {
                continue;
            }
            // On every interface: the credential comes from a Secret the
            // pod cannot start without.
            let token = c["env"]
                .as_sequence()
                .into_iter()
                .flatten()
                .find(|e| e["name"] == "SGLANG_ENVOY_ADMIN_TOKEN")
                .unwrap_or_else(|| panic!("{name}: --host {host} and no admin token"));
            let secret = &token["valueFrom"]["secretKeyRef"];
            assert!(secret["name"].is_string(), "{name}: token from a Secret");
            assert_ne!(secret["optional"], Value::Bool(true), "{name}: optional");

            // And a NetworkPolicy selects the pod, admits no one from
            // anywhere, and opens only ports the container declares.
            let pod_labels = labels(&pod["metadata"]["labels"]);
            let declared: BTreeSet<String> = c["ports"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|p| s(&p["containerPort"]))
                .collect();
            let selecting: Vec<&&Value> = policies
                .iter()
                .filter(|p| {
                    p["metadata"]["namespace"] == d["metadata"]["namespace"]
                        && labels(&p["spec"]["podSelector"]["matchLabels"])
                            .iter()
                            .all(|(k, v)| pod_labels.get(k) == Some(v))
                })
                .collect();
            assert!(!selecting.is_empty(), "{name}: no NetworkPolicy selects it");
            for p in selecting {
                assert!(
                    strings(&p["spec"]["policyTypes"]).contains(&"Ingress".to_string()),
                    "{name}: the policy restricts ingress"
                );
                for rule in p["spec"]["ingress"].as_sequence().unwrap() {
                    let from = rule["from"].as_sequence();
                    assert!(
                        from.is_some_and(|f| !f.is_empty()),
                        "{name}: a rule admits everyone"
                    );
                    for port in rule["ports"].as_sequence().expect("ports named") {
                        let port = s(&port["port"]);
                        assert!(declared.contains(&port), "{name}: port {port} undeclared");
                    }
                }
            }
        }
    }
    assert!(
        checked >= 2,
        "control-plane.yaml and gie/picker.yaml checked"
    );
}

#[test]
fn gateway_recipes_send_clients_only_to_workers() {
    // Istio: every route the EnvoyFilter adds goes to the workers' cluster.
    let istio = read_repo_file("deploy/istio/envoyfilter.yaml");
    let clusters: BTreeSet<&str> = istio
        .lines()
        .filter_map(|l| l.trim().strip_prefix("cluster: "))
        .collect();
    assert_eq!(clusters, BTreeSet::from(["sglang_workers"]), "{clusters:?}");
    // Envoy Gateway and the InferencePool: HTTPRoutes name workers only.
    for f in [
        "deploy/envoy-gateway/gateway.yaml",
        "deploy/gie/inferencepool.yaml",
    ] {
        for d in yaml_docs(f).iter().filter(|d| d["kind"] == "HTTPRoute") {
            for rule in d["spec"]["rules"].as_sequence().unwrap() {
                for b in rule["backendRefs"].as_sequence().unwrap() {
                    let name = s(&b["name"]);
                    assert!(
                        !name.contains("control-plane") && !name.contains("picker"),
                        "{f}: a client route to {name}"
                    );
                }
            }
        }
    }
}

/// This machine's address on its default route (no packet is sent), or
/// None when it has no network but loopback.
fn non_loopback_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// sglang-router's habitual `--host 0.0.0.0` opens the admin API and the
/// gRPC port here. Without a credential the control plane says so at start,
/// and its admin port takes changes to the workers from its own host only:
/// another host gets 403 (with a credential, the credential decides).
#[tokio::test]
async fn on_every_interface_without_a_credential_only_this_host_changes_the_workers() {
    let dir = fresh_dir(&format!("sglang-shipped-{}", std::process::id())).unwrap();
    let launch = |name: &str, extra: &[&str]| {
        let port = free_port();
        let mut args: Vec<String> = vec![
            "--admin-port".into(),
            port.to_string(),
            "--grpc-port".into(),
            free_port().to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let bin = release_bin("sglang-envoy-control-plane");
        (Proc::spawn(name, &bin, &args, &dir).unwrap(), port)
    };
    let (open, open_port) = launch("open", &["--host", "0.0.0.0"]);
    let (guarded, guarded_port) = launch("guarded", &["--host", "0.0.0.0", "--admin-token", "t"]);
    let (local, _) = launch("local", &[]);
    let warning = "refuses changes to the workers from other hosts";
    for p in [&open, &guarded, &local] {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !p.log().contains("control plane listening") {
            assert!(Instant::now() < deadline, "not started: {}", p.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(open.log().contains(warning), "{}", open.log());
    for p in [&guarded, &local] {
        assert!(!p.log().contains(warning), "{}", p.log());
    }

    let Some(ip) = non_loopback_ip() else {
        assert!(std::env::var("CI").is_err(), "CI machines have a network");
        eprintln!("skipped the remote half: no address but loopback here");
        return;
    };
    let client = reqwest::Client::new();
    // An unknown worker: 404 once the request reaches the handler.
    let remove = |host: String, port: u16, token: Option<&'static str>| {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let mut r = client.post(format!(
            "http://{host}:{port}/remove_worker?url=http://10.9.9.9:1"
        ));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        async move { r.send().await.unwrap() }
    };
    let r = remove(ip.to_string(), open_port, None).await;
    assert_eq!(r.status(), 403, "from {ip}");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "permission_error", "{body}");
    let r = remove("127.0.0.1".into(), open_port, None).await;
    assert_eq!(r.status(), 404, "this host reaches the handler");
    let r = remove(ip.to_string(), guarded_port, Some("t")).await;
    assert_eq!(
        r.status(),
        404,
        "the credential decides, wherever it comes from"
    );
    let r = remove("127.0.0.1".into(), guarded_port, None).await;
    assert_eq!(
        r.status(),
        401,
        "with a credential configured, loopback needs it too"
    );
}
