//! docker-compose.yml and .env.example against the quick start: the
//! services, their profiles (demo, ha) and `docker-compose config`.

use super::dockerfile::{dockerfile, instruction, json_list};
use super::*;

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
