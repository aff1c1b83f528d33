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

/// The labels of a mapping (`matchLabels`, a pod template's labels).
fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| m.iter().map(|(k, v)| (text(k), text(v))).collect())
        .unwrap_or_default()
}

/// The API group of an `apiVersion`.
fn group_of(api_version: &Value) -> String {
    let v = text(api_version);
    match v.split_once('/') {
        Some((group, _)) => group.to_string(),
        None => String::new(),
    }
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

#[test]
fn the_admin_token_comes_from_a_secret_the_pod_cannot_start_without() {
    let deployment = picker_deployment();
    let (var, secret) = admin_token_env(&deployment);
    assert!(
        secret.is_mapping(),
        "{var} comes from a Secret (secretKeyRef)"
    );
    assert!(
        secret["optional"].is_null() || secret["optional"] == Value::Bool(false),
        "{var}'s Secret is optional: the pod would start without a token"
    );
    let (name, key) = (text(&secret["name"]), text(&secret["key"]));
    assert_eq!(
        (name.as_str(), key.as_str()),
        ("sglang-admin-token", "token")
    );
    // No token on the command line, where `ps` and the pod spec show it.
    for a in picker_args() {
        assert!(
            !a.starts_with("--admin-token"),
            "a token in the picker's args: {a}"
        );
    }
    // The README's command creates that Secret, in the picker's namespace.
    let ns = text(&deployment["metadata"]["namespace"]);
    let readme = read_repo_file(README);
    let create = format!("kubectl -n {ns} create secret generic {name}");
    assert!(readme.contains(&create), "README.md: no `{create}`");
    assert!(
        readme.contains(&format!("--from-literal={key}=")),
        "README.md: the Secret's key is not {key}"
    );
}

#[test]
fn a_network_policy_opens_only_the_pickers_ports_to_named_namespaces() {
    let docs = recipe_docs(PICKER);
    let deployment = picker_deployment();
    let ns = text(&deployment["metadata"]["namespace"]);
    let pod_labels = labels(&deployment["spec"]["template"]["metadata"]["labels"]);
    let args = picker_args();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let declared: BTreeSet<String> = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| text(&p["containerPort"]))
        .collect();
    let service = find_doc(&docs, "Service", Some("sglang-picker"));
    let served: BTreeSet<String> = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| text(&p["targetPort"]))
        .collect();
    assert_eq!(served, declared, "the Service serves the container's ports");

    let policy = find_doc(&docs, "NetworkPolicy", Some("sglang-picker"));
    assert_eq!(text(&policy["metadata"]["namespace"]), ns);
    let selector = labels(&policy["spec"]["podSelector"]["matchLabels"]);
    assert!(
        !selector.is_empty() && selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "the policy selects the picker's pods ({selector:?} of {pod_labels:?})"
    );
    let types: Vec<String> = policy["spec"]["policyTypes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert!(types.contains(&"Ingress".to_string()), "{types:?}");

    // Port -> the namespaces admitted to it ("" for the policy's own).
    let mut admitted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for rule in policy["spec"]["ingress"].as_sequence().unwrap() {
        let from = rule["from"]
            .as_sequence()
            .expect("a rule without `from` admits all");
        assert!(!from.is_empty(), "a rule with an empty `from` admits all");
        let mut namespaces = BTreeSet::new();
        for peer in from {
            assert!(peer["ipBlock"].is_null(), "an ipBlock: {peer:?}");
            if peer["namespaceSelector"].is_null() {
                // Pods of the policy's namespace only.
                assert_eq!(peer["podSelector"], Value::Mapping(Default::default()));
                namespaces.insert(ns.clone());
            } else {
                let by = labels(&peer["namespaceSelector"]["matchLabels"]);
                let name = by.get("kubernetes.io/metadata.name");
                assert!(
                    by.len() == 1 && name.is_some(),
                    "a namespace named by kubernetes.io/metadata.name: {by:?}"
                );
                namespaces.insert(name.unwrap().clone());
            }
        }
        let ports = rule["ports"]
            .as_sequence()
            .expect("a rule without ports opens all");
        for p in ports {
            let port = text(&p["port"]);
            assert!(declared.contains(&port), "port {port} is not the picker's");
            admitted.entry(port).or_default().extend(namespaces.clone());
        }
    }
    let key_set: BTreeSet<String> = admitted.keys().cloned().collect();
    assert_eq!(
        key_set, declared,
        "every port of the picker, and only those"
    );

    // ext_proc from the gateway's namespace only; health and the admin API
    // from this namespace and monitoring's, never from the gateway's.
    let ext_proc = &admitted[&flag(&args, "--grpc-port")];
    let admin = &admitted[&flag(&args, "--admin-port")];
    let health = &admitted[&flag(&args, "--grpc-health-port")];
    assert!(!ext_proc.contains(&ns), "ext_proc open to all of {ns}");
    assert!(admin.contains(&ns) && health.contains(&ns));
    assert!(
        ext_proc.is_disjoint(admin),
        "the gateway's namespace {ext_proc:?} reaches the admin API"
    );
    // The shipped Gateway's Envoy pods run where its controller puts them.
    let gw = recipe_docs(GATEWAY);
    let class = find_doc(&gw, "GatewayClass", None);
    if text(&class["spec"]["controllerName"]) == ENVOY_GATEWAY.0 {
        assert!(ext_proc.contains(ENVOY_GATEWAY.1), "{ext_proc:?}");
    }
}

#[test]
fn the_role_covers_every_pool_group_the_picker_reads() {
    let docs = recipe_docs(PICKER);
    let args = picker_args();
    // The groups --pool-group names: its default and the one its help
    // gives for v1alpha2 pools.
    let help = flag_help("--pool-group");
    let mut groups: BTreeSet<String> = Regex::new(r"[a-z][a-z0-9.-]*k8s\.io")
        .unwrap()
        .find_iter(&help)
        .map(|m| m.as_str().to_string())
        .collect();
    let default = help_bracket("--pool-group", "default");
    assert!(groups.contains(&default) && groups.len() >= 2, "{groups:?}");
    let chosen = flags_value(&args, "--pool-group").unwrap_or(default);
    groups.insert(chosen.clone());

    let role = find_doc(&docs, "Role", Some("sglang-picker"));
    let rules = role["rules"].as_sequence().unwrap();
    for group in &groups {
        let rule = rules
            .iter()
            .find(|r| {
                r["apiGroups"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .any(|g| text(g) == *group)
                    && r["resources"]
                        .as_sequence()
                        .unwrap()
                        .iter()
                        .any(|x| text(x) == "inferencepools")
            })
            .unwrap_or_else(|| panic!("the Role cannot read {group} InferencePools"));
        let verbs: BTreeSet<String> = rule["verbs"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(text)
            .collect();
        assert!(verbs.contains("get"), "{group}: {verbs:?}");
    }
    // The pool shipped is of the group the picker reads.
    let pool_docs = recipe_docs(POOL);
    let pool = find_doc(&pool_docs, "InferencePool", Some("sglang"));
    assert_eq!(group_of(&pool["apiVersion"]), chosen);
}

/// The value after `flag`, when `args` has it.
fn flags_value(args: &[String], flag: &str) -> Option<String> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).cloned()
}

#[test]
fn the_route_names_the_shipped_gateway_whose_policies_carry_the_routers_settings() {
    let pool_docs = recipe_docs(POOL);
    let route = find_doc(&pool_docs, "HTTPRoute", Some(ROUTE));
    let route_ns = text(&route["metadata"]["namespace"]);
    let gw = recipe_docs(GATEWAY);
    let class = find_doc(&gw, "GatewayClass", None);
    let gateway = find_doc(&gw, "Gateway", None);

    // The route's parent is the Gateway shipped, of the class shipped.
    let parent = &route["spec"]["parentRefs"][0];
    assert_eq!(text(&parent["name"]), text(&gateway["metadata"]["name"]));
    let parent_ns = parent["namespace"].as_str().unwrap_or(&route_ns);
    assert_eq!(parent_ns, text(&gateway["metadata"]["namespace"]));
    assert_eq!(
        text(&gateway["spec"]["gatewayClassName"]),
        text(&class["metadata"]["name"])
    );
    assert_eq!(text(&class["spec"]["controllerName"]), ENVOY_GATEWAY.0);
    let target = |policy: &Value, kind: &str, name: &Value| {
        let t = &policy["spec"]["targetRefs"][0];
        assert_eq!(text(&t["kind"]), kind);
        assert_eq!(text(&t["name"]), text(name));
        assert_eq!(
            policy["metadata"]["namespace"],
            route["metadata"]["namespace"]
        );
    };
    let ctp = find_doc(&gw, "ClientTrafficPolicy", None);
    target(ctp, "Gateway", &gateway["metadata"]["name"]);
    let btp = find_doc(&gw, "BackendTrafficPolicy", None);
    target(btp, "HTTPRoute", &route["metadata"]["name"]);

    // The same settings as the Envoy Gateway recipe, which deploy/envoy_gateway.rs holds
    // to envoy/envoy.yaml: route timeout, retries, cluster limits, and the
    // client side (buffer, timeouts, paths, no client-chosen worker).
    let eg = recipe_docs("deploy/envoy-gateway/gateway.yaml");
    let eg_route = find_doc(&eg, "HTTPRoute", Some("sglang"));
    assert_eq!(
        route["spec"]["rules"][0]["timeouts"],
        eg_route["spec"]["rules"][0]["timeouts"]
    );
    let eg_btp = find_doc(&eg, "BackendTrafficPolicy", None);
    for k in ["retry", "circuitBreaker", "connection"] {
        assert_eq!(
            btp["spec"][k], eg_btp["spec"][k],
            "BackendTrafficPolicy {k}"
        );
    }
    let eg_ctp = find_doc(&eg, "ClientTrafficPolicy", None);
    for k in ["connection", "path", "timeout", "headers"] {
        assert_eq!(ctp["spec"][k], eg_ctp["spec"][k], "ClientTrafficPolicy {k}");
    }
    // Buffers above the largest body the picker takes: an oversized body
    // gets its JSON 413, a long one is buffered for retries.
    let limit: u64 = help_bracket("--max-payload-size", "default")
        .parse()
        .unwrap();
    for (what, v) in [
        (
            "ClientTrafficPolicy",
            &ctp["spec"]["connection"]["bufferLimit"],
        ),
        (
            "BackendTrafficPolicy",
            &btp["spec"]["connection"]["bufferLimit"],
        ),
    ] {
        assert!(
            quantity(v) > limit,
            "{what} buffers {v:?}, bodies reach {limit}"
        );
    }
    // Envoy AI Gateway's pool cluster (ORIGINAL_DST) takes one ip:port.
    let args = picker_args();
    let destination = flags_value(&args, "--destination-endpoints")
        .unwrap_or_else(|| help_bracket("--destination-endpoints", "default"));
    assert_eq!(
        destination, "one",
        "a list breaks Envoy Gateway's pool cluster"
    );
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

async fn channel(port: u16) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}
