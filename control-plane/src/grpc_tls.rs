//! TLS on the gRPC port (`--secure-serving`), as InferencePool gateways
//! expect of an endpoint picker: they connect with TLS and, by default, do
//! not verify the certificate, so a self-signed one made at start serves;
//! `--cert-path` names a directory with `tls.crt` and `tls.key` (the layout
//! of a Kubernetes TLS secret) to serve a real one instead.

use std::path::{Path, PathBuf};

use tonic::transport::{Identity, ServerTlsConfig};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum GrpcTlsError {
    /// A certificate or key file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The self-signed certificate could not be made.
    #[error("cannot make a self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
}

/// The server's TLS settings: from `cert_dir` (`tls.crt`, `tls.key`), or a
/// certificate for `names` signed by itself when there is none.
pub fn server_config(
    cert_dir: Option<&Path>,
    names: Vec<String>,
) -> Result<ServerTlsConfig, GrpcTlsError> {
    let (cert, key) = match cert_dir {
        Some(dir) => (read(&dir.join("tls.crt"))?, read(&dir.join("tls.key"))?),
        None => {
            let made = rcgen::generate_simple_self_signed(names)?;
            (made.cert.pem(), made.signing_key.serialize_pem())
        }
    };
    Ok(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
}

fn read(path: &Path) -> Result<String, GrpcTlsError> {
    std::fs::read_to_string(path).map_err(|source| GrpcTlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_certificate_directory_is_an_error_naming_the_file() {
        let err = server_config(Some(Path::new("/no/such/dir")), vec![]).unwrap_err();
        assert!(err.to_string().contains("/no/such/dir/tls.crt"), "{err}");
    }

    #[test]
    fn without_files_a_self_signed_certificate_is_made() {
        assert!(server_config(None, vec!["localhost".into()]).is_ok());
    }
}
