//! The deployment files agree with each other and with what the tests run.
//!
//! The reference values are never copied here: ports and control-plane flags
//! come from `scripts/quickstart.sh`, the Envoy version and build commands
//! from `scripts/lib.sh`, the Envoy settings from `envoy/envoy.yaml` (rendered
//! by `envoy/render.sh`), metric names from `control-plane/src/metrics.rs`.
//! Checked against them: `docker-compose.yml`, `Dockerfile`, `.env.example`,
//! `deploy/` (Kubernetes, Istio, Envoy Gateway, Grafana). `docker-compose
//! config` must accept the compose file (required when `CI` is set).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use regex::Regex;
use serde_yaml::Value;
use sglang_envoy_e2e::built_envoy_and_filter;
use sglang_envoy_e2e::gateway::find_doc;
use sglang_envoy_e2e::manifests::{
    cluster, compose, env_of, flags, hcm, interpolate_defaults, render, s, strings,
    template_placeholders, yaml_docs,
};

mod compose;
mod dockerfile;
mod envoy_config;
mod envoy_gateway;
mod grafana;
mod istio;
mod kubernetes;

fn root() -> PathBuf {
    sglang_envoy_e2e::repo_root()
}

fn read(rel: &str) -> String {
    sglang_envoy_e2e::read_repo_file(rel)
}

fn caps<'t>(re: &str, text: &'t str) -> regex::Captures<'t> {
    Regex::new(re)
        .unwrap()
        .captures(text)
        .unwrap_or_else(|| panic!("no match for {re}"))
}

/// What `scripts/quickstart.sh` runs.
struct Quickstart {
    /// Port variables and their defaults: PORT, CP_ADMIN_PORT, ...
    vars: BTreeMap<String, String>,
    /// The simulated workers' ports.
    worker_ports: Vec<String>,
    /// Control-plane flags it always passes, variables resolved.
    cp_flags: BTreeMap<String, String>,
    /// Envoy's arguments.
    envoy_args: Vec<String>,
    /// Placeholder name -> value it renders the Envoy template with.
    placeholders: BTreeMap<String, String>,
}

fn shell_words(line: &str) -> Vec<String> {
    line.split_whitespace()
        .map(|w| w.trim_matches('"').to_string())
        .collect()
}

fn quickstart() -> Quickstart {
    let text = read("scripts/quickstart.sh");
    let vars: BTreeMap<String, String> = Regex::new(r#"(?m)^(\w+)="\$\{(\w+):-(\d+)\}""#)
        .unwrap()
        .captures_iter(&text)
        .map(|c| (c[1].to_string(), c[3].to_string()))
        .collect();
    for v in ["PORT", "CP_ADMIN_PORT", "CP_GRPC_PORT", "ENVOY_ADMIN_PORT"] {
        assert!(vars.contains_key(v), "quickstart.sh sets {v}");
    }
    let resolve = |w: &str| -> String {
        match w.strip_prefix('$') {
            Some(name) => vars
                .get(name)
                .cloned()
                .unwrap_or_else(|| panic!("quickstart.sh: unknown variable {name}")),
            None => w.to_string(),
        }
    };
    let worker_ports = shell_words(&caps(r"for p in ([\d ]+); do", &text)[1]);
    assert!(!worker_ports.is_empty());

    // The control-plane command: `.../sglang-envoy-control-plane" ARGS \`
    // continued on the next lines.
    let start = text
        .find("/target/release/sglang-envoy-control-plane\"")
        .expect("quickstart.sh starts the control plane");
    let mut cmd = String::new();
    for line in text[start..].lines() {
        cmd.push_str(line.trim_end_matches('\\'));
        cmd.push(' ');
        if !line.trim_end().ends_with('\\') {
            break;
        }
    }
    let words: Vec<String> = shell_words(cmd.split('>').next().unwrap())
        .into_iter()
        .skip(1)
        .filter(|w| !w.contains("cp_args"))
        .map(|w| resolve(&w))
        .collect();
    let cp_flags = flags(&words);
    assert!(cp_flags.contains_key("--admin-port") && cp_flags.contains_key("--grpc-port"));

    let envoy_line = text
        .lines()
        .find(|l| l.contains("/bin/envoy\" -c"))
        .expect("quickstart.sh starts Envoy");
    let envoy_args: Vec<String> = shell_words(envoy_line.split('>').next().unwrap())
        .into_iter()
        .skip(1)
        .collect();

    // render_envoy_config OUT a b c ...: positions mapped to placeholders by
    // the function in lib.sh (`NAME="$N"`), FILTER_WASM aside.
    let call = text
        .lines()
        .find(|l| l.trim_start().starts_with("render_envoy_config "))
        .expect("quickstart.sh renders the Envoy config");
    let call_args: Vec<String> = shell_words(call).into_iter().skip(1).collect();
    let lib = read("scripts/lib.sh");
    let body = &lib[lib
        .find("render_envoy_config() {")
        .expect("lib.sh function")..];
    let body = &body[..body.find("\n}").unwrap()];
    let mut placeholders = BTreeMap::new();
    for c in Regex::new(r#"(\w+)="\$(\d)""#).unwrap().captures_iter(body) {
        let pos: usize = c[2].parse().unwrap();
        placeholders.insert(c[1].to_string(), resolve(&call_args[pos - 1]));
    }
    assert!(
        body.contains("envoy/render.sh"),
        "lib.sh renders with envoy/render.sh, the script compose uses"
    );
    assert!(
        !body.contains("sed "),
        "lib.sh must not fill placeholders itself"
    );
    Quickstart {
        vars,
        worker_ports,
        cp_flags,
        envoy_args,
        placeholders,
    }
}

/// envoy/envoy.yaml rendered with placeholder values of the quick start.
fn template() -> Value {
    let qs = quickstart();
    let mut env = qs.placeholders.clone();
    env.insert(
        "FILTER_WASM".into(),
        "/filter/sglang_envoy_filter.wasm".into(),
    );
    serde_yaml::from_str(&render(&env, "quickstart")).expect("rendered template is YAML")
}

fn wasm_filter(bootstrap: &Value) -> &Value {
    hcm(bootstrap)["http_filters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|f| f["name"].as_str() == Some("sglang.router"))
        .expect("the sglang.router filter")
}

/// The route of the inference requests (`/generate` and its siblings).
fn worker_route(bootstrap: &Value) -> &Value {
    hcm(bootstrap)["route_config"]["virtual_hosts"][0]["routes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|r| r["match"]["path"].as_str() == Some("/generate"))
        .expect("the /generate route")
}

fn without(v: &Value, key: &str) -> Value {
    let mut v = v.clone();
    v.as_mapping_mut().unwrap().remove(key);
    v
}

/// deploy/control-plane.yaml's headless Service of the control plane: the
/// one Service without a cluster IP that selects the control plane's pods.
fn cp_headless_service(k8s: &[Value]) -> &Value {
    let dep = find_doc(k8s, "Deployment", Some("sglang-control-plane"));
    let found: Vec<&Value> = k8s
        .iter()
        .filter(|d| {
            d["kind"] == "Service"
                && d["spec"]["clusterIP"].as_str() == Some("None")
                && d["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
        })
        .collect();
    assert_eq!(found.len(), 1, "one headless Service of the control plane");
    found[0]
}

/// `name.namespace.svc.cluster.local` of a Service.
fn service_dns(svc: &Value) -> String {
    format!(
        "{}.{}.svc.cluster.local",
        s(&svc["metadata"]["name"]),
        s(&svc["metadata"]["namespace"])
    )
}

/// Every Envoy cluster in `v` (a mapping with a `load_assignment`), at any
/// depth: EnvoyFilter patches, EnvoyPatchPolicy values.
fn envoy_clusters<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Mapping(m) => {
            if m.contains_key("load_assignment") {
                out.push(v);
            }
            m.values().for_each(|x| envoy_clusters(x, out));
        }
        Value::Sequence(items) => items.iter().for_each(|x| envoy_clusters(x, out)),
        _ => {}
    }
}

/// Every YAML file under deploy/, relative to the repository, sorted.
fn deploy_yaml_files() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join("deploy"), &mut files);
    let mut rel: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    rel.sort();
    rel
}

/// The quick start routes with cost_aware unless its flags choose a policy
/// (scripts/lib.sh `quickstart_policy`, called by quickstart.sh).
#[test]
fn the_quick_start_routes_with_cost_aware_unless_told_otherwise() {
    assert!(
        read("scripts/quickstart.sh").contains("cp_args+=($(quickstart_policy \"$@\"))"),
        "quickstart.sh adds the quick start's policy to the control plane's flags"
    );
    let policy = |flags: &[&str]| -> String {
        let out = Command::new("bash")
            .arg("-c")
            .arg("source scripts/lib.sh && quickstart_policy \"$@\"")
            .arg("quickstart_policy")
            .args(flags)
            .current_dir(root())
            .output()
            .expect("run bash");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(policy(&[]), "--policy cost_aware");
    assert_eq!(
        policy(&["--worker-urls", "http://a:1"]),
        "--policy cost_aware"
    );
    assert_eq!(policy(&["--policy", "round_robin"]), "");
    assert_eq!(policy(&["--policy=cache_aware"]), "");
    // Not a flag of its own: the prefill half's policy leaves the default.
    assert_eq!(
        policy(&["--prefill-policy", "bucket"]),
        "--policy cost_aware"
    );
}
