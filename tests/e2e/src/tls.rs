//! TLS workers in the end-to-end tests: the files a simulated worker serves
//! HTTPS with, the client the harness reaches such a worker with directly,
//! and how the control plane's TLS flags become Envoy's (the quick start's
//! rule: one launch line configures both).

use std::path::PathBuf;

/// The certificate files of a TLS worker and of its clients (a test makes
/// them, e.g. with rcgen, in its stack's directory).
#[derive(Debug, Clone)]
pub struct WorkerTls {
    /// The CA (PEM) that signed the worker's and the client's certificates.
    pub ca: PathBuf,
    /// The worker's certificate (PEM).
    pub cert: PathBuf,
    /// The worker's private key (PEM).
    pub key: PathBuf,
    /// A client certificate signed by `ca` (PEM).
    pub client_cert: PathBuf,
    /// Its private key (PEM).
    pub client_key: PathBuf,
    /// The worker requires a client certificate signed by `ca` (mTLS).
    pub require_client_cert: bool,
}

impl WorkerTls {
    /// The simulated worker's flags: HTTPS with `cert`, and mTLS against
    /// `ca` when `require_client_cert`.
    pub fn worker_args(&self) -> Vec<String> {
        let mut args = vec![
            "--tls-cert".to_string(),
            self.cert.display().to_string(),
            "--tls-key".into(),
            self.key.display().to_string(),
        ];
        if self.require_client_cert {
            args.push("--tls-client-ca".into());
            args.push(self.ca.display().to_string());
        }
        args
    }

    /// The control plane's flags trusting `ca` and presenting the client
    /// certificate.
    pub fn cp_args(&self) -> Vec<String> {
        vec![
            "--ca-cert-paths".to_string(),
            self.ca.display().to_string(),
            "--client-cert-path".into(),
            self.client_cert.display().to_string(),
            "--client-key-path".into(),
            self.client_key.display().to_string(),
        ]
    }

    /// A client that trusts `ca` and presents the client certificate: what
    /// the harness reaches the worker's `/_sim` switches with.
    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&self.ca)?)?;
        let mut identity = std::fs::read(&self.client_cert)?;
        identity.push(b'\n');
        identity.extend(std::fs::read(&self.client_key)?);
        Ok(reqwest::Client::builder()
            .add_root_certificate(ca)
            .identity(reqwest::Identity::from_pem(&identity)?)
            .build()?)
    }
}

/// The Envoy template's TLS placeholders (envoy/render.sh) from the
/// control plane's TLS flags, as scripts/lib.sh's `worker_tls_from_flags`
/// derives them: `--ca-cert-paths A [B...]` -> `WORKER_CA_CERTS`,
/// `--client-cert-path` -> `WORKER_CLIENT_CERT`, `--client-key-path` ->
/// `WORKER_CLIENT_KEY`. Every name is present (empty when the flag is not).
pub fn envoy_tls_env(cp_args: &[String]) -> Vec<(&'static str, String)> {
    let (mut cas, mut cert, mut key) = (Vec::new(), String::new(), String::new());
    let mut in_cas = false;
    let mut args = cp_args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--ca-cert-paths" => in_cas = true,
            "--client-cert-path" => {
                in_cas = false;
                cert = args.next().cloned().unwrap_or_default();
            }
            "--client-key-path" => {
                in_cas = false;
                key = args.next().cloned().unwrap_or_default();
            }
            flag if flag.starts_with("--") => in_cas = false,
            value if in_cas => cas.push(value.to_string()),
            _ => {}
        }
    }
    vec![
        ("WORKER_CA_CERTS", cas.join(" ")),
        ("WORKER_CLIENT_CERT", cert),
        ("WORKER_CLIENT_KEY", key),
    ]
}
