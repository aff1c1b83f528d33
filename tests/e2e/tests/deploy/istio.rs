//! deploy/istio: the EnvoyFilter carries envoy/envoy.yaml's settings.

use super::*;

#[test]
fn istio_envoyfilter_carries_the_template_settings() {
    let t = template();
    let qs = quickstart();
    let docs = yaml_docs("deploy/istio/envoyfilter.yaml");
    let ef = find_doc(&docs, "EnvoyFilter", Some("sglang-router"));
    assert_eq!(s(&ef["apiVersion"]), "networking.istio.io/v1alpha3");
    let patches = ef["spec"]["configPatches"].as_sequence().unwrap();
    let by = |apply: &str| -> Vec<&Value> {
        patches
            .iter()
            .filter(|p| p["applyTo"].as_str() == Some(apply))
            .collect()
    };
    let clusters = by("CLUSTER");
    let added = |name: &str| -> &Value {
        let p = clusters
            .iter()
            .find(|p| p["patch"]["value"]["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("cluster patch {name}"));
        assert_eq!(s(&p["patch"]["operation"]), "ADD");
        &p["patch"]["value"]
    };

    // The workers: the template's cluster settings, but the Service's pod
    // addresses by DNS instead of EDS (a cluster added over CDS cannot be
    // an xDS source).
    let workers = added("sglang_workers");
    let tw = cluster(&t, "sglang_workers");
    for key in [
        "connect_timeout",
        "per_connection_buffer_limit_bytes",
        "circuit_breakers",
        "load_balancing_policy",
    ] {
        assert_eq!(workers[key], tw[key], "sglang_workers.{key}");
    }
    assert_eq!(s(&workers["type"]), "STRICT_DNS");
    assert!(workers["eds_cluster_config"].is_null());
    let k8s_docs = yaml_docs("deploy/control-plane.yaml");
    let wsvc = find_doc(&k8s_docs, "Service", Some("sglang-workers"));
    assert_eq!(wsvc["spec"]["publishNotReadyAddresses"], Value::Bool(true));
    let waddr = &workers["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        ["address"]["socket_address"];
    assert_eq!(
        format!("{}:{}", s(&waddr["address"]), s(&waddr["port_value"])),
        format!(
            "{}.{}.svc.cluster.local:{}",
            s(&wsvc["metadata"]["name"]),
            s(&wsvc["metadata"]["namespace"]),
            s(&wsvc["spec"]["ports"][0]["port"])
        )
    );
    // Every listener or route patch is limited to the Gateway's port.
    let port = sglang_envoy_e2e::gateway::istio::gateway_port();
    for p in patches.iter().filter(|p| p["applyTo"] != "CLUSTER") {
        let m = &p["match"];
        let n = m["listener"]["portNumber"]
            .as_u64()
            .or(m["routeConfiguration"]["portNumber"].as_u64());
        assert_eq!(
            n,
            Some(port),
            "{:?} patch without the Gateway's port",
            p["applyTo"]
        );
    }
    // The connection manager settings are the template's.
    let nf = by("NETWORK_FILTER");
    assert_eq!(nf.len(), 1);
    let merged = &nf[0]["patch"]["value"]["typed_config"];
    let th = hcm(&t);
    for (k, v) in merged.as_mapping().unwrap() {
        assert_eq!(&th[k.as_str().unwrap()], v, "HttpConnectionManager.{k:?}");
    }
    assert!(merged["local_reply_config"].is_mapping());
    let cp = added("sglang_control_plane");
    let tcp = cluster(&t, "sglang_control_plane");
    assert_eq!(
        without(cp, "load_assignment"),
        without(tcp, "load_assignment")
    );
    let addr = &cp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    let k8s = yaml_docs("deploy/control-plane.yaml");
    // The headless Service: every replica an endpoint of its own
    // (envoy_clusters_reach_every_control_plane_replica).
    assert_eq!(s(&addr["address"]), service_dns(cp_headless_service(&k8s)));
    assert_eq!(s(&addr["port_value"]), qs.cp_flags["--grpc-port"]);

    // The wasm filter: the template's config but the filter's path.
    let filters = by("HTTP_FILTER");
    assert_eq!(filters.len(), 1);
    let f = &filters[0]["patch"];
    assert_eq!(s(&f["operation"]), "INSERT_BEFORE");
    assert_eq!(
        s(&filters[0]["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]),
        "envoy.filters.http.router"
    );
    let tf = wasm_filter(&t);
    assert_eq!(f["value"]["name"], tf["name"]);
    let strip_code = |v: &Value| {
        let mut v = v.clone();
        v["typed_config"]["config"]["vm_config"]
            .as_mapping_mut()
            .unwrap()
            .remove("code");
        v
    };
    assert_eq!(strip_code(&f["value"]), strip_code(tf));
    assert_eq!(
        f["value"]["typed_config"]["config"]["allow_on_headers_stop_iteration"],
        Value::Bool(true)
    );
    let filename =
        s(&f["value"]["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"]);
    let (dir, file) = filename.rsplit_once('/').unwrap();
    let mount = &yaml_docs("deploy/istio/filter-volume-patch.yaml")[0]["spec"]["template"]["spec"];
    let vm = &mount["containers"][0];
    assert_eq!(s(&vm["name"]), "istio-proxy");
    assert_eq!(s(&vm["volumeMounts"][0]["mountPath"]), dir);
    let volume = s(&vm["volumeMounts"][0]["name"]);
    assert_eq!(s(&mount["volumes"][0]["name"]), volume);
    let configmap = s(&mount["volumes"][0]["configMap"]["name"]);
    let readme = read("deploy/README.md");
    assert!(
        readme.contains(&format!("create configmap {configmap}"))
            && readme.contains(&format!("--from-file={file}=")),
        "deploy/README.md creates ConfigMap {configmap} with key {file}"
    );

    // The route: the template's cluster, timeout and retries.
    let routes = by("HTTP_ROUTE");
    assert_eq!(routes.len(), 1);
    let r = &routes[0]["patch"]["value"]["route"];
    let tr = &worker_route(&t)["route"];
    for key in ["cluster", "timeout", "retry_policy"] {
        assert_eq!(r[key], tr[key], "route.{key}");
    }
    let route_name = s(&routes[0]["match"]["routeConfiguration"]["vhost"]["route"]["name"]);
    let gw = yaml_docs("deploy/istio/gateway.yaml");
    let vs = find_doc(&gw, "VirtualService", None);
    assert_eq!(s(&vs["spec"]["http"][0]["name"]), route_name);
    let gateway = find_doc(&gw, "Gateway", None);
    assert_eq!(
        gateway["spec"]["selector"],
        ef["spec"]["workloadSelector"]["labels"]
    );
    assert!(strings(&vs["spec"]["gateways"]).contains(&s(&gateway["metadata"]["name"])));

    // The listener's buffer limit.
    let listeners = by("LISTENER");
    assert_eq!(
        listeners[0]["patch"]["value"]["per_connection_buffer_limit_bytes"],
        t["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"]
    );
    for p in patches {
        assert_eq!(s(&p["match"]["context"]), "GATEWAY");
    }
}
