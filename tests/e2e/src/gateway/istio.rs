//! The Istio recipe (`deploy/istio/`) as istiod hands it to an ingress
//! gateway's Envoy: the listener, routes and clusters istiod generates for
//! `gateway.yaml` (the skeleton `gateway-shapes/istio-gateway.yaml`), with
//! every patch of `envoyfilter.yaml` applied the way istiod applies it
//! (pilot/pkg/networking/core/envoyfilter): ADD appends a cluster; MERGE is
//! protobuf's MergeFrom; INSERT_BEFORE puts an HTTP filter before the named
//! one; a `portNumber` limits a patch to the listener (or the route
//! configuration `http.PORT`) of that port. A patch of a kind this applier
//! does not know fails the test rather than being skipped.

use anyhow::{bail, ensure};
use serde_yaml::Value;

use super::{
    bind, cluster_mut, deliver_dynamically, find_doc, load_assignment, only_endpoint, proto_merge,
    recipe_docs, service_address, skeleton, text,
};
use crate::envoy_config::{EnvoyConfig, EnvoyEnv};

/// The istioctl `default` profile's `istio-ingressgateway` Service: the
/// Gateway's port 80 (443) is served on the pod's 8080 (8443); istiod binds
/// the listener to that target port.
pub const INGRESS_SERVICE_PORTS: [(u64, u64); 2] = [(80, 8080), (443, 8443)];

/// The skeleton's second server on the same gateway (another application).
pub const OTHER_PORT: u64 = 9080;

/// The pod port istiod binds the recipe's Gateway server to.
pub fn gateway_port() -> u64 {
    let docs = recipe_docs("deploy/istio/gateway.yaml");
    let gw = find_doc(&docs, "Gateway", None);
    let port = gw["spec"]["servers"][0]["port"]["number"].as_u64().unwrap();
    INGRESS_SERVICE_PORTS
        .iter()
        .find(|(service, _)| *service == port)
        .map_or(port, |(_, target)| *target)
}

/// The gateway's Envoy config with the recipe applied, Kubernetes names
/// still in it.
pub fn generate() -> anyhow::Result<Value> {
    let docs = recipe_docs("deploy/istio/gateway.yaml");
    let gw = find_doc(&docs, "Gateway", None);
    let vs = find_doc(&docs, "VirtualService", None);
    let http = &vs["spec"]["http"][0];
    let dest = &http["route"][0]["destination"];
    let mut b = skeleton(
        "istio-gateway.yaml",
        &[
            ("GATEWAY_PORT", gateway_port().to_string()),
            (
                "SERVICE_PORT",
                text(&gw["spec"]["servers"][0]["port"]["number"]),
            ),
            ("OTHER_PORT", OTHER_PORT.to_string()),
            ("ROUTE_NAME", text(&http["name"])),
            ("DESTINATION", text(&dest["host"])),
            ("DESTINATION_PORT", text(&dest["port"]["number"])),
        ],
    );
    let efs = recipe_docs("deploy/istio/envoyfilter.yaml");
    let ef = find_doc(&efs, "EnvoyFilter", None);
    ensure!(
        ef["spec"]["workloadSelector"]["labels"] == gw["spec"]["selector"],
        "the EnvoyFilter selects other pods than the Gateway"
    );
    for patch in ef["spec"]["configPatches"].as_sequence().unwrap() {
        apply(&mut b, patch)?;
    }
    Ok(b)
}

/// The recipe's config for a stack: the control plane's and the workers'
/// Services resolved to the stack's addresses, the mounted module to the
/// built one, the gateway's port to `env.listen_port` and the other server
/// to `other_port`.
pub fn bootstrap(env: &EnvoyEnv, other_port: u16) -> anyhow::Result<String> {
    let mut b = generate()?;
    for (cluster, service, port, addresses) in [
        (
            "sglang_control_plane",
            "sglang-control-plane-headless",
            "grpc",
            vec![format!("127.0.0.1:{}", env.cp_grpc_port)],
        ),
        (
            "sglang_workers",
            "sglang-workers",
            "http",
            env.workers.clone(),
        ),
    ] {
        let c = cluster_mut(&mut b, cluster);
        if c["load_assignment"].is_null() {
            continue; // not resolved by DNS: Envoy judges what it is
        }
        let named = only_endpoint(c);
        ensure!(
            named == service_address(service, port),
            "{cluster} points at {named}, not the Service in deploy/control-plane.yaml"
        );
        // A headless Service's name resolves to every pod's address.
        c["load_assignment"] = load_assignment(cluster, &addresses);
    }
    let mount = recipe_docs("deploy/istio/filter-volume-patch.yaml")[0]["spec"]["template"]["spec"]
        ["containers"][0]["volumeMounts"][0]["mountPath"]
        .clone();
    let port = gateway_port();
    let mut found = 0;
    for_each_http_filter(&mut b, port, |f| {
        if f["name"].as_str() == Some("sglang.router") {
            let code = &mut f["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"];
            let file = text(code);
            assert!(
                file.starts_with(&format!("{}/", text(&mount))),
                "{file} is not mounted"
            );
            *code = Value::String(env.wasm.display().to_string());
            found += 1;
        }
    });
    ensure!(
        found == 1,
        "the gateway's port has {found} sglang.router filters"
    );
    bind(
        &mut b,
        &format!("0.0.0.0_{port}"),
        env.listen_port,
        env.admin_port,
    );
    bind(
        &mut b,
        &format!("0.0.0.0_{OTHER_PORT}"),
        other_port,
        env.admin_port,
    );
    deliver_dynamically(b, &env.dir)
}

/// [`bootstrap`] for `StackOptions::envoy_config`.
pub fn config(other_port: u16) -> EnvoyConfig {
    EnvoyConfig::new(move |env| bootstrap(env, other_port))
}

fn listeners(b: &mut Value) -> impl Iterator<Item = &mut Value> {
    b["static_resources"]["listeners"]
        .as_sequence_mut()
        .unwrap()
        .iter_mut()
}

fn port_of(listener: &Value) -> u64 {
    listener["address"]["socket_address"]["port_value"]
        .as_u64()
        .unwrap()
}

fn for_each_http_filter(b: &mut Value, port: u64, mut f: impl FnMut(&mut Value)) {
    for l in listeners(b).filter(|l| port_of(l) == port) {
        for fc in l["filter_chains"].as_sequence_mut().unwrap() {
            for nf in fc["filters"].as_sequence_mut().unwrap() {
                if let Some(hf) = nf["typed_config"]["http_filters"].as_sequence_mut() {
                    hf.iter_mut().for_each(&mut f);
                }
            }
        }
    }
}

/// The listener part of a match: its port and name, when given.
fn listener_matches(listener: &Value, m: &Value) -> bool {
    let lm = &m["listener"];
    let port_ok = lm["portNumber"]
        .as_u64()
        .is_none_or(|p| p == port_of(listener));
    let name_ok = lm["name"]
        .as_str()
        .is_none_or(|n| listener["name"].as_str() == Some(n));
    port_ok && name_ok
}

fn apply(b: &mut Value, patch: &Value) -> anyhow::Result<()> {
    let m = &patch["match"];
    ensure!(
        m["context"].as_str() == Some("GATEWAY"),
        "a patch for {:?}, not the gateway",
        m["context"]
    );
    let value = &patch["patch"]["value"];
    let apply_to = patch["applyTo"].as_str().unwrap_or_default();
    let op = patch["patch"]["operation"].as_str().unwrap_or_default();
    let filter_name = m["listener"]["filterChain"]["filter"]["name"].as_str();
    match (apply_to, op) {
        ("CLUSTER", "ADD") => {
            ensure!(m["cluster"].is_null(), "ADD with a cluster match");
            b["static_resources"]["clusters"]
                .as_sequence_mut()
                .unwrap()
                .push(value.clone());
        }
        ("LISTENER", "MERGE") => {
            for l in listeners(b).filter(|l| listener_matches(l, m)) {
                proto_merge(l, value);
            }
        }
        ("NETWORK_FILTER", "MERGE") => {
            for l in listeners(b).filter(|l| listener_matches(l, m)) {
                for fc in l["filter_chains"].as_sequence_mut().unwrap() {
                    for f in fc["filters"].as_sequence_mut().unwrap() {
                        if filter_name.is_none_or(|n| f["name"].as_str() == Some(n)) {
                            proto_merge(f, value);
                        }
                    }
                }
            }
        }
        ("HTTP_FILTER", "INSERT_BEFORE") => {
            let sub = m["listener"]["filterChain"]["filter"]["subFilter"]["name"].as_str();
            let Some(sub) = sub else {
                bail!("INSERT_BEFORE needs a subFilter");
            };
            for l in listeners(b).filter(|l| listener_matches(l, m)) {
                for fc in l["filter_chains"].as_sequence_mut().unwrap() {
                    for f in fc["filters"].as_sequence_mut().unwrap() {
                        if filter_name.is_some_and(|n| f["name"].as_str() != Some(n)) {
                            continue;
                        }
                        let Some(hf) = f["typed_config"]["http_filters"].as_sequence_mut() else {
                            continue;
                        };
                        if let Some(i) = hf.iter().position(|h| h["name"].as_str() == Some(sub)) {
                            hf.insert(i, value.clone());
                        }
                    }
                }
            }
        }
        ("HTTP_ROUTE", "MERGE") => {
            let rc = &m["routeConfiguration"];
            let route_name = rc["vhost"]["route"]["name"].as_str();
            for l in listeners(b) {
                for fc in l["filter_chains"].as_sequence_mut().unwrap() {
                    for f in fc["filters"].as_sequence_mut().unwrap() {
                        let config = &mut f["typed_config"]["route_config"];
                        if let Some(p) = rc["portNumber"].as_u64() {
                            if config["name"].as_str() != Some(&format!("http.{p}")) {
                                continue;
                            }
                        }
                        let Some(vhosts) = config["virtual_hosts"].as_sequence_mut() else {
                            continue;
                        };
                        for vh in vhosts {
                            if rc["vhost"]["name"]
                                .as_str()
                                .is_some_and(|n| vh["name"].as_str() != Some(n))
                            {
                                continue;
                            }
                            for r in vh["routes"].as_sequence_mut().unwrap() {
                                if route_name.is_none_or(|n| r["name"].as_str() == Some(n)) {
                                    proto_merge(r, value);
                                }
                            }
                        }
                    }
                }
            }
        }
        other => bail!("this applier does not know {other:?}: teach it istiod's semantics"),
    }
    Ok(())
}
