//! The one HTTP client the control plane talks to workers with: health
//! checks, `/get_server_info` discovery and the PD prefill halves all share
//! it, so every call to a worker verifies the same roots and presents the
//! same client certificate (sglang-router 0.3.2's `--client-cert-path`,
//! `--client-key-path` and `--ca-cert-paths`), and shares one connection pool.
//!
//! Certificates are verified against the system's root store plus the
//! `--ca-cert-paths` certificates, as the peer does: without
//! `--ca-cert-paths`, a worker with a self-signed or private-CA certificate
//! fails its TLS handshake and so never becomes healthy. Hostnames are
//! checked as any HTTPS client does: a worker named by a DNS name must have
//! that name among its certificate's DNS names (and gets it as SNI), one
//! named by an IP address must have that IP among its IP addresses.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a connection to a worker may take to open, whatever the
/// request's own timeout (sglang-router's client uses the same).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Keepalive probes on idle connections to workers, so a vanished worker's
/// pooled connection is noticed.
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// Why the client for workers could not be built from the TLS flags.
#[derive(Debug, thiserror::Error)]
pub enum WorkerClientError {
    /// A certificate or key file could not be read.
    #[error("cannot read {flag} {path}: {source}")]
    Read {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A `--ca-cert-paths` file holds no usable certificate.
    #[error("--ca-cert-paths {0}: no PEM certificate in it")]
    NoCertificate(PathBuf),
    /// The client certificate and key do not make an identity.
    #[error("--client-cert-path/--client-key-path: not a PEM certificate and private key: {0}")]
    Identity(String),
    /// Only one of the certificate and the key was given.
    #[error("Both --client-cert-path and --client-key-path must be specified together")]
    HalfIdentity,
    /// `--api-key` cannot be sent in a header.
    #[error("--api-key must be printable ASCII")]
    ApiKey,
    /// The TLS configuration was refused.
    #[error("cannot build the HTTP client for workers: {0}")]
    Build(String),
}

/// The TLS flags for connections to workers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerTls {
    /// `--client-cert-path`: the certificate (PEM, chain allowed) presented
    /// to workers that ask for one (mTLS).
    pub client_cert: Option<PathBuf>,
    /// `--client-key-path`: its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub client_key: Option<PathBuf>,
    /// `--ca-cert-paths`: more roots to verify workers' certificates with
    /// (PEM, several certificates per file allowed), on top of the
    /// system's.
    pub ca_certs: Vec<PathBuf>,
}

/// Builds the client for workers: plain HTTP to `http://` workers, TLS
/// (verified, with the client certificate when one is configured) to
/// `https://` ones. Reads the files now, so a bad path fails the startup
/// rather than every health check. Callers set each request's timeout.
/// With `api_key` (`--api-key`), every call carries
/// `Authorization: Bearer <key>` unless the request sets its own (a PD
/// prefill half carries the client's).
pub fn worker_client(
    tls: &WorkerTls,
    api_key: Option<&str>,
) -> Result<reqwest::Client, WorkerClientError> {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_keepalive(TCP_KEEPALIVE);
    if let Some(key) = api_key {
        let mut value = reqwest::header::HeaderValue::try_from(format!("Bearer {key}"))
            .map_err(|_| WorkerClientError::ApiKey)?;
        value.set_sensitive(true);
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, value);
        builder = builder.default_headers(headers);
    }
    for path in &tls.ca_certs {
        let pem = read(path, "--ca-cert-paths")?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|_| WorkerClientError::NoCertificate(path.clone()))?;
        if certs.is_empty() {
            return Err(WorkerClientError::NoCertificate(path.clone()));
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => {
            // reqwest takes the certificate and the key as one PEM document.
            let mut pem = read(cert, "--client-cert-path")?;
            pem.push(b'\n');
            pem.extend(read(key, "--client-key-path")?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| WorkerClientError::Identity(error_chain(&e)))?;
            builder = builder.identity(identity);
        }
        (None, None) => {}
        _ => return Err(WorkerClientError::HalfIdentity),
    }
    builder
        .build()
        .map_err(|e| WorkerClientError::Build(error_chain(&e)))
}

fn read(path: &Path, flag: &'static str) -> Result<Vec<u8>, WorkerClientError> {
    std::fs::read(path).map_err(|source| WorkerClientError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

/// An error with its causes, `a: b: c`: reqwest's own message ("error
/// sending request") hides the reason a worker failed (refused connection,
/// unknown CA, certificate required...), which is in its sources.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let next = e.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, text: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("sglang-envoy-client-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn without_tls_flags_the_client_builds() {
        assert!(worker_client(&WorkerTls::default(), None).is_ok());
        assert!(worker_client(&WorkerTls::default(), Some("sk-1")).is_ok());
        assert!(matches!(
            worker_client(&WorkerTls::default(), Some("bad\nkey")),
            Err(WorkerClientError::ApiKey)
        ));
    }

    #[test]
    fn half_an_identity_is_refused() {
        let cert = temp("half-cert.pem", "x");
        let err = worker_client(
            &WorkerTls {
                client_cert: Some(cert),
                ..Default::default()
            },
            None,
        )
        .unwrap_err();
        assert!(matches!(err, WorkerClientError::HalfIdentity), "{err}");
    }

    #[test]
    fn unreadable_and_empty_files_are_named() {
        let missing = PathBuf::from("/nonexistent/ca.pem");
        let err = worker_client(
            &WorkerTls {
                ca_certs: vec![missing],
                ..Default::default()
            },
            None,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read --ca-cert-paths /nonexistent/ca.pem"),
            "{err}"
        );
        let junk = temp("junk-ca.pem", "not a certificate\n");
        let err = worker_client(
            &WorkerTls {
                ca_certs: vec![junk.clone()],
                ..Default::default()
            },
            None,
        )
        .unwrap_err();
        assert!(matches!(err, WorkerClientError::NoCertificate(p) if p == junk));
        let (cert, key) = (temp("junk-cert.pem", "x"), temp("junk-key.pem", "y"));
        let err = worker_client(
            &WorkerTls {
                client_cert: Some(cert),
                client_key: Some(key),
                ..Default::default()
            },
            None,
        )
        .unwrap_err();
        assert!(matches!(err, WorkerClientError::Identity(_)), "{err}");
    }

    #[derive(Debug)]
    struct Sending(std::io::Error);

    impl std::fmt::Display for Sending {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("error sending request")
        }
    }

    impl std::error::Error for Sending {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn error_chain_shows_the_causes() {
        let e = Sending(std::io::Error::other(
            "invalid peer certificate: UnknownIssuer",
        ));
        assert_eq!(
            error_chain(&e),
            "error sending request: invalid peer certificate: UnknownIssuer"
        );
    }
}
