use std::net::{Ipv4Addr, UdpSocket};

use rand::distr::{Alphanumeric, SampleString};
use sglang_envoy_body::Route;

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
        let random = Alphanumeric.sample_string(&mut rand::rng(), 24);
        format!("{}{random}-{}", route.rid_prefix(), self.suffix)
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
    fn ids_have_prefix_24_alphanumerics_and_suffix() {
        let r = RidSource::with_suffix("10.0.0.7");
        let a = r.next(Route::ChatCompletions);
        let rest = a.strip_prefix("chatcmpl-").unwrap();
        let (random, suffix) = rest.split_once('-').unwrap();
        assert_eq!(random.len(), 24);
        assert!(random.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_eq!(suffix, "10.0.0.7");
        assert_ne!(a, r.next(Route::ChatCompletions));
        assert!(r.next(Route::Generate).starts_with("gnt-"));
        assert!(r.next(Route::Completions).starts_with("cmpl-"));
        assert!(r.next(Route::Embeddings).starts_with("req-"));
    }
}
