//! Envoy configs in the shape a gateway's control plane generates from the
//! deploy/ recipes: Istio's istiod for `deploy/istio/` ([`istio`]) and Envoy
//! Gateway for `deploy/envoy-gateway/` ([`envoy_gateway`]). Each reads the
//! recipe files, builds what the gateway would hand Envoy (the skeletons in
//! `tests/e2e/gateway-shapes/` hold what the gateway adds of its own), and
//! points the result at the stack's loopback ports, so that a recipe change
//! that breaks the shape breaks the tests that run the router through it.
//!
//! What Kubernetes resolves is replaced by what the stack has: a Service's
//! name by the control plane's or the workers' loopback addresses, a mounted
//! or pulled wasm module by the built one.

pub mod envoy_gateway;
pub mod istio;
pub mod picker;

use serde_yaml::{Mapping, Value};

use crate::{read_repo_file, repo_root};

/// Every YAML document of a repository file.
pub fn recipe_docs(rel: &str) -> Vec<Value> {
    let text = read_repo_file(rel);
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"))
        })
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The one document of `kind` (and `name`, when given) among `docs`.
pub fn find_doc<'a>(docs: &'a [Value], kind: &str, name: Option<&str>) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .filter(|d| name.is_none_or(|n| d["metadata"]["name"].as_str() == Some(n)))
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind} {name:?}");
    found[0]
}

/// A scalar as a string.
pub fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// A mapping key.
pub fn key(k: &str) -> Value {
    Value::String(k.to_string())
}

/// Protobuf's MergeFrom on YAML, as Istio's MERGE applies a patch: a message
/// merges field by field, a repeated field appends, a scalar replaces; an
/// `Any` of another type replaces the whole value.
pub fn proto_merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Mapping(a), Value::Mapping(b)) => {
            if a.get("@type").is_some()
                && b.get("@type").is_some()
                && a.get("@type") != b.get("@type")
            {
                *a = b.clone();
                return;
            }
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) => proto_merge(existing, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Sequence(a), Value::Sequence(b)) => a.extend(b.iter().cloned()),
        (a, b) => *a = b.clone(),
    }
}

/// A skeleton from `tests/e2e/gateway-shapes/` with its `{{NAME}}`s filled.
pub fn skeleton(file: &str, vars: &[(&str, String)]) -> Value {
    let mut t = std::fs::read_to_string(repo_root().join("tests/e2e/gateway-shapes").join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    for (name, value) in vars {
        t = t.replace(&format!("{{{{{name}}}}}"), value);
    }
    assert!(!t.contains("{{"), "{file}: placeholders left");
    serde_yaml::from_str(&t).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// `socket_address` of `host:port`.
pub fn socket_address(address: &str) -> Value {
    let (host, port) = address.rsplit_once(':').expect("host:port");
    serde_yaml::from_str(&format!(
        "{{ socket_address: {{ address: \"{host}\", port_value: {port} }} }}"
    ))
    .unwrap()
}

/// A `load_assignment` with one endpoint per `host:port`.
pub fn load_assignment(cluster: &str, addresses: &[String]) -> Value {
    let mut lb = Vec::new();
    for a in addresses {
        let mut endpoint = Mapping::new();
        endpoint.insert(key("address"), socket_address(a));
        let mut e = Mapping::new();
        e.insert(key("endpoint"), Value::Mapping(endpoint));
        lb.push(Value::Mapping(e));
    }
    let mut group = Mapping::new();
    group.insert(key("lb_endpoints"), Value::Sequence(lb));
    let mut la = Mapping::new();
    la.insert(key("cluster_name"), key(cluster));
    la.insert(
        key("endpoints"),
        Value::Sequence(vec![Value::Mapping(group)]),
    );
    Value::Mapping(la)
}

/// The only endpoint address (`host:port`) of a cluster's `load_assignment`.
pub fn only_endpoint(cluster: &Value) -> String {
    let eps = &cluster["load_assignment"]["endpoints"];
    assert_eq!(eps.as_sequence().map(Vec::len), Some(1), "{cluster:?}");
    let lb = &eps[0]["lb_endpoints"];
    assert_eq!(lb.as_sequence().map(Vec::len), Some(1), "{cluster:?}");
    let a = &lb[0]["endpoint"]["address"]["socket_address"];
    format!("{}:{}", text(&a["address"]), text(&a["port_value"]))
}

/// `name.namespace.svc.cluster.local:port` of a Service port in
/// deploy/control-plane.yaml.
pub fn service_address(service: &str, port_name: &str) -> String {
    let docs = recipe_docs("deploy/control-plane.yaml");
    let svc = find_doc(&docs, "Service", Some(service));
    let port = svc["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str() == Some(port_name))
        .unwrap_or_else(|| panic!("Service {service} has no port {port_name}"));
    format!(
        "{service}.{}.svc.cluster.local:{}",
        text(&svc["metadata"]["namespace"]),
        text(&port["port"])
    )
}

/// Points the listener named `name` at `127.0.0.1:port` and the admin
/// interface at `admin_port`: the gateway pod's ports as the test reaches
/// them.
pub fn bind(bootstrap: &mut Value, listener: &str, port: u16, admin_port: u16) {
    let l = bootstrap["static_resources"]["listeners"]
        .as_sequence_mut()
        .unwrap()
        .iter_mut()
        .find(|l| l["name"].as_str() == Some(listener))
        .unwrap_or_else(|| panic!("no listener {listener}"));
    l["address"] = socket_address(&format!("127.0.0.1:{port}"));
    bootstrap["admin"]["address"] = socket_address(&format!("127.0.0.1:{admin_port}"));
}

/// The gateway's listeners and clusters as it delivers them, over xDS (LDS
/// and CDS, here from files in `dir`), not in Envoy's bootstrap: so Envoy
/// holds them to the rules of dynamic resources (an EDS cluster's source,
/// for one, must be a bootstrap cluster). Returns the bootstrap.
pub fn deliver_dynamically(mut b: Value, dir: &std::path::Path) -> anyhow::Result<String> {
    let sr = b
        .as_mapping_mut()
        .unwrap()
        .remove("static_resources")
        .expect("static_resources");
    let mut dynamic = Mapping::new();
    for (kind, field, ty) in [
        ("cds", "clusters", "envoy.config.cluster.v3.Cluster"),
        ("lds", "listeners", "envoy.config.listener.v3.Listener"),
    ] {
        let resources: Vec<Value> = sr[field]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|r| {
                let mut typed = Mapping::new();
                typed.insert(key("@type"), key(&format!("type.googleapis.com/{ty}")));
                typed.extend(r.as_mapping().unwrap().clone());
                Value::Mapping(typed)
            })
            .collect();
        let mut doc = Mapping::new();
        doc.insert(key("version_info"), key("1"));
        doc.insert(key("resources"), Value::Sequence(resources));
        let path = dir.join(format!("{kind}.yaml"));
        std::fs::write(&path, serde_yaml::to_string(&Value::Mapping(doc))?)?;
        let source = serde_yaml::from_str(&format!(
            "{{ resource_api_version: V3, path_config_source: {{ path: \"{}\" }} }}",
            path.display()
        ))?;
        dynamic.insert(key(&format!("{kind}_config")), source);
    }
    b["dynamic_resources"] = Value::Mapping(dynamic);
    Ok(serde_yaml::to_string(&b)?)
}

/// The cluster named `name`.
pub fn cluster_mut<'a>(bootstrap: &'a mut Value, name: &str) -> &'a mut Value {
    bootstrap["static_resources"]["clusters"]
        .as_sequence_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no cluster {name}"))
}
