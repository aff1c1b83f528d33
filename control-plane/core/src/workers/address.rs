use std::net::{IpAddr, SocketAddr};

use url::Url;

/// Why a worker URL cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddressError {
    /// Not a URL at all.
    #[error("`{0}` is not a valid URL")]
    Invalid(String),
    /// Workers speak HTTP, or HTTP over TLS.
    #[error("`{0}`: a worker URL is http://host:port or https://host:port")]
    Scheme(String),
    /// The port must be written out: guessing 80 hides typos.
    #[error(
        "`{0}`: a worker URL needs an explicit port, e.g. http://host:30000 or https://host:30000"
    )]
    NoPort(String),
    /// A worker URL names a server, nothing more.
    #[error("`{0}`: a worker URL is scheme://host:port with no path, query or credentials")]
    Extra(String),
    /// The host name does not resolve.
    #[error("`{0}`: cannot resolve host: {1}")]
    Resolve(String, String),
    /// The address is one no worker may have (see [`AddressPolicy`]).
    #[error("`{0}`: {1}")]
    Forbidden(String, &'static str),
}

/// Which resolved addresses may be workers. The admin API lets whoever holds
/// the token point the router at an address, and the control plane then
/// sends health checks and prefill requests there; these rules keep it from
/// being pointed at things that are never SGLang workers.
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    /// Allow link-local addresses (169.254.0.0/16, fe80::/10), where cloud
    /// metadata services live (`--allow-link-local-workers`).
    pub allow_link_local: bool,
    /// The control plane's own ports (admin, gRPC): refused on loopback and
    /// on `own_host`, so the router never routes to itself.
    pub own_ports: Vec<u16>,
    /// The address the control plane listens on.
    pub own_host: Option<IpAddr>,
}

impl AddressPolicy {
    /// Refuses `endpoint` (resolved from the URL `raw`) when no worker may
    /// live there.
    pub fn check(&self, raw: &str, endpoint: SocketAddr) -> Result<(), AddressError> {
        let ip = canonical_ip(endpoint.ip());
        let forbidden = |why| Err(AddressError::Forbidden(shorten(raw), why));
        if ip.is_unspecified() {
            return forbidden("0.0.0.0 and :: are not addresses a worker can be reached at");
        }
        if ip.is_multicast() || ip == IpAddr::from([255, 255, 255, 255]) {
            return forbidden("multicast and broadcast addresses are not workers");
        }
        if !self.allow_link_local && is_link_local(ip) {
            return forbidden(
                "link-local addresses (cloud metadata services live there) are refused; \
                 start the control plane with --allow-link-local-workers to allow them",
            );
        }
        let own_host = self.own_host.map(canonical_ip);
        if self.own_ports.contains(&endpoint.port())
            && (ip.is_loopback()
                || own_host == Some(ip)
                || own_host.is_some_and(|h| h.is_unspecified()))
        {
            return forbidden("that is the control plane's own port, not a worker");
        }
        Ok(())
    }
}

/// `ip` with IPv4-mapped IPv6 addresses written as IPv4.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The identity of a worker server: two URLs that reach the same socket
/// (`localhost` and `127.0.0.1`, `[::1]` and `127.0.0.1`) are one worker,
/// so it cannot be registered twice with two loads. The other 127.x.y.z
/// addresses are hosts of their own: servers bound to them are distinct
/// (the end-to-end tests stand pods up that way, one address each).
pub fn identity(endpoint: SocketAddr) -> (IpAddr, u16) {
    let ip = canonical_ip(endpoint.ip());
    let ip = if ip == IpAddr::from(std::net::Ipv6Addr::LOCALHOST) {
        IpAddr::from([127, 0, 0, 1])
    } else {
        ip
    };
    (ip, endpoint.port())
}

/// A worker URL, normalised, with the socket address Envoy connects to.
///
/// Envoy's EDS endpoints must be IP addresses, so host names are resolved
/// once, when the worker is added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerAddress {
    /// `http://host:port` or `https://host:port`, without a trailing slash.
    pub url: String,
    /// The host as written in the URL.
    pub host: String,
    /// Where Envoy connects.
    pub endpoint: SocketAddr,
    /// An `https://` worker: the control plane and Envoy talk TLS to it.
    pub tls: bool,
}

impl WorkerAddress {
    /// Normalises `raw` into `scheme://host:port` (the scheme `http` or
    /// `https`, the port written out).
    pub fn normalise(raw: &str) -> Result<(String, String, u16), AddressError> {
        if raw.len() > MAX_URL_LEN || raw.chars().any(char::is_control) {
            return Err(AddressError::Invalid(shorten(raw)));
        }
        let url = Url::parse(raw.trim()).map_err(|_| AddressError::Invalid(raw.into()))?;
        let scheme = url.scheme();
        if scheme != "http" && scheme != "https" {
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
        if !has_explicit_port(raw.trim()) {
            return Err(AddressError::NoPort(raw.into()));
        }
        let port = url
            .port_or_known_default()
            .ok_or_else(|| AddressError::NoPort(raw.into()))?;
        if port == 0 {
            return Err(AddressError::Invalid(raw.into()));
        }
        Ok((format!("{scheme}://{host}:{port}"), host, port))
    }

    /// Normalises and resolves `raw`.
    pub async fn resolve(raw: &str) -> Result<WorkerAddress, AddressError> {
        Self::resolve_keeping(raw, None).await
    }

    /// Normalises and resolves `raw`, keeping the address `keep` while the
    /// name still resolves to it among others: a name with several
    /// addresses, returned in a changing order, must not make its worker
    /// flap between them.
    pub async fn resolve_keeping(
        raw: &str,
        keep: Option<SocketAddr>,
    ) -> Result<WorkerAddress, AddressError> {
        let (url, host, port) = Self::normalise(raw)?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| AddressError::Resolve(raw.into(), e.to_string()))?
            .collect();
        let endpoint = keep
            .filter(|k| addrs.contains(k))
            .or_else(|| addrs.iter().find(|a| a.is_ipv4()).copied())
            .or_else(|| addrs.first().copied())
            .ok_or_else(|| AddressError::Resolve(raw.into(), "no addresses".into()))?;
        Ok(WorkerAddress {
            tls: url.starts_with("https://"),
            url,
            host,
            endpoint,
        })
    }

    /// The host when it is a DNS name, `None` for an IP address: TLS sends
    /// a name as SNI and checks it against the certificate's DNS names,
    /// while an IP address is never sent (SNI has no form for it).
    pub fn dns_name(&self) -> Option<&str> {
        let bare = self.host.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<IpAddr>()
            .is_err()
            .then_some(self.host.as_str())
    }
}

impl From<SocketAddr> for WorkerAddress {
    /// A worker named by its IP address: `http://ip:port`, nothing to resolve.
    fn from(endpoint: SocketAddr) -> Self {
        let host = match endpoint {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        };
        WorkerAddress {
            url: format!("http://{endpoint}"),
            host,
            endpoint,
            tls: false,
        }
    }
}

/// Longest worker URL accepted; anything longer is not a worker address.
const MAX_URL_LEN: usize = 512;

fn shorten(raw: &str) -> String {
    raw.chars().take(64).filter(|c| !c.is_control()).collect()
}

/// True when the URL's authority names a port (`host:port`, `[v6]:port`);
/// `Url::port` cannot tell, as it hides a written default port.
fn has_explicit_port(raw: &str) -> bool {
    let Some((_, rest)) = raw.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let after_host = match authority.rfind(']') {
        Some(i) => &authority[i + 1..],
        None => authority,
    };
    after_host
        .rsplit_once(':')
        .is_some_and(|(_, port)| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_socket_address_matches_the_normalised_url() {
        for raw in ["http://127.0.0.1:8000", "http://[::1]:8000"] {
            let (url, host, port) = WorkerAddress::normalise(raw).unwrap();
            let endpoint: SocketAddr = raw.trim_start_matches("http://").parse().unwrap();
            let a = WorkerAddress::from(endpoint);
            assert_eq!((a.url, a.host, a.endpoint.port()), (url, host, port));
        }
    }

    #[test]
    fn normalises_urls() {
        assert_eq!(
            WorkerAddress::normalise("http://127.0.0.1:8000/")
                .unwrap()
                .0,
            "http://127.0.0.1:8000"
        );
        assert_eq!(
            WorkerAddress::normalise("http://worker:80").unwrap().0,
            "http://worker:80"
        );
        assert_eq!(
            WorkerAddress::normalise("http://[::1]:9").unwrap().0,
            "http://[::1]:9"
        );
    }

    #[test]
    fn https_workers_keep_their_scheme() {
        assert_eq!(
            WorkerAddress::normalise("https://10.0.0.5:30000/").unwrap(),
            (
                "https://10.0.0.5:30000".to_string(),
                "10.0.0.5".to_string(),
                30000
            )
        );
        assert_eq!(
            WorkerAddress::normalise("HTTPS://Worker:443").unwrap().0,
            "https://worker:443"
        );
    }

    #[tokio::test]
    async fn https_workers_are_tls_and_know_their_dns_name() {
        let named = WorkerAddress::resolve("https://localhost:9").await.unwrap();
        assert!(named.tls);
        assert_eq!(named.url, "https://localhost:9");
        assert_eq!(named.dns_name(), Some("localhost"));
        let by_ip = WorkerAddress::resolve("https://127.0.0.1:9").await.unwrap();
        assert!(by_ip.tls);
        assert_eq!(by_ip.dns_name(), None);
        let v6 = WorkerAddress::resolve("https://[::1]:9").await.unwrap();
        assert_eq!(v6.dns_name(), None);
        let plain = WorkerAddress::resolve("http://localhost:9").await.unwrap();
        assert!(!plain.tls);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "worker:8000",
            "ftp://a:1",
            "https://a",
            "https://a:1/v1",
            "http://a:1/v1",
            "http://u:p@a:1",
            "http://a:1?x=1",
            "http://:1",
            "http://worker",
            "http://[::1]",
            "http://a:",
            "javascript:alert(1)",
            "http://a:1\n",
            "http://a:99999",
            "http://127.0.0.1:0",
        ] {
            assert!(WorkerAddress::normalise(bad).is_err(), "{bad} accepted");
        }
        let long = format!("http://{}:1", "a".repeat(600));
        assert!(WorkerAddress::normalise(&long).is_err());
    }

    #[test]
    fn policy_refuses_what_is_never_a_worker() {
        let policy = AddressPolicy {
            allow_link_local: false,
            own_ports: vec![30010, 30011],
            own_host: Some("127.0.0.1".parse().unwrap()),
        };
        let check = |a: &str| policy.check("u", a.parse().unwrap()).map_err(|_| ());
        for bad in [
            "0.0.0.0:8000",
            "[::]:8000",
            "169.254.169.254:80",
            "[fe80::1]:80",
            "[::ffff:169.254.169.254]:80",
            "224.0.0.1:80",
            "255.255.255.255:80",
            "127.0.0.1:30010",
            "127.0.0.2:30011",
            "[::1]:30011",
        ] {
            assert!(check(bad).is_err(), "{bad} accepted");
        }
        for good in [
            "127.0.0.1:8000",
            "10.0.0.5:30010",
            "[::1]:8000",
            "192.168.1.2:80",
        ] {
            assert!(check(good).is_ok(), "{good} refused");
        }
        let open = AddressPolicy {
            allow_link_local: true,
            ..policy
        };
        assert!(open
            .check("u", "169.254.169.254:80".parse().unwrap())
            .is_ok());
    }

    #[test]
    fn loopback_spellings_are_one_identity() {
        let id = |a: &str| identity(a.parse().unwrap());
        assert_eq!(id("127.0.0.1:8000"), id("[::1]:8000"));
        assert_eq!(id("127.0.0.1:8000"), id("[::ffff:127.0.0.1]:8000"));
        assert_eq!(id("10.0.0.1:8000"), id("[::ffff:10.0.0.1]:8000"));
        assert_ne!(id("127.0.0.1:8000"), id("127.0.0.1:8001"));
        assert_ne!(id("10.0.0.1:8000"), id("10.0.0.2:8000"));
        assert_ne!(id("127.0.0.2:8000"), id("127.0.0.3:8000"));
    }

    #[tokio::test]
    async fn resolves_localhost() {
        let a = WorkerAddress::resolve("http://localhost:9").await.unwrap();
        assert!(a.endpoint.ip().is_loopback());
        assert_eq!(a.endpoint.port(), 9);
        assert_eq!(a.url, "http://localhost:9");
    }
}
