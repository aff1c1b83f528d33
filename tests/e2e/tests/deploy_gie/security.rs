//! The picker is safe as shipped: its admin token from a Secret, a
//! NetworkPolicy that opens only its ports, RBAC for every pool group.

use super::*;

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
