//! deploy/ on Kubernetes: the control plane's flags, replicas, threads,
//! and every manifest's kind and apiVersion.

use super::*;

#[test]
fn kubernetes_control_plane_uses_the_quickstart_flags() {
    let qs = quickstart();
    let k8s = yaml_docs("deploy/control-plane.yaml");
    let dep = find_doc(&k8s, "Deployment", Some("sglang-control-plane"));
    assert_eq!(s(&dep["apiVersion"]), "apps/v1");
    assert!(
        dep["spec"]["replicas"].as_u64() >= Some(2),
        "several control planes, all active (checked below)"
    );
    let pod = &dep["spec"]["template"];
    assert_eq!(
        pod["metadata"]["labels"],
        dep["spec"]["selector"]["matchLabels"]
    );
    let c = &pod["spec"]["containers"][0];
    let args = strings(&c["args"]);
    let f = flags(&args);
    for (flag, value) in &qs.cp_flags {
        assert_eq!(f.get(flag), Some(value), "{flag}");
    }
    assert_eq!(f["--host"], "0.0.0.0");
    let ports: BTreeSet<String> = c["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| s(&p["containerPort"]))
        .collect();
    assert_eq!(
        ports,
        BTreeSet::from([f["--admin-port"].clone(), f["--grpc-port"].clone()])
    );
    assert_eq!(
        s(&c["readinessProbe"]["httpGet"]["port"]),
        f["--admin-port"]
    );
    assert_eq!(
        s(&pod["metadata"]["annotations"]["prometheus.io/port"]),
        f["--admin-port"]
    );

    let svc = find_doc(&k8s, "Service", Some("sglang-control-plane"));
    assert_eq!(
        svc["spec"]["selector"],
        dep["spec"]["selector"]["matchLabels"]
    );
    let svc_ports: BTreeSet<String> = svc["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["port"], p["targetPort"]);
            s(&p["port"])
        })
        .collect();
    assert_eq!(svc_ports, ports);

    // Worker URLs name pods of the headless workers Service.
    let workers = find_doc(&k8s, "Service", Some("sglang-workers"));
    assert_eq!(s(&workers["spec"]["clusterIP"]), "None");
    let port = s(&workers["spec"]["ports"][0]["port"]);
    let suffix = format!(
        ".{}.{}.svc.cluster.local:{port}",
        s(&workers["metadata"]["name"]),
        s(&workers["metadata"]["namespace"])
    );
    let urls: Vec<&String> = args
        .iter()
        .skip_while(|a| *a != "--worker-urls")
        .skip(1)
        .take_while(|a| !a.starts_with("--"))
        .collect();
    assert!(!urls.is_empty());
    for u in urls {
        assert!(u.starts_with("http://") && u.ends_with(&suffix), "{u}");
    }
}

/// Several control planes on Kubernetes: two or more replicas that an update
/// replaces one at a time, a PodDisruptionBudget that lets a drain take only
/// some of them, and a headless Service of the gRPC port whose name
/// resolves to each Ready replica. Every replica starts from the same
/// worker list (the same args), and what lets Envoy reach them is unchanged
/// (the NetworkPolicy selects the pods, not a Service).
#[test]
fn kubernetes_control_plane_runs_replicas_behind_a_headless_service() {
    let k8s = yaml_docs("deploy/control-plane.yaml");
    let dep = find_doc(&k8s, "Deployment", Some("sglang-control-plane"));
    let replicas = dep["spec"]["replicas"].as_u64().expect("replicas");
    assert!(replicas >= 2, "replicas: {replicas}");
    let ns = dep["metadata"]["namespace"].clone();
    let pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        .as_mapping()
        .unwrap();
    let selects = |selector: &Value| {
        selector
            .as_mapping()
            .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| pod_labels.get(k) == Some(v)))
    };

    // An update never stops every replica at once.
    let strategy = &dep["spec"]["strategy"];
    assert_ne!(
        strategy["type"].as_str(),
        Some("Recreate"),
        "Recreate stops every replica before starting any"
    );
    assert_eq!(
        strategy["rollingUpdate"]["maxUnavailable"].as_u64(),
        Some(0),
        "a replica is stopped only once its successor runs"
    );

    // A disruption budget over the replicas: some may go, never all.
    let pdbs: Vec<&Value> = k8s
        .iter()
        .filter(|d| {
            d["kind"] == "PodDisruptionBudget"
                && d["metadata"]["namespace"] == ns
                && selects(&d["spec"]["selector"]["matchLabels"])
        })
        .collect();
    assert_eq!(
        pdbs.len(),
        1,
        "one PodDisruptionBudget selects the control plane"
    );
    let pdb = pdbs[0];
    assert_eq!(s(&pdb["apiVersion"]), "policy/v1");
    let evictable = match (
        pdb["spec"]["minAvailable"].as_u64(),
        pdb["spec"]["maxUnavailable"].as_u64(),
    ) {
        (Some(min), None) => replicas.saturating_sub(min),
        (None, Some(max)) => max.min(replicas),
        other => panic!("minAvailable or maxUnavailable, as a number: {other:?}"),
    };
    assert!(
        (1..replicas).contains(&evictable),
        "a drain may evict {evictable} of {replicas} replicas"
    );

    // The headless Service: the gRPC port only (the admin API stays on the
    // other Service), only Ready replicas in its answer.
    let headless = cp_headless_service(&k8s);
    assert_eq!(headless["metadata"]["namespace"], ns);
    assert!(selects(&headless["spec"]["selector"]));
    assert_ne!(
        headless["spec"]["publishNotReadyAddresses"],
        Value::Bool(true),
        "a replica that is not Ready is left out of the name"
    );
    let grpc_port = {
        let c = &dep["spec"]["template"]["spec"]["containers"][0];
        flags(&strings(&c["args"]))["--grpc-port"].clone()
    };
    let ports: Vec<(String, String)> = headless["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| (s(&p["port"]), s(&p["targetPort"])))
        .collect();
    assert_eq!(ports, [(grpc_port.clone(), grpc_port.clone())]);
    // The ClusterIP Service stays, for what must name a Service with a
    // cluster IP (Envoy Gateway's ext_proc backendRefs, port-forward).
    let svc = find_doc(&k8s, "Service", Some("sglang-control-plane"));
    assert!(svc["spec"]["clusterIP"].as_str() != Some("None"));

    // The NetworkPolicy still admits the gateways to the gRPC port of every
    // replica (it selects the pods).
    let np = find_doc(&k8s, "NetworkPolicy", Some("sglang-control-plane"));
    assert!(selects(&np["spec"]["podSelector"]["matchLabels"]));
    let grpc_rule = np["spec"]["ingress"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|r| {
            r["ports"]
                .as_sequence()
                .is_some_and(|ps| ps.iter().any(|p| s(&p["port"]) == grpc_port))
        })
        .expect("a rule for the gRPC port");
    assert!(grpc_rule["from"]
        .as_sequence()
        .is_some_and(|f| !f.is_empty()));
}

/// Every Envoy cluster of deploy/ that reaches the control plane's gRPC port
/// by name resolves its headless Service (each replica an endpoint), and
/// ejects a replica that refuses a connection on the first failure, as
/// envoy/envoy.yaml's cluster does, so the next stream goes to a live one.
#[test]
fn envoy_clusters_reach_every_control_plane_replica() {
    let qs = quickstart();
    let grpc_port = &qs.cp_flags["--grpc-port"];
    let k8s = yaml_docs("deploy/control-plane.yaml");
    let headless = service_dns(cp_headless_service(&k8s));
    let t = template();
    let template_outliers = &cluster(&t, "sglang_control_plane")["outlier_detection"];
    let mut checked = Vec::new();
    for file in deploy_yaml_files() {
        let docs = yaml_docs(&file);
        let mut clusters = Vec::new();
        docs.iter().for_each(|d| envoy_clusters(d, &mut clusters));
        for c in clusters {
            let name = s(&c["name"]);
            let addr = &c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                ["address"]["socket_address"];
            let to_control_plane = s(&addr["port_value"]) == *grpc_port
                || s(&addr["address"]).contains("control-plane");
            if !to_control_plane {
                continue;
            }
            assert_eq!(
                s(&addr["address"]),
                headless,
                "{file}: {name} resolves the headless Service"
            );
            assert_eq!(s(&addr["port_value"]), *grpc_port, "{file}: {name}");
            assert_eq!(s(&c["type"]), "STRICT_DNS", "{file}: {name}");
            let o = &c["outlier_detection"];
            assert_eq!(
                o["split_external_local_origin_errors"],
                Value::Bool(true),
                "{file}: {name} counts refused connections apart"
            );
            assert_eq!(
                o["consecutive_local_origin_failure"].as_u64(),
                Some(1),
                "{file}: {name} ejects on the first"
            );
            assert_eq!(
                o["enforcing_consecutive_local_origin_failure"].as_u64(),
                Some(100),
                "{file}: {name}"
            );
            assert_eq!(
                o["max_ejection_percent"].as_u64(),
                Some(100),
                "{file}: {name} may eject every replica"
            );
            assert_eq!(o, template_outliers, "{file}: {name} as envoy/envoy.yaml's");
            checked.push(format!("{file}: {name}"));
        }
    }
    assert_eq!(
        checked.len(),
        2,
        "the Istio and Envoy Gateway wasm recipes: {checked:?}"
    );
}

#[test]
fn every_deploy_yaml_parses_with_kind_and_api_version() {
    let files = deploy_yaml_files();
    assert!(files.len() >= 7, "{files:?}");
    for rel in files {
        let docs = yaml_docs(&rel);
        assert!(!docs.is_empty(), "{rel}");
        if rel.ends_with("-patch.yaml") {
            continue; // a strategic-merge patch, not an object
        }
        for d in docs {
            assert!(d["apiVersion"].is_string(), "{rel}: apiVersion");
            assert!(d["kind"].is_string(), "{rel}: kind");
            assert!(d["metadata"]["name"].is_string(), "{rel}: metadata.name");
        }
    }
}

/// The control plane's runtime is sized to the CPU it asks for, not to the
/// node: without a CPU limit tokio would start one worker thread per core of
/// the node, and idle threads woken for every message cost the request path
/// (docs/operations.md, "Control plane CPU").
#[test]
fn kubernetes_control_plane_threads_follow_its_cpu_request() {
    let k8s = yaml_docs("deploy/control-plane.yaml");
    let dep = find_doc(&k8s, "Deployment", Some("sglang-control-plane"));
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    let threads: u64 = c["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "TOKIO_WORKER_THREADS")
        .and_then(|e| e["value"].as_str()?.parse().ok())
        .expect("TOKIO_WORKER_THREADS set to a number");
    let cpu = s(&c["resources"]["requests"]["cpu"]);
    let millis: u64 = match cpu.strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => cpu.parse::<u64>().unwrap() * 1000,
    };
    // At least one; at most four per requested core, rounded up.
    assert!(
        threads >= 1 && threads <= 4 * millis.div_ceil(1000),
        "{threads} threads for a request of {cpu}"
    );
}
