//! envoy/envoy.yaml: its placeholders, its one copy, what `envoy --mode
//! validate` says of it, and the paths it routes to workers.

use super::*;

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
    let Some((envoy, wasm)) = built_envoy_and_filter() else {
        eprintln!("skipping `envoy --mode validate`: Envoy or the filter is not built");
        return;
    };
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
