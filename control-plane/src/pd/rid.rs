use std::net::{Ipv4Addr, UdpSocket};

use sglang_envoy_body::Route;
use sglang_envoy_lifecycle::random;

/// Makes request ids in sglang-router's format: the route's prefix
/// (`chatcmpl-`, `cmpl-`, `gnt-`, `req-`), 24 random alphanumerics, then `-`
/// and this host's outward IP address, so ids from several routers differ
/// and name where they came from.
#[derive(Debug, Clone)]
pub struct RidSource {
    suffix: String,
}

impl Default for RidSource {
    fn default() -> Self {
        RidSource {
            suffix: outward_ip(),
        }
    }
}

impl RidSource {
    /// A source with a fixed host suffix.
    pub fn with_suffix(suffix: impl Into<String>) -> Self {
        RidSource {
            suffix: suffix.into(),
        }
    }

    /// A fresh id for a request on `route`.
    pub fn next(&self, route: Route) -> String {
        random::rid(route, &self.suffix, random::no_clock)
    }
}

/// The address this host uses to reach the outside world. Connecting a UDP
/// socket sends nothing; it only asks the kernel which source address a
/// packet would get. Without a route out, loopback.
fn outward_ip() -> String {
    UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|s| s.connect(("8.8.8.8", 80)).map(|_| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| Ipv4Addr::LOCALHOST.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_end_with_the_suffix() {
        let r = RidSource::with_suffix("10.0.0.7");
        let id = r.next(Route::ChatCompletions);
        assert!(
            id.starts_with("chatcmpl-") && id.ends_with("-10.0.0.7"),
            "{id}"
        );
    }
}
