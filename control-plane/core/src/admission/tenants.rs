//! Who a request is for (smg's tenant), and the per-tenant request rate
//! (`--tenant-rate-limit-*`).
//!
//! A tenant is named as smg names it: `auth:<hex SHA-256 of the API key>`
//! for a request that passed `--api-key`, else `header:<value>` from the
//! tenant header when the operator trusts it (`--trust-tenant-header`),
//! else `ip:<client address>`, else `anonymous`. A client-chosen header
//! is never believed unless the operator says so: anyone can send one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

use parking_lot::Mutex;

use super::config::{RateLimitYaml, TenantRate};

/// What a front door learned about who sent a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sender<'a> {
    /// The SHA-256 of the API key the request passed `--api-key` with.
    pub authenticated: Option<&'a [u8; 32]>,
    /// The tenant header's value (empty when absent).
    pub header: &'a str,
    /// The client's address as Envoy saw it (empty when unknown).
    pub address: &'a str,
}

/// The tenant a request is counted under.
pub fn tenant_key(sender: Sender<'_>, trust_header: bool) -> String {
    if let Some(digest) = sender.authenticated {
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        return format!("auth:{hex}");
    }
    let header = sender.header.trim();
    if trust_header && !header.is_empty() {
        return format!("header:{header}");
    }
    match client_ip(sender.address) {
        Some(ip) => format!("ip:{ip}"),
        None => "anonymous".to_string(),
    }
}

/// The IP of `address` (`ip`, `ip:port` or `[v6]:port`), in its canonical
/// spelling so one client is one tenant.
fn client_ip(address: &str) -> Option<IpAddr> {
    let address = address.trim();
    if let Ok(ip) = address.parse::<IpAddr>() {
        return Some(ip);
    }
    address.parse::<std::net::SocketAddr>().ok().map(|s| s.ip())
}

/// One tenant's request bucket: `requests_per_minute` at most at once,
/// refilled continuously at that many per minute (smg's local backend).
struct Bucket {
    available: f64,
    capacity: f64,
    last: Instant,
}

impl Bucket {
    fn new(per_minute: u32) -> Bucket {
        Bucket {
            available: f64::from(per_minute),
            capacity: f64::from(per_minute),
            last: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.available = (self.available + elapsed * self.capacity / 60.0).min(self.capacity);
        self.last = now;
    }
}

/// The error type (smg's error code) of a tenant over its rate.
pub const TENANT_OVER_RATE: &str = "tenant_rate_limit_exceeded";

/// A tenant over its rate: retry in so many seconds (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Tenant rate limit exceeded for this request")]
pub struct OverRate {
    /// Seconds until the tenant's bucket holds a request again.
    pub retry_after_secs: u64,
}

/// The per-tenant request rates and their buckets.
pub struct RateLimiter {
    default: TenantRate,
    tenants: HashMap<String, TenantRate>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    /// Rates from a validated configuration.
    pub fn new(config: &RateLimitYaml) -> RateLimiter {
        RateLimiter {
            default: config.default_policy.clone(),
            tenants: config
                .tenants
                .iter()
                .filter_map(|t| Some((t.tenant_key.clone()?, t.clone())))
                .collect(),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request from `tenant`'s bucket, or says when it has one.
    pub fn take(&self, tenant: &str) -> Result<(), OverRate> {
        let rate = self.tenants.get(tenant).unwrap_or(&self.default);
        let mut buckets = self.buckets.lock();
        let bucket = buckets
            .entry(tenant.to_string())
            .or_insert_with(|| Bucket::new(rate.requests_per_minute));
        bucket.refill();
        if bucket.available >= 1.0 {
            bucket.available -= 1.0;
            return Ok(());
        }
        let per_sec = bucket.capacity / 60.0;
        let wait = if per_sec > 0.0 {
            ((1.0 - bucket.available) / per_sec).ceil()
        } else {
            60.0
        };
        Err(OverRate {
            retry_after_secs: (wait as u64).max(1),
        })
    }

    /// Forgets full buckets (a tenant idle for a minute is as if new), so
    /// one bucket per client address does not grow without end.
    pub fn reap(&self) {
        self.buckets.lock().retain(|_, b| {
            b.refill();
            b.available < b.capacity
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(default_rpm: u32, tenants: &[(&str, u32)]) -> RateLimiter {
        let rate = |key: Option<&str>, rpm| TenantRate {
            tenant_key: key.map(str::to_string),
            tokens_per_minute: 1_000_000,
            requests_per_minute: rpm,
            model_rules: Vec::new(),
        };
        RateLimiter::new(&RateLimitYaml {
            default_policy: rate(None, default_rpm),
            tenants: tenants.iter().map(|(k, r)| rate(Some(k), *r)).collect(),
        })
    }

    #[test]
    fn a_tenant_over_its_rate_does_not_touch_another() {
        let l = limiter(2, &[("header:big", 5)]);
        assert!(l.take("header:a").is_ok());
        assert!(l.take("header:a").is_ok());
        let over = l.take("header:a").unwrap_err();
        // One request per 30 s refills at 2 per minute.
        assert!((1..=30).contains(&over.retry_after_secs), "{over:?}");
        assert!(
            l.take("header:b").is_ok(),
            "another tenant has its own bucket"
        );
        for _ in 0..5 {
            assert!(
                l.take("header:big").is_ok(),
                "a listed tenant has its own rate"
            );
        }
        assert!(l.take("header:big").is_err());
    }

    #[test]
    fn the_tenant_is_the_key_then_a_trusted_header_then_the_address() {
        let digest = [0xab; 32];
        let all = Sender {
            authenticated: Some(&digest),
            header: "team-red",
            address: "10.0.0.7:5555",
        };
        assert_eq!(tenant_key(all, true), format!("auth:{}", "ab".repeat(32)));
        let unauthenticated = Sender {
            authenticated: None,
            ..all
        };
        assert_eq!(tenant_key(unauthenticated, true), "header:team-red");
        assert_eq!(
            tenant_key(unauthenticated, false),
            "ip:10.0.0.7",
            "an untrusted header is ignored"
        );
        let v6 = Sender {
            address: "[::1]:80",
            ..Sender::default()
        };
        assert_eq!(tenant_key(v6, false), "ip:::1");
        assert_eq!(tenant_key(Sender::default(), true), "anonymous");
    }
}
