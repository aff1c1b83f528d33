//! `deploy/gie/`: the InferencePool and its endpoint picker agree with each
//! other and with the workers of `deploy/control-plane.yaml`; the picker is
//! safe as shipped (admin token from a Secret the pod needs, a
//! NetworkPolicy that opens only its ports, RBAC for every pool group it
//! reads); the route names the shipped Gateway, whose policies carry the
//! router's timeout, retries and buffer; and the picker's own launch line
//! serves the pool the manifest describes and refuses changes without the
//! token (against the stand-in API server: no Kubernetes can run here).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use regex::Regex;
use serde_yaml::Value;
use sglang_envoy_e2e::fake_kube::{pod, FakeKube};
use sglang_envoy_e2e::gateway::envoy_gateway::quantity;
use sglang_envoy_e2e::gateway::{find_doc, recipe_docs};
use sglang_envoy_e2e::{
    free_port, fresh_dir, read_repo_file, release_bin, wait_until, Proc, SimWorker,
};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

mod gateway;
mod launch;
mod security;

const POOL: &str = "deploy/gie/inferencepool.yaml";
const PICKER: &str = "deploy/gie/picker.yaml";
const GATEWAY: &str = "deploy/gie/gateway.yaml";
const README: &str = "deploy/gie/README.md";
/// The route of `POOL` from the Gateway to the pool.
const ROUTE: &str = "sglang-pool";
/// Envoy Gateway's controller, which runs the Envoy pods in its own
/// namespace unless told otherwise.
const ENVOY_GATEWAY: (&str, &str) = (
    "gateway.envoyproxy.io/gatewayclass-controller",
    "envoy-gateway-system",
);

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// The picker's Deployment.
fn picker_deployment() -> Value {
    find_doc(&recipe_docs(PICKER), "Deployment", Some("sglang-picker")).clone()
}

/// The picker container's arguments.
fn picker_args() -> Vec<String> {
    picker_deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(text)
        .collect()
}

/// The control plane's `--help`.
fn help() -> &'static str {
    static HELP: OnceLock<String> = OnceLock::new();
    HELP.get_or_init(|| {
        let out = Command::new(release_bin("sglang-envoy-control-plane"))
            .arg("--help")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
}

/// What `--help` says of `flag`: from its heading line (`--flag <VALUE>`
/// or `--flag` alone) up to the next flag's.
fn flag_help(flag: &str) -> String {
    let mut lines = help().lines().skip_while(|l| {
        !l.trim_start()
            .strip_prefix(flag)
            .is_some_and(|rest| rest.starts_with(" <") || rest.is_empty())
    });
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("{flag} is not in --help"));
    let rest: Vec<&str> = lines
        .take_while(|l| !l.trim_start().starts_with("--"))
        .collect();
    format!("{first}\n{}", rest.join("\n"))
}

/// The `[default: ...]` or `[env: ...]` of a flag's help.
fn help_bracket(flag: &str, what: &str) -> String {
    let re = Regex::new(&format!(r"\[{what}: ([^\]]+)\]")).unwrap();
    re.captures(&flag_help(flag))
        .unwrap_or_else(|| panic!("{flag} has no [{what}: ...]"))[1]
        .to_string()
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
    let route = find_doc(&pool_docs, "HTTPRoute", Some(ROUTE));
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(text(&backend["kind"]), "InferencePool");
    assert_eq!(text(&backend["name"]), text(&pool["metadata"]["name"]));
    assert_eq!(text(&backend["group"]), group);

    // Every flag is one the control plane takes.
    for a in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            help().contains(a.as_str()),
            "{a} is not a control-plane flag"
        );
    }
}

/// The variable the control plane reads `--admin-token` from (its
/// `--help` says which), and that variable's `valueFrom.secretKeyRef` in
/// the picker container.
fn admin_token_env(deployment: &Value) -> (String, Value) {
    let var = help_bracket("--admin-token", "env");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let entry = container["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|e| e["name"].as_str() == Some(var.as_str()))
        .unwrap_or_else(|| panic!("the picker has no {var}"));
    assert!(
        entry["value"].is_null(),
        "{var} is written in the manifest itself"
    );
    (var, entry["valueFrom"]["secretKeyRef"].clone())
}

/// The value after `flag`, when `args` has it.
fn flags_value(args: &[String], flag: &str) -> Option<String> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).cloned()
}

#[test]
fn every_document_is_of_a_known_kind_and_the_readme_names_every_file() {
    let want: BTreeMap<&str, &str> = [
        ("ServiceAccount", "v1"),
        ("Service", "v1"),
        ("Role", "rbac.authorization.k8s.io/v1"),
        ("RoleBinding", "rbac.authorization.k8s.io/v1"),
        ("Deployment", "apps/v1"),
        ("NetworkPolicy", "networking.k8s.io/v1"),
        ("InferencePool", "inference.networking.k8s.io/v1"),
        ("HTTPRoute", "gateway.networking.k8s.io/v1"),
        ("Gateway", "gateway.networking.k8s.io/v1"),
        ("GatewayClass", "gateway.networking.k8s.io/v1"),
        ("ClientTrafficPolicy", "gateway.envoyproxy.io/v1alpha1"),
        ("BackendTrafficPolicy", "gateway.envoyproxy.io/v1alpha1"),
    ]
    .into_iter()
    .collect();
    let dir = sglang_envoy_e2e::repo_root().join("deploy/gie");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml") || f.ends_with(".yml"))
        .collect();
    files.sort();
    assert_eq!(files, ["gateway.yaml", "inferencepool.yaml", "picker.yaml"]);
    let readme = read_repo_file(README);
    for f in &files {
        assert!(
            readme.contains(&format!("({f})")),
            "README.md does not link {f}"
        );
        for d in recipe_docs(&format!("deploy/gie/{f}")) {
            let kind = d["kind"].as_str().unwrap_or_else(|| panic!("{f}: kind"));
            let name = d["metadata"]["name"]
                .as_str()
                .unwrap_or_else(|| panic!("{f}: {kind} without a name"));
            let api = want
                .get(kind)
                .unwrap_or_else(|| panic!("{f}: {kind} {name} is of no kind checked here"));
            assert_eq!(d["apiVersion"].as_str(), Some(*api), "{f}: {kind} {name}");
            // Cluster-scoped only the GatewayClass.
            assert_eq!(
                d["metadata"]["namespace"].is_string(),
                kind != "GatewayClass",
                "{f}: {kind} {name}'s namespace"
            );
        }
    }
    // The CRDs the README installs serve the pool's version: v1 came with
    // GIE v1.0.0.
    let pool_docs = recipe_docs(POOL);
    let pool = find_doc(&pool_docs, "InferencePool", Some("sglang"));
    let release = Regex::new(
        r"gateway-api-inference-extension/releases/download/v(\d+)\.(\d+)\.(\d+)/manifests\.yaml",
    )
    .unwrap()
    .captures(&readme)
    .expect("README.md installs the GIE CRDs from a release");
    let major: u32 = release[1].parse().unwrap();
    if text(&pool["apiVersion"]).ends_with("/v1") {
        assert!(major >= 1, "GIE v{major}.x serves no v1 InferencePool");
    }
}
