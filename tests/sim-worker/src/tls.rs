//! HTTPS for the simulated worker, like an SGLang server behind TLS
//! (`--tls-cert`, `--tls-key`), optionally requiring a client certificate
//! signed by `--tls-client-ca` (mTLS). The bootstrap (`/kv`) server stays
//! plain HTTP.
//!
//! Handshakes run concurrently, off the accept loop, so a client that opens
//! a connection and never speaks TLS holds up nobody. Each one is counted in
//! `/_sim/stats` (`tls_handshakes` by the SNI the client sent, `""` for none;
//! `tls_handshake_failures`), so tests can see who reached the worker and
//! with which name.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use crate::stats::Stats;

/// Longest a client may take to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS flags of the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `--tls-cert`: the server certificate chain (PEM).
    pub cert: PathBuf,
    /// `--tls-key`: its private key (PEM).
    pub key: PathBuf,
    /// `--tls-client-ca`: require client certificates signed by this CA (PEM).
    pub client_ca: Option<PathBuf>,
}

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file is missing or not the PEM expected.
    #[error("{0}: {1}")]
    File(PathBuf, String),
    /// rustls refused the configuration (e.g. a key that does not match).
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::File(path.to_path_buf(), e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::File(
            path.to_path_buf(),
            "no PEM certificate in it".into(),
        ));
    }
    Ok(certs)
}

/// The rustls server configuration of `files` (ring, TLS 1.2 and 1.3).
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = |e: rustls::Error| TlsError::Config(e.to_string());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(config)?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert).map_err(config)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| TlsError::File(files.key.clone(), e.to_string()))?;
    let server = builder
        .with_single_cert(certificates(&files.cert)?, key)
        .map_err(config)?;
    Ok(Arc::new(server))
}

/// A listener for `axum::serve` that yields connections whose TLS handshake
/// has completed.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accepts on `tcp` and handshakes with `config`, counting handshakes
    /// in `stats`. Must run inside a tokio runtime.
    pub fn new(
        tcp: TcpListener,
        config: Arc<ServerConfig>,
        stats: Arc<Stats>,
    ) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        let accepting = tokio::spawn(async move {
            loop {
                let (mut stream, peer) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: wait, retry.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                crate::no_delay(&mut stream);
                let (acceptor, tx, stats) = (acceptor.clone(), tx.clone(), stats.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            stats.tls_handshake(tls.get_ref().1.server_name());
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            stats.tls_handshake_failed();
                            debug!(%peer, error = %e, "TLS handshake failed");
                        }
                        Err(_) => {
                            stats.tls_handshake_failed();
                            debug!(%peer, "TLS handshake timed out");
                        }
                    }
                });
            }
        });
        Ok(TlsListener {
            local,
            ready,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ended (only when aborted): nothing comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
