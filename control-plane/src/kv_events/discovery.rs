//! Where a worker publishes its KV events.
//!
//! SGLang 0.5.23 (PyPI wheel, `sglang/srt/utils/common.py`
//! `build_server_info` and `sglang/srt/runtime_context.py`
//! `describe_kv_events_publisher`) puts a `kv_events` object in
//! `/server_info`, or `null` when no publisher is configured:
//! `{"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557,
//! "topic": "", "block_size": 16, "dp_size": 2,
//! "replay_endpoint_port_base": 5558}`, the last only when the replay
//! endpoint is TCP. Rank `r` publishes on `endpoint_port_base + r` (and
//! replays on `replay_endpoint_port_base + r`). `endpoint_host` is whatever
//! the publisher binds, often a wildcard (`*`, `0.0.0.0`, `::`), in which
//! case the worker URL's host is dialled instead.
//!
//! Flags (`--kv-events-endpoint-port`, `--kv-events-replay-endpoint-port`,
//! `--kv-events-topic`) override the advertised values field by field, and
//! the first lets workers that advertise nothing (older releases) be
//! subscribed too.

use crate::workers::{ask_server_info, DiscoveryError};
use serde::Deserialize;
use serde_json::Value;

/// A worker that claims more ranks than this is not believed: each rank
/// costs a socket and two tasks.
const MAX_RANKS: u32 = 1024;

/// Values given on the command line, applied over what workers advertise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--kv-events-endpoint-port`: rank 0's PUB port on every worker.
    pub endpoint_port: Option<u16>,
    /// `--kv-events-replay-endpoint-port`: rank 0's replay port.
    pub replay_endpoint_port: Option<u16>,
    /// `--kv-events-topic`: the SUB filter.
    pub topic: Option<String>,
}

/// Where one worker's publishers are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// Host to dial (IPv6 in brackets).
    pub host: String,
    /// Rank 0's PUB port.
    pub port_base: u16,
    /// Rank 0's replay ROUTER port, when there is one.
    pub replay_port_base: Option<u16>,
    /// SUB filter (a prefix of the topic frame).
    pub topic: String,
    /// Ranks to subscribe to.
    pub dp_size: u32,
    /// Tokens per block the worker hashes with, when advertised.
    pub block_size: Option<u32>,
}

fn port_of(base: u16, rank: u32) -> Option<u16> {
    u16::try_from(u32::from(base).checked_add(rank)?).ok()
}

impl Endpoints {
    /// Rank `rank`'s PUB endpoint; None if its port would pass 65535.
    pub fn pub_endpoint(&self, rank: u32) -> Option<String> {
        let port = port_of(self.port_base, rank)?;
        Some(format!("tcp://{}:{port}", self.host))
    }

    /// Rank `rank`'s replay endpoint, when known.
    pub fn replay_endpoint(&self, rank: u32) -> Option<String> {
        let port = port_of(self.replay_port_base?, rank)?;
        Some(format!("tcp://{}:{port}", self.host))
    }
}

/// The advertisement's fields this router reads (others are ignored).
#[derive(Debug, Deserialize)]
struct Advertised {
    #[serde(default)]
    publisher: Option<String>,
    #[serde(default)]
    endpoint_host: Option<String>,
    endpoint_port_base: u16,
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    block_size: Option<u32>,
    #[serde(default)]
    dp_size: Option<u32>,
    #[serde(default)]
    replay_endpoint_port_base: Option<u16>,
}

/// Whether a bound host is a wildcard that cannot be dialled.
fn is_wildcard(host: &str) -> bool {
    matches!(host, "" | "*" | "0.0.0.0" | "::" | "[::]")
}

/// A host as it goes between `tcp://` and `:port`: IPv6 bracketed.
fn dialable(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// The endpoints of the worker whose URL host is `worker_host`, from its
/// server info (None when it did not answer) and the flags. `fallback_dp`
/// is the DP size known otherwise (the registry's), used when neither the
/// advertisement nor the server info says. None: nothing to subscribe to.
pub fn resolve(
    info: Option<&Value>,
    worker_host: &str,
    fallback_dp: u32,
    overrides: &Overrides,
) -> Option<Endpoints> {
    let advertised = info
        .and_then(|i| i.get("kv_events"))
        .filter(|v| !v.is_null())
        .and_then(|v| serde_json::from_value::<Advertised>(v.clone()).ok())
        // Only the ZMQ publisher has sockets to dial.
        .filter(|a| a.publisher.as_deref().is_none_or(|p| p == "zmq"));
    let server_dp = info
        .and_then(|i| i.get("dp_size"))
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok());
    let port_base = overrides
        .endpoint_port
        .or(advertised.as_ref().map(|a| a.endpoint_port_base))?;
    let host = match advertised.as_ref().and_then(|a| a.endpoint_host.as_deref()) {
        Some(h) if !is_wildcard(h) && overrides.endpoint_port.is_none() => h.to_string(),
        _ => worker_host.to_string(),
    };
    let dp_size = advertised
        .as_ref()
        .and_then(|a| a.dp_size)
        .or(server_dp)
        .unwrap_or(fallback_dp)
        .clamp(1, MAX_RANKS);
    Some(Endpoints {
        host: dialable(&host),
        port_base,
        replay_port_base: overrides.replay_endpoint_port.or(advertised
            .as_ref()
            .and_then(|a| a.replay_endpoint_port_base)),
        topic: overrides
            .topic
            .clone()
            .or(advertised.as_ref().and_then(|a| a.topic.clone()))
            .unwrap_or_default(),
        dp_size,
        block_size: advertised.as_ref().and_then(|a| a.block_size),
    })
}

/// The worker's server info as JSON (the first path that answers JSON).
pub async fn fetch_server_info(
    client: &reqwest::Client,
    base_url: &str,
    timeout: std::time::Duration,
) -> Result<Value, DiscoveryError> {
    ask_server_info(client, base_url, timeout, |v| Some(v.clone())).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn info_0523() -> Value {
        json!({
            "dp_size": 2,
            "kv_events": {
                "publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557,
                "topic": "kv", "block_size": 16, "dp_size": 2,
                "replay_endpoint_port_base": 5558
            }
        })
    }

    #[test]
    fn wildcard_host_is_replaced_by_the_worker_host() {
        let e = resolve(Some(&info_0523()), "10.1.2.3", 1, &Overrides::default()).unwrap();
        assert_eq!(e.pub_endpoint(0).unwrap(), "tcp://10.1.2.3:5557");
        assert_eq!(e.pub_endpoint(1).unwrap(), "tcp://10.1.2.3:5558");
        assert_eq!(e.replay_endpoint(1).unwrap(), "tcp://10.1.2.3:5559");
        assert_eq!(
            (e.dp_size, e.topic.as_str(), e.block_size),
            (2, "kv", Some(16))
        );
        for wild in ["0.0.0.0", "::", "[::]"] {
            let mut i = info_0523();
            i["kv_events"]["endpoint_host"] = json!(wild);
            let e = resolve(Some(&i), "w.local", 1, &Overrides::default()).unwrap();
            assert_eq!(e.host, "w.local", "{wild}");
        }
    }

    #[test]
    fn concrete_host_is_kept_and_ipv6_worker_hosts_bracketed() {
        let mut i = info_0523();
        i["kv_events"]["endpoint_host"] = json!("192.168.0.9");
        let e = resolve(Some(&i), "w", 1, &Overrides::default()).unwrap();
        assert_eq!(e.host, "192.168.0.9");
        let e = resolve(Some(&info_0523()), "::1", 1, &Overrides::default()).unwrap();
        assert_eq!(e.pub_endpoint(0).unwrap(), "tcp://[::1]:5557");
    }

    #[test]
    fn nothing_advertised_means_nothing_unless_a_flag_names_a_port() {
        let null = json!({"kv_events": null, "dp_size": 4});
        assert_eq!(resolve(Some(&null), "w", 1, &Overrides::default()), None);
        assert_eq!(resolve(None, "w", 1, &Overrides::default()), None);
        assert_eq!(
            resolve(Some(&json!({})), "w", 1, &Overrides::default()),
            None
        );
        let flags = Overrides {
            endpoint_port: Some(6000),
            replay_endpoint_port: None,
            topic: None,
        };
        // The server's own dp_size is used when it answers...
        let e = resolve(Some(&null), "w", 1, &flags).unwrap();
        assert_eq!(
            (e.port_base, e.dp_size, e.replay_port_base),
            (6000, 4, None)
        );
        // ...else the registry's.
        assert_eq!(resolve(None, "w", 3, &flags).unwrap().dp_size, 3);
    }

    #[test]
    fn flags_override_field_by_field() {
        let flags = Overrides {
            endpoint_port: Some(7000),
            replay_endpoint_port: Some(7100),
            topic: Some("t".into()),
        };
        let e = resolve(Some(&info_0523()), "w", 1, &flags).unwrap();
        assert_eq!(e.pub_endpoint(0).unwrap(), "tcp://w:7000");
        assert_eq!(e.replay_endpoint(0).unwrap(), "tcp://w:7100");
        assert_eq!(e.topic, "t");
        let only_topic = Overrides {
            topic: Some("x".into()),
            ..Overrides::default()
        };
        let e = resolve(Some(&info_0523()), "w", 1, &only_topic).unwrap();
        assert_eq!((e.port_base, e.topic.as_str()), (5557, "x"));
    }

    #[test]
    fn hostile_answers_are_bounded() {
        let mut i = info_0523();
        i["kv_events"]["dp_size"] = json!(4_000_000_000u64);
        assert_eq!(
            resolve(Some(&i), "w", 1, &Overrides::default())
                .unwrap()
                .dp_size,
            MAX_RANKS
        );
        i["kv_events"]["dp_size"] = json!(0);
        assert_eq!(
            resolve(Some(&i), "w", 1, &Overrides::default())
                .unwrap()
                .dp_size,
            1
        );
        // A port past 65535 for a high rank is refused, not wrapped.
        i["kv_events"]["endpoint_port_base"] = json!(65535);
        let e = resolve(Some(&i), "w", 1, &Overrides::default()).unwrap();
        assert!(e.pub_endpoint(0).is_some() && e.pub_endpoint(1).is_none());
        // Another publisher kind, or a malformed object: nothing.
        i["kv_events"]["publisher"] = json!("null");
        assert_eq!(resolve(Some(&i), "w", 1, &Overrides::default()), None);
        let bad = json!({"kv_events": {"endpoint_port_base": "x"}});
        assert_eq!(resolve(Some(&bad), "w", 1, &Overrides::default()), None);
    }
}
