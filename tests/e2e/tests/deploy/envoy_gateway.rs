//! deploy/envoy-gateway: its policies carry envoy/envoy.yaml's settings.

use super::*;

#[test]
fn envoy_gateway_policies_match_the_template() {
    let t = template();
    let qs = quickstart();
    let k8s = yaml_docs("deploy/control-plane.yaml");
    let cp_svc = find_doc(&k8s, "Service", Some("sglang-control-plane"));
    let workers_svc = find_doc(&k8s, "Service", Some("sglang-workers"));
    let ns = s(&cp_svc["metadata"]["namespace"]);

    let gw = yaml_docs("deploy/envoy-gateway/gateway.yaml");
    let gateway = find_doc(&gw, "Gateway", Some("sglang"));
    assert_eq!(s(&gateway["apiVersion"]), "gateway.networking.k8s.io/v1");
    let route = find_doc(&gw, "HTTPRoute", Some("sglang"));
    assert_eq!(s(&route["apiVersion"]), "gateway.networking.k8s.io/v1");
    assert_eq!(
        s(&route["spec"]["parentRefs"][0]["name"]),
        s(&gateway["metadata"]["name"])
    );
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(s(&backend["name"]), s(&workers_svc["metadata"]["name"]));
    assert_eq!(backend["port"], workers_svc["spec"]["ports"][0]["port"]);
    let tr = &worker_route(&t)["route"];
    assert_eq!(
        s(&route["spec"]["rules"][0]["timeouts"]["request"]),
        s(&tr["timeout"])
    );

    // Endpoint override on the template's header; the template's retries.
    let btp = find_doc(&gw, "BackendTrafficPolicy", None);
    assert_eq!(s(&btp["apiVersion"]), "gateway.envoyproxy.io/v1alpha1");
    assert_eq!(s(&btp["spec"]["targetRefs"][0]["kind"]), "HTTPRoute");
    assert_eq!(s(&btp["spec"]["targetRefs"][0]["name"]), "sglang");
    let header = &cluster(&t, "sglang_workers")["load_balancing_policy"]["policies"][0]
        ["typed_extension_config"]["typed_config"]["override_host_sources"][0]["header"];
    assert_eq!(
        btp["spec"]["loadBalancer"]["endpointOverride"]["extractFrom"][0]["header"],
        *header
    );
    let retry = &btp["spec"]["retry"];
    assert_eq!(retry["numRetries"], tr["retry_policy"]["num_retries"]);
    assert_eq!(
        strings(&retry["retryOn"]["triggers"]).join(","),
        s(&tr["retry_policy"]["retry_on"])
    );
    assert_eq!(
        retry["retryOn"]["httpStatusCodes"],
        tr["retry_policy"]["retriable_status_codes"]
    );

    // Variant A: ext_proc to the control plane's gRPC port, body buffered.
    let ext = yaml_docs("deploy/envoy-gateway/extproc.yaml");
    let eep = find_doc(&ext, "EnvoyExtensionPolicy", None);
    assert_eq!(s(&eep["apiVersion"]), "gateway.envoyproxy.io/v1alpha1");
    assert_eq!(s(&eep["metadata"]["namespace"]), ns);
    assert_eq!(s(&eep["spec"]["targetRefs"][0]["name"]), "sglang");
    let proc = &eep["spec"]["extProc"][0];
    // The Service with a cluster IP: Envoy Gateway takes every replica from
    // its endpoints, and routingType Service needs the cluster IP.
    assert_eq!(
        s(&proc["backendRefs"][0]["name"]),
        s(&cp_svc["metadata"]["name"])
    );
    assert_ne!(cp_svc["spec"]["clusterIP"].as_str(), Some("None"));
    assert_eq!(
        s(&proc["backendRefs"][0]["port"]),
        qs.cp_flags["--grpc-port"]
    );
    assert_eq!(s(&proc["processingMode"]["request"]["body"]), "Buffered");
    // What envoy/envoy-ext-proc.yaml's filter has, as Envoy Gateway can say it.
    let ext_t: Value = {
        let mut env = qs.placeholders.clone();
        env.insert("FILTER_WASM".into(), "/f.wasm".into());
        env.insert(
            "ENVOY_TEMPLATE".into(),
            root()
                .join("envoy/envoy-ext-proc.yaml")
                .display()
                .to_string(),
        );
        serde_yaml::from_str(&render(&env, "ext-proc")).unwrap()
    };
    let te = &wasm_filter(&ext_t)["typed_config"];
    assert_eq!(
        proc["processingMode"]["allowModeOverride"],
        te["allow_mode_override"]
    );
    assert_eq!(
        proc["processingMode"]["response"]["attributes"],
        te["response_attributes"]
    );
    let secs = |v: &Value| s(v).trim_end_matches('s').parse::<f64>().unwrap();
    assert!(
        secs(&proc["messageTimeout"]) >= secs(&te["max_message_timeout"]),
        "messageTimeout covers the longest wait the control plane asks for"
    );
    assert_eq!(proc["failOpen"], Value::Bool(false));

    // The client buffer above the body limit; the template's path handling.
    let ctp = find_doc(&gw, "ClientTrafficPolicy", None);
    assert_eq!(
        s(&ctp["spec"]["targetRefs"][0]["name"]),
        s(&gateway["metadata"]["name"])
    );
    let limit = sglang_envoy_e2e::gateway::envoy_gateway::quantity(
        &ctp["spec"]["connection"]["bufferLimit"],
    );
    assert_eq!(
        Value::from(limit),
        t["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"]
    );
    assert_eq!(
        s(&ctp["spec"]["path"]["escapedSlashesAction"]),
        "RejectRequest"
    );

    // Variant B: the wasm filter with the template's filter settings, plus
    // the patch adding the control-plane cluster and the headers flag.
    let wasm_docs = yaml_docs("deploy/envoy-gateway/wasm.yaml");
    let wp = find_doc(&wasm_docs, "EnvoyExtensionPolicy", None);
    let w = &wp["spec"]["wasm"][0];
    let tf = &wasm_filter(&t)["typed_config"]["config"];
    assert_eq!(s(&w["rootID"]), s(&tf["root_id"]));
    let template_conf: serde_json::Value =
        serde_json::from_str(&s(&tf["configuration"]["value"])).unwrap();
    let conf: serde_json::Value =
        serde_json::from_str(&serde_json::to_string(&w["config"]).unwrap()).unwrap();
    assert_eq!(conf, template_conf);
    assert!(["HTTP", "Image"].contains(&s(&w["code"]["type"]).as_str()));
    let epp = find_doc(&wasm_docs, "EnvoyPatchPolicy", None);
    assert_eq!(s(&epp["spec"]["targetRef"]["name"]), "sglang");
    let patches = epp["spec"]["jsonPatches"].as_sequence().unwrap();
    let cp_cluster = patches
        .iter()
        .find(|p| p["name"].as_str() == Some("sglang_control_plane"))
        .expect("cluster patch");
    let istio = yaml_docs("deploy/istio/envoyfilter.yaml");
    let istio_cp = istio[0]["spec"]["configPatches"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["patch"]["value"]["name"].as_str() == Some("sglang_control_plane"))
        .unwrap();
    assert_eq!(cp_cluster["operation"]["value"], istio_cp["patch"]["value"]);
    assert_eq!(
        without(&cp_cluster["operation"]["value"], "load_assignment"),
        without(cluster(&t, "sglang_control_plane"), "load_assignment")
    );
    let listener = format!(
        "{}/{}/{}",
        s(&gateway["metadata"]["namespace"]),
        s(&gateway["metadata"]["name"]),
        s(&gateway["spec"]["listeners"][0]["name"])
    );
    for (field, value) in [
        (
            "allow_on_headers_stop_iteration",
            &tf["allow_on_headers_stop_iteration"],
        ),
        ("failure_policy", &tf["failure_policy"]),
        ("reload_config", &tf["reload_config"]),
    ] {
        let p = patches
            .iter()
            .find(|p| {
                p["operation"]["path"].as_str() == Some(&format!("typed_config/config/{field}"))
            })
            .unwrap_or_else(|| panic!("a patch setting {field}"));
        assert_eq!(&p["operation"]["value"], value, "{field}");
        assert_eq!(s(&p["name"]), listener);
    }
    // The module: an image, or a URL with a real checksum.
    match s(&w["code"]["type"]).as_str() {
        "Image" => assert!(w["code"]["image"]["url"].is_string()),
        _ => {
            let sha = s(&w["code"]["http"]["sha256"]);
            assert!(
                sha.len() == 64 && sha.chars().any(|c| c != '0'),
                "sha256 {sha}"
            );
        }
    }
}
