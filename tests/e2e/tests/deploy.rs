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
use sglang_envoy_e2e::gateway::find_doc;
use sglang_envoy_e2e::manifests::{
    compose, env_of, flags, hcm, interpolate_defaults, render, s, strings, template_placeholders,
    yaml_docs,
};

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

fn cluster<'a>(bootstrap: &'a Value, name: &str) -> &'a Value {
    bootstrap["static_resources"]["clusters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("cluster {name}"))
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

/// The services among `running` that answer to `host` in the compose
/// network: by their service name or a network alias.
fn named(compose: &Value, host: &str, running: &[String]) -> Vec<String> {
    running
        .iter()
        .filter(|name| {
            *name == host
                || aliases(&compose["services"][name.as_str()])
                    .iter()
                    .any(|a| a == host)
        })
        .cloned()
        .collect()
}

/// A compose service's network aliases (on every network it joins).
fn aliases(service: &Value) -> Vec<String> {
    service["networks"]
        .as_mapping()
        .into_iter()
        .flatten()
        .flat_map(|(_, n)| n["aliases"].as_sequence().into_iter().flatten().map(s))
        .collect()
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

/// Dockerfile stages: name -> instructions (continuation lines joined).
fn dockerfile() -> BTreeMap<String, Vec<String>> {
    let text = read("Dockerfile").replace("\\\n", " ");
    let mut stages = BTreeMap::new();
    let mut current: Option<String> = None;
    let from = Regex::new(r"(?i)^FROM\s+\S+\s+AS\s+(\S+)").unwrap();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(c) = from.captures(line) {
            current = Some(c[1].to_string());
        }
        if let Some(name) = &current {
            stages
                .entry(name.clone())
                .or_insert_with(Vec::new)
                .push(line.to_string());
        }
    }
    stages
}

fn instruction<'a>(stage: &'a [String], op: &str) -> Vec<&'a str> {
    stage
        .iter()
        .filter_map(|l| l.strip_prefix(op).map(str::trim))
        .collect()
}

fn json_list(text: &str) -> Vec<String> {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn render_sh_fills_exactly_the_template_placeholders() {
    let text = read("envoy/render.sh");
    let listed: BTreeSet<String> =
        shell_words(&caps(r"for name in ([A-Z_ \\\n]+); do", &text)[1].replace('\\', " "))
            .into_iter()
            .collect();
    assert_eq!(listed, template_placeholders());
    // A missing value is an error, not an empty field in Envoy's config.
    let mut env: BTreeMap<String, String> = template_placeholders()
        .into_iter()
        .map(|p| (p, "1".to_string()))
        .collect();
    env.remove("LISTEN_PORT");
    let status = Command::new("sh")
        .arg(root().join("envoy/render.sh"))
        .arg(std::env::temp_dir().join("sglang-envoy-deploy-missing.yaml"))
        .env_remove("LISTEN_PORT")
        .envs(&env)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(
        !status.success(),
        "render.sh accepted a missing LISTEN_PORT"
    );
}

#[test]
fn compose_runs_the_quickstart_configuration() {
    let qs = quickstart();
    let c = compose();
    let services = c["services"].as_mapping().expect("services");
    let envoy = &c["services"]["envoy"];

    // The same Envoy version as the tests.
    let version = caps(r#"ENVOY_VERSION="([\d.]+)""#, &read("scripts/lib.sh"))[1].to_string();
    assert_eq!(s(&envoy["image"]), format!("envoyproxy/envoy:v{version}"));

    // envoy/ mounted (not copied), its render.sh the entrypoint.
    let volumes = strings(&envoy["volumes"]);
    let envoy_dir = volumes
        .iter()
        .find_map(|v| v.strip_prefix("./envoy:"))
        .expect("./envoy mounted")
        .trim_end_matches(":ro")
        .to_string();
    let entrypoint = strings(&envoy["entrypoint"]);
    assert_eq!(entrypoint[0], "/bin/sh");
    assert_eq!(entrypoint[1], format!("{envoy_dir}/render.sh"));
    let rendered = &entrypoint[2];
    assert_eq!(entrypoint[3], "/docker-entrypoint.sh");

    // Envoy's own arguments: quickstart's, with the rendered file as -c.
    let command = strings(&envoy["command"]);
    assert_eq!(command[0], "envoy");
    assert_eq!(command[1], "-c");
    assert_eq!(&command[2], rendered);
    assert_eq!(qs.envoy_args[0], "-c");
    assert_eq!(command[3..], qs.envoy_args[2..]);

    // Every placeholder has a value; ports are the quick start's, hosts are
    // the container's.
    let env = env_of(envoy);
    // ...and render.sh's switch for the admin routes (shipped_defaults.rs
    // checks its value).
    let mut expected: BTreeSet<String> = template_placeholders();
    expected.insert("ADMIN_ROUTES".into());
    assert_eq!(env.keys().cloned().collect::<BTreeSet<_>>(), expected);
    for (name, value) in &qs.placeholders {
        match name.as_str() {
            "LISTEN_HOST" => assert_eq!(env[name], "0.0.0.0"),
            "CONTROL_PLANE_HOST" => {
                // A name the control plane answers to without a profile:
                // its network alias, which profile ha's second control
                // plane carries too.
                let default_services: Vec<String> = services
                    .iter()
                    .filter(|(_, v)| profiles(v).is_empty())
                    .map(|(k, _)| s(k))
                    .collect();
                assert_eq!(
                    named(&c, &env[name], &default_services),
                    ["control-plane"],
                    "{name} {} names the control plane",
                    env[name]
                )
            }
            _ => assert_eq!(&interpolate_defaults(&env[name]), value, "{name}"),
        }
    }
    let published = strings(&envoy["ports"]);
    assert!(
        published
            .iter()
            .any(|p| interpolate_defaults(p)
                == format!("{}:{}", qs.vars["PORT"], env["LISTEN_PORT"])),
        "Envoy published on {}: {published:?}",
        qs.vars["PORT"]
    );

    // The wasm comes from the `filter` service through a shared volume.
    let wasm = &env["FILTER_WASM"];
    let (wasm_dir, wasm_file) = wasm.rsplit_once('/').unwrap();
    let volume = volumes
        .iter()
        .find_map(|v| {
            let (src, rest) = v.split_once(':')?;
            (rest.trim_end_matches(":ro") == wasm_dir).then(|| src.to_string())
        })
        .expect("a volume at FILTER_WASM's directory");
    assert!(c["volumes"]
        .as_mapping()
        .unwrap()
        .contains_key(volume.as_str()));
    let filter = &c["services"]["filter"];
    let filter_mount = strings(&filter["volumes"])
        .iter()
        .find_map(|v| v.strip_prefix(&format!("{volume}:")).map(str::to_string))
        .expect("the filter service mounts the volume");
    let stages = dockerfile();
    let target = s(&filter["build"]["target"]);
    let cmd = json_list(instruction(&stages[&target], "CMD")[0]);
    assert_eq!(cmd[0], "cp");
    assert_eq!(cmd[2], format!("{filter_mount}/{wasm_file}"));
    assert!(
        instruction(&stages[&target], "COPY --from=build")[0].contains(&cmd[1]),
        "the filter stage copies the built wasm to {}",
        cmd[1]
    );
    assert_eq!(
        s(&envoy["depends_on"]["filter"]["condition"]),
        "service_completed_successfully"
    );

    // Control plane: the quick start's flags, listening on all interfaces.
    let cp = &c["services"]["control-plane"];
    let cp_args: Vec<String> = interpolate_defaults(&s(&cp["command"]))
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let cp_flags = flags(&cp_args);
    for (flag, value) in &qs.cp_flags {
        assert_eq!(cp_flags.get(flag), Some(value), "control plane {flag}");
    }
    assert_eq!(cp_flags["--host"], "0.0.0.0");
    assert_eq!(
        cp_flags.keys().collect::<BTreeSet<_>>(),
        qs.cp_flags
            .keys()
            .chain(["--host".to_string(), "--worker-urls".to_string()].iter())
            .collect::<BTreeSet<_>>(),
        "no flag beyond the quick start's, --host and --worker-urls"
    );
    assert_eq!(env["CONTROL_PLANE_ADMIN_PORT"], cp_flags["--admin-port"]);
    assert_eq!(env["CONTROL_PLANE_GRPC_PORT"], cp_flags["--grpc-port"]);
    let health = strings(&cp["healthcheck"]["test"]).join(" ");
    assert!(health.contains(&format!("127.0.0.1:{}/health", cp_flags["--admin-port"])));

    // Each service's build target exists in the Dockerfile.
    for (name, svc) in services {
        if let Some(t) = svc["build"]["target"].as_str() {
            assert!(stages.contains_key(t), "{name:?}: no Dockerfile stage {t}");
            assert_eq!(s(&svc["build"]["context"]), ".");
        }
    }
}

/// The compose profiles a service belongs to (none: it always runs).
fn profiles(svc: &Value) -> Vec<String> {
    svc["profiles"]
        .as_sequence()
        .map(|p| p.iter().map(s).collect())
        .unwrap_or_default()
}

#[test]
fn compose_demo_profile_mirrors_the_quickstart_workers() {
    let qs = quickstart();
    let c = compose();
    let services = c["services"].as_mapping().unwrap();
    // Without the profile: the filter, the control plane and Envoy only.
    let default: BTreeSet<String> = services
        .iter()
        .filter(|(_, v)| profiles(v).is_empty())
        .map(|(k, _)| s(k))
        .collect();
    assert_eq!(
        default,
        BTreeSet::from(["control-plane", "envoy", "filter"].map(String::from))
    );

    let workers: Vec<(String, String)> = services
        .iter()
        .filter(|(_, v)| v["build"]["target"].as_str() == Some("sim-worker"))
        .map(|(k, v)| {
            assert_eq!(profiles(v), ["demo"], "{k:?}");
            let args = strings(&v["command"]);
            let f = flags(&args);
            assert_eq!(f["--host"], "0.0.0.0");
            let health = strings(&v["healthcheck"]["test"]).join(" ");
            assert!(health.contains(&format!("127.0.0.1:{}/health", f["--port"])));
            (s(k), f["--port"].clone())
        })
        .collect();
    let ports: Vec<String> = workers.iter().map(|w| w.1.clone()).collect();
    assert_eq!(ports, qs.worker_ports, "the quick start's worker ports");

    // The registration job adds exactly these workers via the admin API.
    let register = services
        .iter()
        .find(|(_, v)| {
            profiles(v) == ["demo"] && v["build"]["target"].as_str() != Some("sim-worker")
        })
        .map(|(_, v)| v)
        .expect("a demo registration service");
    let script = strings(&register["command"]).join(" ");
    let admin = &qs.cp_flags["--admin-port"];
    // From the control plane's own host (its network namespace): without
    // ADMIN_TOKEN the admin port takes changes from there only.
    assert_eq!(s(&register["network_mode"]), "service:control-plane");
    assert!(script.contains(&format!("http://127.0.0.1:{admin}/add_worker?url=")));
    let urls: Vec<String> = Regex::new(r"http://([\w-]+):(\d+)(?:\s|;)")
        .unwrap()
        .captures_iter(&script)
        .map(|c| format!("{}:{}", &c[1], &c[2]))
        .collect();
    let expected: Vec<String> = workers.iter().map(|(n, p)| format!("{n}:{p}")).collect();
    assert_eq!(urls, expected);
    for (name, _) in &workers {
        assert_eq!(
            s(&register["depends_on"][name.as_str()]["condition"]),
            "service_healthy"
        );
    }
}

/// The FLEET_STORE_FLAGS .env.example gives for profile ha (in a comment:
/// the variable itself stays empty, as without the profile there is no
/// store).
fn ha_fleet_store_flags() -> String {
    let env = read(".env.example");
    assert_eq!(
        &caps(r"(?m)^FLEET_STORE_FLAGS=(.*)$", &env)[1],
        "",
        ".env.example leaves FLEET_STORE_FLAGS empty"
    );
    caps(r"(?m)^#\s+FLEET_STORE_FLAGS=(.+)$", &env)[1]
        .trim()
        .to_string()
}

/// Profile ha, as the file says it: a second control plane like the first,
/// both under the name Envoy reaches the control planes by, and the Redis
/// that .env.example's FLEET_STORE_FLAGS for the profile names. Without the
/// profile the name is the one control plane's and no store is used.
#[test]
fn compose_ha_profile_runs_two_control_planes_under_one_name() {
    let c = compose();
    let services = c["services"].as_mapping().unwrap();
    let in_ha: BTreeSet<String> = services
        .iter()
        .filter(|(_, v)| profiles(v).contains(&"ha".to_string()))
        .map(|(k, _)| s(k))
        .collect();
    assert_eq!(
        in_ha,
        BTreeSet::from(["control-plane-2", "redis"].map(String::from))
    );

    // The same control plane twice: image, command, token, health check.
    let first = &c["services"]["control-plane"];
    let second = &c["services"]["control-plane-2"];
    for key in [
        "build",
        "command",
        "environment",
        "extra_hosts",
        "healthcheck",
        "restart",
    ] {
        assert_eq!(first[key], second[key], "control-plane-2's {key}");
    }
    assert!(
        second["ports"].is_null(),
        "control-plane-2 publishes nothing (the admin port is control-plane's)"
    );

    // Envoy's name for the control plane: both with the profile, the first
    // alone without.
    let host = env_of(&c["services"]["envoy"])["CONTROL_PLANE_HOST"].clone();
    let running = |with_ha: bool| -> Vec<String> {
        services
            .iter()
            .filter(|(_, v)| profiles(v).is_empty() || (with_ha && profiles(v) == ["ha"]))
            .map(|(k, _)| s(k))
            .collect()
    };
    assert_eq!(named(&c, &host, &running(false)), ["control-plane"]);
    assert_eq!(
        named(&c, &host, &running(true)),
        ["control-plane", "control-plane-2"]
    );

    // The fleet store: the flag both commands take from FLEET_STORE_FLAGS,
    // empty by default; .env.example's value for the profile names the ha
    // profile's Redis, which is not published.
    let command = s(&first["command"]);
    assert!(command.contains("${FLEET_STORE_FLAGS:-}"), "{command}");
    assert!(!interpolate_defaults(&command).contains("--fleet-store-url"));
    let store_flags = ha_fleet_store_flags();
    let url = flags(&shell_words(&store_flags))["--fleet-store-url"].clone();
    let (store, port) = url
        .strip_prefix("redis://")
        .and_then(|a| a.split_once(':'))
        .unwrap_or_else(|| panic!("{url}: redis://host:port"));
    let redis = &c["services"][store];
    assert_eq!(
        profiles(redis),
        ["ha"],
        "{store} runs with the profile only"
    );
    let image = s(&redis["image"]);
    assert!(
        (image.starts_with("redis:") || image.starts_with("valkey/valkey:")) && port == "6379",
        "{url} is {image}'s port"
    );
    assert!(redis["ports"].is_null(), "the store is not published");
}

#[test]
fn dockerfile_builds_what_the_scripts_build() {
    let qs = quickstart();
    let stages = dockerfile();
    let lib = read("scripts/lib.sh");
    let build_all = &lib[lib.find("build_all() {").unwrap()..];
    let build_all = &build_all[..build_all.find("\n}").unwrap()];
    let builds: Vec<String> = Regex::new(r"cargo build [^)]*")
        .unwrap()
        .find_iter(build_all)
        .map(|m| {
            m.as_str()
                .trim()
                .replacen("--release", "--release --locked", 1)
        })
        .collect();
    assert_eq!(builds.len(), 2, "{builds:?}");
    let build_stage = stages["build"].join("\n");
    for b in &builds {
        assert!(build_stage.contains(b.as_str()), "Dockerfile runs `{b}`");
    }
    assert!(build_stage.contains("rustup target add wasm32-wasip1"));

    let cp = &stages["control-plane"];
    assert_eq!(
        json_list(instruction(cp, "ENTRYPOINT")[0]),
        ["sglang-envoy-control-plane"]
    );
    let cmd = json_list(instruction(cp, "CMD")[0]);
    let f = flags(&cmd);
    for (flag, value) in &qs.cp_flags {
        assert_eq!(f.get(flag), Some(value), "Dockerfile CMD {flag}");
    }
    let exposed: BTreeSet<String> = instruction(cp, "EXPOSE")
        .iter()
        .flat_map(|e| e.split_whitespace().map(str::to_string))
        .collect();
    assert_eq!(
        exposed,
        BTreeSet::from([f["--admin-port"].clone(), f["--grpc-port"].clone()])
    );
    let sim = &stages["sim-worker"];
    let sim_cmd = flags(&json_list(instruction(sim, "CMD")[0]));
    assert_eq!(sim_cmd["--port"], qs.worker_ports[0]);
    assert_eq!(instruction(sim, "EXPOSE"), [qs.worker_ports[0].as_str()]);
    // The control-plane image is the default target (the last stage).
    let last_from = read("Dockerfile")
        .lines()
        .rfind(|l| l.starts_with("FROM "))
        .unwrap()
        .to_string();
    assert!(last_from.ends_with(" AS control-plane"), "{last_from}");
}

#[test]
fn env_example_documents_every_compose_variable() {
    let text = read("docker-compose.yml");
    let used: BTreeSet<String> = Regex::new(r"\$\{(\w+)")
        .unwrap()
        .captures_iter(&text)
        .map(|c| c[1].to_string())
        .collect();
    let env = read(".env.example");
    let set: BTreeSet<String> = Regex::new(r"(?m)^(\w+)=")
        .unwrap()
        .captures_iter(&env)
        .map(|c| c[1].to_string())
        .collect();
    assert_eq!(used, set, ".env.example sets exactly the compose variables");
}

#[test]
fn envoy_config_exists_once() {
    // One source of truth per front door: the wasm template and the ext_proc
    // one (front_door.rs checks the two differ only in their HTTP filters);
    // no other bootstrap config in the repository.
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() {
                if !["target", ".git", ".venv", ".run", "node_modules"].contains(&name.as_str()) {
                    walk(&p, out);
                }
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root(), &mut files);
    // Gateway-shaped skeletons (what istiod and Envoy Gateway generate
    // themselves) are not copies of ours.
    let shapes = root().join("tests/e2e/gateway-shapes");
    let copies: Vec<&PathBuf> = files
        .iter()
        .filter(|p| !p.starts_with(&shapes))
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains("static_resources:")))
        .collect();
    let mut copies: Vec<PathBuf> = copies.into_iter().cloned().collect();
    copies.sort();
    assert_eq!(
        copies,
        [
            root().join("envoy/envoy-ext-proc.yaml"),
            root().join("envoy/envoy.yaml")
        ]
    );
}

/// The compose-rendered config is what `envoy --mode validate` accepts.
#[test]
fn compose_rendered_envoy_config_is_valid() {
    let c = compose();
    let mut env = env_of(&c["services"]["envoy"]);
    for v in env.values_mut() {
        *v = interpolate_defaults(v);
    }
    env.retain(|_, v| !v.is_empty());
    let text = render(&env, "compose");
    let b: Value = serde_yaml::from_str(&text).unwrap();
    let listener = &b["static_resources"]["listeners"][0]["address"]["socket_address"];
    assert_eq!(s(&listener["address"]), "0.0.0.0");
    assert_eq!(s(&listener["port_value"]), env["LISTEN_PORT"]);
    let cp = &cluster(&b, "sglang_control_plane")["load_assignment"]["endpoints"][0]
        ["lb_endpoints"][0]["endpoint"]["address"]["socket_address"];
    assert_eq!(s(&cp["address"]), env["CONTROL_PLANE_HOST"]);
    assert_eq!(s(&cp["port_value"]), env["CONTROL_PLANE_GRPC_PORT"]);

    // Validate with the real Envoy when it and the filter are built.
    let envoy = std::env::var_os("SGLANG_ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/envoy"));
    let wasm = root().join("target/wasm32-wasip1/release/sglang_envoy_filter.wasm");
    if !envoy.exists() || !wasm.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must have Envoy ({}) and the filter ({})",
            envoy.display(),
            wasm.display()
        );
        eprintln!("skipping `envoy --mode validate`: Envoy or the filter is not built");
        return;
    }
    env.insert("FILTER_WASM".into(), wasm.display().to_string());
    let path =
        std::env::temp_dir().join(format!("sglang-envoy-validate-{}.yaml", std::process::id()));
    std::fs::write(&path, render(&env, "validate")).unwrap();
    let out = Command::new(&envoy)
        .args(["--mode", "validate", "-c"])
        .arg(&path)
        .output()
        .expect("run envoy");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "envoy --mode validate: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `docker-compose config` (and `docker compose config` when the plugin is
/// there) accepts the file, by default, with `--profile demo` and with
/// `--profile ha` (and .env.example's FLEET_STORE_FLAGS for it): Envoy's
/// CONTROL_PLANE_HOST names every control plane that runs, and only those
/// of profile ha use the fleet store.
#[test]
fn docker_compose_config_accepts_the_file() {
    let mut tools: Vec<Vec<&str>> = Vec::new();
    let works = |cmd: &[&str]| {
        Command::new(cmd[0])
            .args(&cmd[1..])
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works(&["docker-compose"]) {
        tools.push(vec!["docker-compose"]);
    }
    if works(&["docker", "compose"]) {
        tools.push(vec!["docker", "compose"]);
    }
    if tools.is_empty() {
        assert!(
            std::env::var_os("CI").is_none(),
            "docker-compose is missing (scripts/lib.sh ensure_debian_packages installs it)"
        );
        eprintln!("skipping: neither docker-compose nor `docker compose` is installed");
        return;
    }
    let env_example = read(".env.example");
    let worker_urls = caps(r"(?m)^WORKER_URLS=(.*)$", &env_example)[1].to_string();
    let empty = std::env::temp_dir().join("sglang-envoy-empty.env");
    std::fs::write(&empty, "").unwrap();
    // Profile ha's .env: .env.example with the FLEET_STORE_FLAGS it gives
    // for the profile.
    let store_flags = ha_fleet_store_flags();
    let ha_env = std::env::temp_dir().join(format!("sglang-envoy-ha-{}.env", std::process::id()));
    std::fs::write(
        &ha_env,
        Regex::new(r"(?m)^FLEET_STORE_FLAGS=.*$")
            .unwrap()
            .replace(
                &env_example,
                format!("FLEET_STORE_FLAGS={store_flags}").as_str(),
            )
            .as_ref(),
    )
    .unwrap();
    let store_url = flags(&shell_words(&store_flags))["--fleet-store-url"].clone();
    for tool in &tools {
        for (env_file, profile, expected) in [
            (
                empty.clone(),
                None,
                vec!["control-plane", "envoy", "filter"],
            ),
            (
                root().join(".env.example"),
                Some("demo"),
                vec![
                    "control-plane",
                    "demo-register",
                    "envoy",
                    "filter",
                    "worker-1",
                    "worker-2",
                ],
            ),
            (
                ha_env.clone(),
                Some("ha"),
                vec![
                    "control-plane",
                    "control-plane-2",
                    "envoy",
                    "filter",
                    "redis",
                ],
            ),
        ] {
            let mut cmd = Command::new(tool[0]);
            cmd.args(&tool[1..])
                .arg("-f")
                .arg(root().join("docker-compose.yml"))
                .arg("--env-file")
                .arg(&env_file);
            if let Some(p) = profile {
                cmd.args(["--profile", p]);
            }
            // Only the env file decides; not the caller's shell.
            for var in [
                "WORKER_URLS",
                "CONTROL_PLANE_FLAGS",
                "FLEET_STORE_FLAGS",
                "PORT",
                "MAX_BODY_BYTES",
                "COMPOSE_PROFILES",
            ] {
                cmd.env_remove(var);
            }
            let out = cmd.arg("config").output().expect("run compose");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{tool:?} config {profile:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let resolved: Value = serde_yaml::from_str(&stdout).expect("config output is YAML");
            // The services that run: v2 leaves inactive profiles out of its
            // output, v1 lists them with their `profiles`.
            let mut names: Vec<String> = resolved["services"]
                .as_mapping()
                .unwrap()
                .iter()
                .filter(|(_, svc)| {
                    svc["profiles"]
                        .as_sequence()
                        .is_none_or(|ps| ps.iter().any(|p| p.as_str() == profile))
                })
                .map(|(k, _)| s(k))
                .collect();
            names.sort();
            assert_eq!(names, expected, "{tool:?} {profile:?}");
            let command = |service: &str| -> Vec<String> {
                match &resolved["services"][service]["command"] {
                    Value::Sequence(_) => strings(&resolved["services"][service]["command"]),
                    v => shell_words(&s(v)),
                }
            };
            let cp_command = command("control-plane").join(" ");
            if profile.is_some() {
                assert!(
                    cp_command.contains(&format!("--worker-urls {worker_urls}")),
                    "WORKER_URLS from the env file: {cp_command}"
                );
            }
            // The control planes that run (not demo-register, which runs the
            // same image in the first one's network namespace), all under
            // Envoy's CONTROL_PLANE_HOST; with profile ha, two, sharing the
            // fleet store, which nobody outside the network reaches.
            let control_planes: Vec<String> = names
                .iter()
                .filter(|n| {
                    let svc = &resolved["services"][n.as_str()];
                    svc["build"]["target"].as_str() == Some("control-plane")
                        && svc["network_mode"].is_null()
                })
                .cloned()
                .collect();
            let ha = profile == Some("ha");
            assert_eq!(
                control_planes.len(),
                if ha { 2 } else { 1 },
                "{tool:?} {profile:?}"
            );
            let host = env_of(&resolved["services"]["envoy"])["CONTROL_PLANE_HOST"].clone();
            assert_eq!(
                named(&resolved, &host, &names),
                control_planes,
                "{tool:?} {profile:?}: Envoy's {host} names every control plane"
            );
            for cp in &control_planes {
                assert_eq!(
                    flags(&command(cp)).get("--fleet-store-url"),
                    ha.then_some(&store_url),
                    "{tool:?} {profile:?}: {cp}'s fleet store"
                );
            }
            if ha {
                assert_eq!(command("control-plane"), command("control-plane-2"));
                let store = store_url
                    .strip_prefix("redis://")
                    .and_then(|a| a.split_once(':'))
                    .map(|(host, _)| host)
                    .expect("redis://host:port");
                assert!(names.iter().any(|n| n == store), "{store} runs");
                assert!(
                    resolved["services"][store]["ports"].is_null(),
                    "{tool:?}: the store publishes no port"
                );
            }
        }
    }
}

/// The Envoy settings deploy/ carries are exactly envoy/envoy.yaml's.
#[test]
fn envoy_routes_to_workers_exactly_the_paths_the_filter_serves() {
    use sglang_envoy_body::{Route, INFO_PATHS};
    for template in ["envoy/envoy.yaml", "envoy/envoy-ext-proc.yaml"] {
        let mut env: BTreeMap<String, String> = template_placeholders()
            .into_iter()
            .map(|p| (p, "1".to_string()))
            .collect();
        env.insert(
            "ENVOY_TEMPLATE".into(),
            root().join(template).display().to_string(),
        );
        // The optional ones: empty (the TLS files must exist; see
        // deploy_tls.rs for those).
        for optional in [
            "FILTER_OPTIONS",
            "WORKER_CA_CERTS",
            "WORKER_CLIENT_CERT",
            "WORKER_CLIENT_KEY",
            "LISTEN_TLS_CERT",
            "LISTEN_TLS_KEY",
        ] {
            env.insert(optional.into(), String::new());
        }
        // The CORS block rendered in, so the routes are read with it.
        env.insert(
            "CORS_ALLOWED_ORIGINS".into(),
            "https://app.example.com *".into(),
        );
        let t: Value = serde_yaml::from_str(&render(&env, "routes")).expect("YAML");
        let routes = hcm(&t)["route_config"]["virtual_hosts"][0]["routes"]
            .as_sequence()
            .unwrap();
        let to_workers: BTreeSet<String> = routes
            .iter()
            .filter(|r| r["route"]["cluster"].as_str() == Some("sglang_workers"))
            .map(|r| s(&r["match"]["path"]))
            .collect();
        let mut served: BTreeSet<String> =
            Route::ALL.iter().map(|r| r.path().to_string()).collect();
        served.insert("/rerank".into());
        served.extend(INFO_PATHS.iter().map(|p| p.to_string()));
        assert_eq!(to_workers, served, "{template}");
        for path in &served {
            assert!(Route::from_path(path).is_some() || INFO_PATHS.contains(&path.as_str()));
        }
        // Everything else gets Envoy's own 404, and paths are normalised
        // before any of this is matched.
        let last = routes.last().unwrap();
        assert_eq!(s(&last["match"]["prefix"]), "/");
        assert_eq!(last["direct_response"]["status"].as_u64(), Some(404));
        let h = hcm(&t);
        assert_eq!(h["normalize_path"], Value::Bool(true));
        assert_eq!(h["merge_slashes"], Value::Bool(true));
        assert_eq!(s(&h["path_with_escaped_slashes_action"]), "REJECT_REQUEST");
    }
}

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

/// Metric names the control plane exports, as Prometheus sees them, with
/// their label names: from the `registry.register` calls in metrics.rs.
fn exported_metrics() -> BTreeMap<String, BTreeSet<String>> {
    let src = read("control-plane/src/metrics.rs");
    let field_re =
        Regex::new(r"(?m)^\s+(\w+): (?:Family<(\w+), (\w+)>|(Counter|Gauge|Histogram)),").unwrap();
    let mut fields: BTreeMap<String, (Option<String>, String)> = BTreeMap::new();
    for c in field_re.captures_iter(&src) {
        let kind = c.get(3).or(c.get(4)).unwrap().as_str().to_string();
        fields.insert(
            c[1].to_string(),
            (c.get(2).map(|m| m.as_str().to_string()), kind),
        );
    }
    // Label structs: `struct RouteLabel { route: String, }`, or with
    // several labels: `struct CheckLabel { worker: String, result: &'static str, }`.
    let label_re = Regex::new(r"struct (\w+Label) \{([^}]*)\}").unwrap();
    let field_name_re = Regex::new(r"(\w+):").unwrap();
    let labels: BTreeMap<String, Vec<String>> = label_re
        .captures_iter(&src)
        .map(|c| {
            let names = field_name_re
                .captures_iter(&c[2])
                .map(|f| f[1].to_string())
                .collect();
            (c[1].to_string(), names)
        })
        .collect();
    let reg_re =
        Regex::new(r#"registry\.register\(\s*"(\w+)",\s*"[^"]*",\s*m\.(\w+)\.clone\(\),?\s*\)"#)
            .unwrap();
    let mut out = BTreeMap::new();
    for c in reg_re.captures_iter(&src) {
        let (label, kind) = &fields[&c[2]];
        let label: BTreeSet<String> = label.iter().flat_map(|l| labels[l].clone()).collect();
        let name = &c[1];
        let series: Vec<(String, BTreeSet<String>)> = match kind.as_str() {
            "Counter" => vec![(format!("{name}_total"), label)],
            "Gauge" => vec![(name.to_string(), label)],
            "Histogram" => {
                let mut with_le = label.clone();
                with_le.insert("le".into());
                vec![
                    (format!("{name}_bucket"), with_le),
                    (format!("{name}_sum"), label.clone()),
                    (format!("{name}_count"), label),
                ]
            }
            k => panic!("metric kind {k}"),
        };
        out.extend(series);
    }
    assert!(out.len() >= 11, "parsed the registrations: {out:?}");
    out
}

#[test]
fn grafana_dashboard_queries_exported_metrics() {
    let metrics = exported_metrics();
    let dash: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/sglang-envoy-router.json"))
            .expect("dashboard is JSON");
    assert!(dash["title"].is_string() && dash["uid"].is_string());
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 30);
    let panels = dash["panels"].as_array().unwrap();
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "unique panel ids");

    let name_re = Regex::new(r"\bsgl_router_\w+").unwrap();
    let label_re = Regex::new(r"\bby \(([\w, ]+)\)").unwrap();
    let legend_re = Regex::new(r"\{\{(\w+)\}\}").unwrap();
    let mut used = BTreeSet::new();
    let mut exprs = 0;
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert!(p["datasource"]["uid"].is_string(), "{}", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            exprs += 1;
            let names: Vec<&str> = name_re.find_iter(expr).map(|m| m.as_str()).collect();
            assert!(!names.is_empty(), "{expr}");
            let labels: BTreeSet<String> = names
                .iter()
                .flat_map(|n| {
                    used.insert(n.to_string());
                    metrics
                        .get(*n)
                        .unwrap_or_else(|| panic!("{n} is not exported by metrics.rs"))
                        .clone()
                })
                .collect();
            let mut grouped: Vec<String> = label_re
                .captures_iter(expr)
                .flat_map(|c| {
                    c[1].split(',')
                        .map(|l| l.trim().to_string())
                        .collect::<Vec<_>>()
                })
                .collect();
            grouped.extend(
                legend_re
                    .captures_iter(t["legendFormat"].as_str().unwrap_or(""))
                    .map(|c| c[1].to_string()),
            );
            for l in grouped {
                assert!(
                    labels.contains(&l),
                    "label {l} is not on the metrics of {expr}"
                );
            }
        }
    }
    assert!(exprs > 10);
    // Every exported metric is on the dashboard (histograms via _bucket).
    for name in metrics.keys() {
        if name.ends_with("_sum") || name.ends_with("_count") {
            continue;
        }
        assert!(used.contains(name), "the dashboard does not show {name}");
    }
    assert!(read("README.md").contains("deploy/grafana/sglang-envoy-router.json"));
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
