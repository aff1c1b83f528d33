//! Reading the shipped files the deployment tests check: YAML documents,
//! scalars, flag lists, docker-compose.yml's services and the Envoy template
//! rendered by envoy/render.sh (the script the quick start and compose run).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use regex::Regex;
use serde::Deserialize;
use serde_yaml::Value;

use crate::{read_repo_file, repo_root};

/// Every YAML document of a repository file (`---` separated), each
/// required to parse.
pub fn yaml_docs(rel: &str) -> Vec<Value> {
    let text = read_repo_file(rel);
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// A YAML scalar as a string.
pub fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// A YAML list of scalars as strings.
pub fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("not a list: {v:?}"))
        .iter()
        .map(s)
        .collect()
}

/// `--flag value` pairs of an argument list (a flag without a value maps to "").
pub fn flags(args: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < args.len() {
        if let Some(f) = args[i].strip_prefix("--") {
            let value = args.get(i + 1).filter(|v| !v.starts_with("--"));
            out.insert(format!("--{f}"), value.cloned().unwrap_or_default());
            i += if value.is_some() { 2 } else { 1 };
        } else {
            i += 1;
        }
    }
    out
}

/// Values for the Envoy templates' address placeholders, as a local
/// launch renders them (the quick start's ports on loopback).
pub const LOCAL_ADDRESSES: [(&str, &str); 6] = [
    ("LISTEN_HOST", "127.0.0.1"),
    ("LISTEN_PORT", "30000"),
    ("ENVOY_ADMIN_PORT", "9901"),
    ("CONTROL_PLANE_HOST", "127.0.0.1"),
    ("CONTROL_PLANE_GRPC_PORT", "30011"),
    ("CONTROL_PLANE_ADMIN_PORT", "30010"),
];

/// The placeholders of envoy/envoy.yaml.
pub fn template_placeholders() -> BTreeSet<String> {
    Regex::new(r"\{\{([A-Z_]+)\}\}")
        .unwrap()
        .captures_iter(&read_repo_file("envoy/envoy.yaml"))
        .map(|c| c[1].to_string())
        .collect()
}

/// Runs envoy/render.sh with `env` (and none of the placeholders' variables
/// this process has) and returns the rendered text.
pub fn render(env: &BTreeMap<String, String>, tag: &str) -> String {
    let out = std::env::temp_dir().join(format!(
        "sglang-envoy-deploy-{}-{tag}.yaml",
        std::process::id()
    ));
    let mut cmd = Command::new("sh");
    cmd.arg(repo_root().join("envoy/render.sh")).arg(&out);
    for name in template_placeholders() {
        cmd.env_remove(&name);
    }
    cmd.env_remove("ADMIN_ROUTES").env_remove("ENVOY_TEMPLATE");
    cmd.envs(env);
    let status = cmd.status().expect("run sh");
    assert!(status.success(), "render.sh failed with {env:?}");
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    assert!(!text.contains("{{"), "placeholders left");
    text
}

/// The static cluster `name` of a rendered bootstrap.
pub fn cluster<'a>(bootstrap: &'a Value, name: &str) -> &'a Value {
    bootstrap["static_resources"]["clusters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("cluster {name}"))
}

/// The HTTP connection manager of a rendered bootstrap's client listener.
pub fn hcm(bootstrap: &Value) -> &Value {
    &bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
}

/// The client listener's routes.
pub fn routes(bootstrap: &Value) -> &[Value] {
    hcm(bootstrap)["route_config"]["virtual_hosts"][0]["routes"]
        .as_sequence()
        .expect("routes")
}

/// docker-compose.yml.
pub fn compose() -> Value {
    let docs = yaml_docs("docker-compose.yml");
    assert_eq!(docs.len(), 1);
    docs.into_iter().next().unwrap()
}

/// A compose service's `environment` mapping, values as strings.
pub fn env_of(service: &Value) -> BTreeMap<String, String> {
    service["environment"]
        .as_mapping()
        .expect("environment as a mapping")
        .iter()
        .map(|(k, v)| (s(k), s(v)))
        .collect()
}

/// `${VAR:-default}` -> default, `${VAR}` -> "".
pub fn interpolate_defaults(text: &str) -> String {
    Regex::new(r"\$\{\w+(?::-([^}]*))?\}")
        .unwrap()
        .replace_all(text, |c: &regex::Captures| {
            c.get(1).map_or("", |m| m.as_str()).to_string()
        })
        .into_owned()
}
