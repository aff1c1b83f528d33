use std::net::SocketAddr;

use reqwest::Url;

/// Why a worker URL cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddressError {
    /// Not a URL at all.
    #[error("`{0}` is not a valid URL")]
    Invalid(String),
    /// Only plain http workers can be reached through Envoy's worker cluster.
    #[error("`{0}`: only http:// worker URLs are supported")]
    Scheme(String),
    /// A worker URL names a server, nothing more.
    #[error("`{0}`: a worker URL is scheme://host:port with no path, query or credentials")]
    Extra(String),
    /// The host name does not resolve.
    #[error("`{0}`: cannot resolve host: {1}")]
    Resolve(String, String),
}

/// A worker URL, normalised, with the socket address Envoy connects to.
///
/// Envoy's EDS endpoints must be IP addresses, so host names are resolved
/// once, when the worker is added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerAddress {
    /// `http://host:port`, without a trailing slash.
    pub url: String,
    /// The host as written in the URL.
    pub host: String,
    /// Where Envoy connects.
    pub endpoint: SocketAddr,
}

impl WorkerAddress {
    /// Normalises `raw` into `http://host:port` (port 80 when absent).
    pub fn normalise(raw: &str) -> Result<(String, String, u16), AddressError> {
        let url = Url::parse(raw.trim()).map_err(|_| AddressError::Invalid(raw.into()))?;
        if url.scheme() != "http" {
            return Err(AddressError::Scheme(raw.into()));
        }
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| AddressError::Invalid(raw.into()))?
            .to_string();
        if !url.username().is_empty()
            || url.password().is_some()
            || url.query().is_some()
            || url.fragment().is_some()
            || !matches!(url.path(), "" | "/")
        {
            return Err(AddressError::Extra(raw.into()));
        }
        let port = url.port_or_known_default().unwrap_or(80);
        Ok((format!("http://{host}:{port}"), host, port))
    }

    /// Normalises and resolves `raw`.
    pub async fn resolve(raw: &str) -> Result<WorkerAddress, AddressError> {
        let (url, host, port) = Self::normalise(raw)?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| AddressError::Resolve(raw.into(), e.to_string()))?
            .collect();
        let endpoint = addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or_else(|| addrs.first())
            .copied()
            .ok_or_else(|| AddressError::Resolve(raw.into(), "no addresses".into()))?;
        Ok(WorkerAddress {
            url,
            host,
            endpoint,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_urls() {
        assert_eq!(
            WorkerAddress::normalise("http://127.0.0.1:8000/")
                .unwrap()
                .0,
            "http://127.0.0.1:8000"
        );
        assert_eq!(
            WorkerAddress::normalise("http://worker").unwrap().0,
            "http://worker:80"
        );
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "worker:8000",
            "ftp://a:1",
            "https://a:1",
            "http://a:1/v1",
            "http://u:p@a:1",
            "http://a:1?x=1",
            "http://:1",
        ] {
            assert!(WorkerAddress::normalise(bad).is_err(), "{bad} accepted");
        }
    }

    #[tokio::test]
    async fn resolves_localhost() {
        let a = WorkerAddress::resolve("http://localhost:9").await.unwrap();
        assert!(a.endpoint.ip().is_loopback());
        assert_eq!(a.endpoint.port(), 9);
        assert_eq!(a.url, "http://localhost:9");
    }
}
