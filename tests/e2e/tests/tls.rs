//! TLS and mTLS to workers (sglang-router 0.3.2's `--ca-cert-paths`,
//! `--client-cert-path`, `--client-key-path`), through a real Envoy: the
//! control plane's health checks and PD prefill halves, and Envoy's own
//! connections, both verify the worker and present the client certificate.
//! And TLS to clients (`--tls-cert-path`, `--tls-key-path`), served by
//! Envoy's listener. Each test makes its own CA and certificates with rcgen.

use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use serde_json::{json, Value};
use sglang_envoy_e2e::{
    expect_openai_error, fresh_dir, wait_until, PdOptions, ScratchDir, SimWorker, Stack,
    StackOptions, WorkerTls,
};

/// A fresh CA, a worker certificate for `localhost` and `127.0.0.1`, and a
/// client certificate, written under `dir` with `tag` in their names.
fn make_pki(dir: &Path, tag: &str, require_client_cert: bool) -> WorkerTls {
    std::fs::create_dir_all(dir).expect("certificate directory");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("sglang-envoy test CA {tag}"));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
        .expect("CA certificate");

    let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &ca).expect("certificate");
        (cert.pem(), key.serialize_pem())
    };
    let (worker_pem, worker_key) = leaf(
        vec!["localhost".into(), "127.0.0.1".into()],
        "sim worker",
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_pem, client_key) = leaf(
        Vec::new(),
        "sglang-envoy router",
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let write = |name: &str, text: &str| {
        let path = dir.join(format!("{tag}-{name}"));
        std::fs::write(&path, text).expect("write a certificate file");
        path
    };
    WorkerTls {
        ca: write("ca.pem", &ca.pem()),
        cert: write("worker.pem", &worker_pem),
        key: write("worker.key", &worker_key),
        client_cert: write("client.pem", &client_pem),
        client_key: write("client.key", &client_key),
        require_client_cert,
    }
}

/// A directory for certificates made before the stack exists, removed
/// when the test passes.
fn cert_dir(test: &str) -> ScratchDir {
    fresh_dir(&format!("sglang-e2e-tls-{}-{test}", std::process::id())).expect("a directory")
}

fn chat(stream: bool) -> String {
    json!({
        "model": "m",
        "stream": stream,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello over TLS"}],
    })
    .to_string()
}

/// The `healthy` flag of `url` in the admin API's `GET /workers`.
async fn healthy(stack: &Stack, url: &str) -> Option<bool> {
    let v: Value = reqwest::get(stack.admin_url("/workers"))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    v["workers"].as_array()?.iter().find(|w| w["url"] == url)?["healthy"].as_bool()
}

/// Chat (plain and streamed) and `/generate` through Envoy all reach `w`.
async fn serves_everything(stack: &Stack, w: &SimWorker) {
    let before = w.served().await;
    let r = stack.post("/v1/chat/completions", &chat(false)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("chat answer is JSON");
    assert_eq!(v["object"], "chat.completion", "{v}");
    let r = stack.post("/generate", r#"{"text":"tls"}"#).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("generate answer is JSON");
    assert!(v["text"].is_string(), "{v}");
    let r = stack.post("/v1/chat/completions", &chat(true)).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("stream body");
    assert!(text.contains("data: {"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(
        w.served().await,
        before + 3,
        "the requests reached {}",
        w.url
    );
}

/// The workers' TLS handshakes by SNI (`""`: none sent) and failures.
async fn handshakes(w: &SimWorker) -> (Value, u64) {
    let stats = w.stats().await;
    (
        stats["tls_handshakes"].clone(),
        stats["tls_handshake_failures"].as_u64().unwrap_or(u64::MAX),
    )
}

/// An mTLS worker on the command line (`--worker-urls https://127.0.0.1:…`)
/// is health-checked healthy and serves chat, generate and streams through
/// Envoy, which presents the client certificate and sends no SNI to a
/// worker named by IP.
#[tokio::test]
async fn mtls_worker_serves_through_envoy() {
    let certs = cert_dir("mtls");
    let tls = make_pki(&certs, "mtls", true);
    let stack = Stack::start(StackOptions {
        workers: 1,
        worker_tls: Some(tls.clone()),
        cp_args: tls.cp_args(),
        ..Default::default()
    })
    .await
    .expect("the stack starts");
    let w = &stack.workers[0];
    assert!(w.url.starts_with("https://127.0.0.1:"), "{}", w.url);
    assert_eq!(healthy(&stack, &w.url).await, Some(true));
    serves_everything(&stack, w).await;
    let (by_sni, failures) = handshakes(w).await;
    assert_eq!(failures, 0, "every client presented the certificate");
    let names: Vec<&String> = by_sni.as_object().expect("handshakes").keys().collect();
    assert_eq!(names, [""], "no SNI for an IP address: {by_sni}");
}

/// Without `--ca-cert-paths` the system roots decide, as in the peer: a
/// worker with a private CA's certificate never becomes healthy, and
/// requests get the router's JSON 503.
#[tokio::test]
async fn without_ca_cert_paths_a_private_ca_worker_never_becomes_healthy() {
    let stack = Stack::start(StackOptions {
        workers: 0,
        ..Default::default()
    })
    .await
    .expect("the stack starts");
    let tls = make_pki(&stack.dir, "noca", false);
    let w = SimWorker::start_with(&stack.dir, &[], Some(&tls))
        .await
        .expect("TLS worker");
    let r = reqwest::Client::new()
        .post(stack.admin_url(&format!("/add_worker?url={}", w.url)))
        .send()
        .await
        .expect("admin API");
    assert_eq!(r.status(), 200, "an https URL is accepted");
    // Health checks run every second: wait for a few to be refused.
    assert!(
        wait_until(Duration::from_secs(10), || async {
            handshakes(&w).await.1 >= 3
        })
        .await,
        "fewer than 3 health checks reached the worker"
    );
    assert_eq!(healthy(&stack, &w.url).await, Some(false));
    let (_, failures) = handshakes(&w).await;
    assert!(failures > 0, "the control plane's checks were refused");
    let r = stack.post("/v1/chat/completions", &chat(false)).await;
    let message = expect_openai_error(r, 503).await;
    assert!(message.contains("no healthy workers"), "{message}");
    assert_eq!(w.served().await, 0);
}

/// An mTLS worker with `--ca-cert-paths` but no client certificate: the
/// control plane trusts it, it refuses the control plane, and it stays
/// unhealthy.
#[tokio::test]
async fn mtls_worker_without_a_client_certificate_stays_unhealthy() {
    let certs = cert_dir("nocert");
    let tls = make_pki(&certs, "nocert", true);
    let stack = Stack::start(StackOptions {
        workers: 0,
        cp_args: vec!["--ca-cert-paths".into(), tls.ca.display().to_string()],
        ..Default::default()
    })
    .await
    .expect("the stack starts");
    let w = SimWorker::start_with(&stack.dir, &[], Some(&tls))
        .await
        .expect("mTLS worker");
    let r = reqwest::Client::new()
        .post(stack.admin_url("/workers"))
        .json(&json!({ "url": w.url }))
        .send()
        .await
        .expect("admin API");
    // Accepted; it registers, and stays unhealthy.
    assert_eq!(r.status(), 202);
    assert!(
        wait_until(Duration::from_secs(10), || async {
            handshakes(&w).await.1 >= 3
        })
        .await,
        "fewer than 3 health checks reached the worker"
    );
    assert_eq!(healthy(&stack, &w.url).await, Some(false));
    let (_, failures) = handshakes(&w).await;
    assert!(
        failures > 0,
        "the worker refused clients without a certificate"
    );
    let r = stack.post("/generate", r#"{"text":"x"}"#).await;
    expect_openai_error(r, 503).await;
    assert_eq!(w.served().await, 0);
}

/// One plain and one TLS worker, the TLS one added at run time by DNS name
/// (`https://localhost:…`): both get requests; the DNS name is the SNI of
/// every connection to it (the control plane's and Envoy's). After a
/// control-plane restart the state file brings the TLS worker back.
#[tokio::test]
async fn mixed_fleet_routes_to_http_and_https_workers() {
    let certs = cert_dir("mixed");
    let tls = make_pki(&certs, "mixed", true);
    let mut stack = Stack::start(StackOptions {
        workers: 1,
        policy: "round_robin".into(),
        cp_args: tls.cp_args(),
        ..Default::default()
    })
    .await
    .expect("the stack starts");
    let w = SimWorker::start_with(&stack.dir, &[], Some(&tls))
        .await
        .expect("TLS worker");
    // The harness's own health check reached it by IP, without SNI.
    let (sni_before, _) = handshakes(&w).await;
    let port = w.url.rsplit(':').next().expect("port");
    let named = format!("https://localhost:{port}");
    let r = reqwest::Client::new()
        .post(stack.admin_url(&format!("/add_worker?url={named}")))
        .send()
        .await
        .expect("admin API");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    assert_eq!(healthy(&stack, &named).await, Some(true));

    for i in 0..8 {
        let r = stack
            .post("/generate", &format!(r#"{{"text":"mixed {i}"}}"#))
            .await;
        assert_eq!(r.status(), 200, "request {i}");
    }
    let (plain, secure) = (stack.workers[0].served().await, w.served().await);
    assert_eq!(plain + secure, 8);
    assert!(plain >= 2 && secure >= 2, "both served: {plain} / {secure}");
    let (by_sni, failures) = handshakes(&w).await;
    assert_eq!(failures, 0);
    // Since it was added by name, every connection (the control plane's
    // checks, Envoy's requests) named it: none more without SNI.
    assert_eq!(by_sni[""], sni_before[""], "{by_sni}");
    let named_handshakes = by_sni["localhost"].as_u64().unwrap_or(0);
    assert!(named_handshakes >= 2, "the URL's name is the SNI: {by_sni}");

    stack
        .restart_control_plane()
        .await
        .expect("control plane restarts");
    let back = wait_until(Duration::from_secs(10), || async {
        healthy(&stack, &named).await == Some(true)
    })
    .await;
    assert!(back, "the state file restores {named}");
    let before = w.served().await;
    let mut reached = false;
    for i in 0..6 {
        let r = stack
            .post("/generate", &format!(r#"{{"text":"after restart {i}"}}"#))
            .await;
        assert_eq!(r.status(), 200);
        reached |= w.served().await > before;
    }
    assert!(reached, "the restored TLS worker gets requests again");
}

/// PD with an https prefill and decode: the control plane sends the
/// prefill half itself over mTLS, Envoy the decode half; the KV bootstrap
/// stays plain.
#[tokio::test]
async fn pd_with_https_prefill_and_decode() {
    let certs = cert_dir("pd");
    let tls = make_pki(&certs, "pd", true);
    let stack = Stack::start(StackOptions {
        pd: Some(PdOptions::default()),
        worker_tls: Some(tls.clone()),
        cp_args: tls.cp_args(),
        ..Default::default()
    })
    .await
    .expect("the stack starts");
    let (prefill, decode) = (&stack.prefills[0], &stack.decodes[0]);
    assert!(prefill.url.starts_with("https://") && decode.url.starts_with("https://"));
    let r = stack.post("/generate", r#"{"text":"pd over tls"}"#).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("JSON");
    assert!(v["text"].is_string(), "{v}");
    let r = stack.post("/v1/chat/completions", &chat(true)).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("stream");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(prefill.served().await, 2, "prefill halves over mTLS");
    assert_eq!(decode.served().await, 2, "decode halves through Envoy");
    assert_eq!(prefill.stats().await["kv_fetched"], 2);
    for w in [prefill, decode] {
        assert_eq!(handshakes(w).await.1, 0, "{}", w.url);
    }
}

#[tokio::test]
async fn tls_cert_path_makes_envoys_listener_speak_tls() {
    let dir = cert_dir("listener");
    // The "worker" certificate names 127.0.0.1: here it is the listener's.
    let pki = make_pki(&dir, "listener", false);
    let stack = Stack::start(StackOptions {
        workers: 1,
        cp_args: vec![
            "--tls-cert-path".into(),
            pki.cert.display().to_string(),
            "--tls-key-path".into(),
            pki.key.display().to_string(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(stack.base.starts_with("https://"), "{}", stack.base);
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca).unwrap()).unwrap();
    let trusting = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .unwrap();
    let r = trusting
        .post(stack.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion", "{v}");
    // Not trusted without the CA, and no plaintext on the port.
    assert!(reqwest::get(stack.url("/health")).await.is_err());
    let plain = stack.url("/health").replacen("https://", "http://", 1);
    let r = reqwest::get(&plain).await;
    assert!(
        r.as_ref().map_or(true, |r| !r.status().is_success()),
        "plaintext was served: {r:?}"
    );
    // The control plane took the flags as answered by Envoy.
    assert!(stack
        .control_plane_log()
        .contains("--tls-cert-path (sglang-router's)"));
}
