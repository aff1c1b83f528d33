//! The route names the shipped Gateway, whose policies carry the
//! router's timeout, retries and buffer.

use super::*;

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
