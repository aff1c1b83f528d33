//! TLS to workers in the deployment files: the Envoy templates'
//! `transport_socket_matches`, envoy/render.sh's optional `WORKER_*`
//! placeholders, and the quick start deriving them from the control
//! plane's flags (one launch line for both). tests/deploy/ checks that compose,
//! `.env.example` and render.sh's loop carry every placeholder.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use regex::Regex;
use serde_yaml::Value;
use sglang_envoy_e2e::manifests::cluster;
use sglang_envoy_e2e::{built_envoy_and_filter, envoy_tls_env, filter_wasm, fresh_dir, ScratchDir};

const TEMPLATES: [&str; 2] = ["envoy/envoy.yaml", "envoy/envoy-ext-proc.yaml"];
const WORKER_CLUSTERS: [&str; 2] = ["sglang_workers", "sglang_prefill_workers"];

fn root() -> PathBuf {
    sglang_envoy_e2e::repo_root()
}

fn read(rel: &str) -> String {
    sglang_envoy_e2e::read_repo_file(rel)
}

/// A directory of `test`'s own for the files it writes, removed when it
/// passes.
fn scratch(test: &str) -> ScratchDir {
    fresh_dir(&format!("sglang-deploy-tls-{}-{test}", std::process::id())).unwrap()
}

/// A self-signed certificate and its key, as PEM files.
fn cert_files(dir: &Path, tag: &str) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (c, k) = (
        dir.join(format!("{tag}.pem")),
        dir.join(format!("{tag}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

/// Renders `template` with placeholder values and `tls` (the `WORKER_*`
/// variables); `Err(stderr)` when render.sh refuses.
fn render(dir: &Path, template: &str, tag: &str, tls: &[(&str, String)]) -> Result<Value, String> {
    let out = dir.join(format!("{tag}.yaml"));
    let mut cmd = Command::new("sh");
    cmd.arg(root().join("envoy/render.sh")).arg(&out);
    for (name, value) in sglang_envoy_e2e::manifests::LOCAL_ADDRESSES {
        cmd.env(name, value);
    }
    cmd.env("FILTER_WASM", filter_wasm())
        .env("ENVOY_TEMPLATE", root().join(template))
        .env_remove("WORKER_CA_CERTS")
        .env_remove("WORKER_CLIENT_CERT")
        .env_remove("WORKER_CLIENT_KEY");
    for (name, value) in tls {
        cmd.env(name, value);
    }
    let output = cmd.output().expect("run sh");
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(serde_yaml::from_str(&std::fs::read_to_string(&out).unwrap()).expect("YAML"))
}

/// The TLS socket of a worker cluster's `transport_socket_matches`.
fn tls_socket(bootstrap: &Value, name: &str) -> Value {
    let matches = cluster(bootstrap, name)["transport_socket_matches"]
        .as_sequence()
        .unwrap_or_else(|| panic!("{name} has transport_socket_matches"));
    assert_eq!(matches.len(), 1, "{name}");
    let m = &matches[0];
    // The control plane's EDS marks https workers with this metadata
    // (control-plane/src/xds.rs: TRANSPORT_SOCKET_MATCH, TLS_MATCH_KEY).
    assert_eq!(m["match"]["tls"], Value::Bool(true), "{name}");
    assert_eq!(
        m["transport_socket"]["name"].as_str(),
        Some("envoy.transport_sockets.tls")
    );
    m["transport_socket"]["typed_config"].clone()
}

#[test]
fn worker_clusters_talk_tls_to_https_endpoints_with_the_given_files() {
    let dir = scratch("full");
    let (ca, _) = cert_files(&dir, "ca");
    let (client, client_key) = cert_files(&dir, "client");
    let tls = envoy_tls_env(&[
        "--ca-cert-paths".into(),
        ca.display().to_string(),
        "--client-cert-path".into(),
        client.display().to_string(),
        "--client-key-path".into(),
        client_key.display().to_string(),
    ]);
    let mut sockets = Vec::new();
    for template in TEMPLATES {
        let b = render(&dir, template, "full", &tls).expect("render.sh with TLS files");
        for name in WORKER_CLUSTERS {
            let socket = tls_socket(&b, name);
            // SNI and SAN from the endpoint's host name (EDS sets it for
            // workers named by a DNS name).
            assert_eq!(socket["auto_host_sni"], Value::Bool(true));
            assert_eq!(socket["auto_sni_san_validation"], Value::Bool(true));
            let common = &socket["common_tls_context"];
            let identity = &common["tls_certificates"][0];
            assert_eq!(
                identity["certificate_chain"]["filename"].as_str(),
                client.to_str()
            );
            assert_eq!(
                identity["private_key"]["filename"].as_str(),
                client_key.to_str()
            );
            // The trusted bundle holds the given CA (then the system's roots).
            let bundle = common["validation_context"]["trusted_ca"]["filename"]
                .as_str()
                .expect("trusted_ca file")
                .to_string();
            let text = std::fs::read_to_string(&bundle).expect("bundle written");
            let ca_text = std::fs::read_to_string(&ca).unwrap();
            assert!(text.starts_with(ca_text.trim_end()), "{bundle}");
            // Plain endpoints keep the cluster's default (raw) socket.
            assert!(cluster(&b, name)["transport_socket"].is_null());
            sockets.push(socket);
        }
    }
    // The same TLS to every worker cluster, in both templates.
    assert!(sockets.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn without_tls_files_envoy_uses_the_system_roots_and_no_client_certificate() {
    let system = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if !system.exists() {
        eprintln!("skipped: no system CA bundle here");
        return;
    }
    let dir = scratch("plain");
    for template in TEMPLATES {
        let b = render(&dir, template, "plain", &envoy_tls_env(&[])).expect("render.sh");
        for name in WORKER_CLUSTERS {
            let common = &tls_socket(&b, name)["common_tls_context"];
            assert!(common["tls_certificates"].is_null(), "{template} {name}");
            assert_eq!(
                common["validation_context"]["trusted_ca"]["filename"].as_str(),
                system.to_str()
            );
        }
    }
}

#[test]
fn render_sh_refuses_half_an_identity_and_unreadable_files() {
    let dir = scratch("half");
    let (cert, _) = cert_files(&dir, "half");
    let half = [("WORKER_CLIENT_CERT", cert.display().to_string())];
    let err = render(&dir, TEMPLATES[0], "half", &half).unwrap_err();
    assert!(err.contains("must be set together"), "{err}");
    let missing = [("WORKER_CA_CERTS", "/nonexistent/ca.pem".to_string())];
    let err = render(&dir, TEMPLATES[0], "missing", &missing).unwrap_err();
    assert!(err.contains("cannot read /nonexistent/ca.pem"), "{err}");
}

/// scripts/lib.sh's `worker_tls_from_flags` (what the quick start runs on
/// its own arguments) and the e2e harness derive the same `WORKER_*` values
/// from the control plane's flags, and those are the template's TLS
/// placeholders.
#[test]
fn quickstart_configures_envoy_tls_from_the_control_plane_flags() {
    let placeholders: BTreeSet<String> = Regex::new(r"\{\{(WORKER_[A-Z_]+)\}\}")
        .unwrap()
        .captures_iter(&read("envoy/envoy.yaml"))
        .map(|c| c[1].to_string())
        .collect();
    let flags: Vec<String> = [
        "--policy",
        "round_robin",
        "--ca-cert-paths",
        "/a/ca1.pem",
        "/a/ca2.pem",
        "--worker-urls",
        "https://10.0.0.5:30001",
        "--client-cert-path",
        "/a/router.pem",
        "--client-key-path",
        "/a/router.key",
    ]
    .map(String::from)
    .to_vec();
    let harness: BTreeMap<String, String> = envoy_tls_env(&flags)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(
        harness.keys().cloned().collect::<BTreeSet<_>>(),
        placeholders
    );
    assert_eq!(harness["WORKER_CA_CERTS"], "/a/ca1.pem /a/ca2.pem");
    assert_eq!(harness["WORKER_CLIENT_CERT"], "/a/router.pem");
    assert_eq!(harness["WORKER_CLIENT_KEY"], "/a/router.key");

    let script = format!(
        "source '{}'; worker_tls_from_flags \"$@\"; env | grep '^WORKER_' | sort",
        root().join("scripts/lib.sh").display()
    );
    let out = Command::new("bash")
        .args(["-c", &script, "lib"])
        .args(&flags)
        .output()
        .expect("bash");
    assert!(out.status.success());
    let lib: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(lib, harness);

    // The quick start runs it on its own arguments before rendering.
    let qs = read("scripts/quickstart.sh");
    let derive = qs
        .find("worker_tls_from_flags \"$@\"")
        .expect("quickstart.sh derives the TLS placeholders from its flags");
    let render_at = qs
        .find("\nrender_envoy_config ")
        .expect("quickstart.sh renders");
    assert!(derive < render_at);
}

/// Envoy itself accepts the rendered TLS configuration (when it and the
/// filter are built).
#[test]
fn rendered_tls_configuration_is_valid_for_envoy() {
    let Some((envoy, _)) = built_envoy_and_filter() else {
        eprintln!("skipped: Envoy or the filter is not built");
        return;
    };
    let dir = scratch("valid");
    let (ca, _) = cert_files(&dir, "valid-ca");
    let (client, key) = cert_files(&dir, "valid-client");
    let tls = [
        ("WORKER_CA_CERTS", ca.display().to_string()),
        ("WORKER_CLIENT_CERT", client.display().to_string()),
        ("WORKER_CLIENT_KEY", key.display().to_string()),
    ];
    for template in TEMPLATES {
        render(&dir, template, "valid", &tls).expect("render.sh");
        let out = Command::new(&envoy)
            .args(["--mode", "validate", "-c"])
            .arg(dir.join("valid.yaml"))
            .output()
            .expect("run envoy");
        assert!(
            out.status.success(),
            "{template}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
