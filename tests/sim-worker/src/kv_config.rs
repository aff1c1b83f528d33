//! `--kv-events-config`: SGLang's JSON flag that turns on KV-event
//! publishing, and what `/server_info` says about it.
//!
//! Facts read in SGLang 0.5.23 (PyPI wheel): `KVEventsConfig` in
//! `srt/disaggregation/kv_events.py` (fields and defaults: `publisher`
//! `"null"`, `endpoint` `"tcp://*:5557"`, `bind` None, `replay_endpoint`
//! None, `buffer_steps` 10 000, `hwm` 100 000, `max_queue_size` 100 000,
//! `topic` `""`, `format` `"default"`; pydantic ignores unknown keys), the
//! port offset by DP rank in `ZmqEventPublisher.offset_endpoint_port`, the
//! bind-or-connect rule of `_socket_setup` (bind when `bind` is true, or
//! when unset and the host is a wildcard), and `describe_kv_events_publisher`
//! in `srt/runtime_context.py`, the `kv_events` object of `/server_info`.

use serde::Deserialize;
use serde_json::{json, Value};

/// A `--kv-events-config` the simulator cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvConfigError {
    /// Not JSON, or a field of the wrong type.
    #[error("--kv-events-config is not a valid KVEventsConfig: {0}")]
    Json(String),
    /// A publisher other than `zmq` or `null`.
    #[error("--kv-events-config publisher {0:?} is not simulated (use \"zmq\" or \"null\")")]
    Publisher(String),
    /// Not `tcp://HOST:PORT`.
    #[error("--kv-events-config {field} {endpoint:?} is not tcp://HOST:PORT")]
    Endpoint {
        /// `endpoint` or `replay_endpoint`.
        field: &'static str,
        /// The value given.
        endpoint: String,
    },
    /// A PUB socket SGLang would connect rather than bind.
    #[error(
        "--kv-events-config endpoint {0:?} would connect (SGLang binds only wildcard hosts \
         unless \"bind\": true); the simulator only binds: use tcp://*:PORT or \"bind\": true"
    )]
    ConnectStyle(String),
    /// `format` other than `default` or `dynamo`.
    #[error("--kv-events-config format {0:?} is unknown (\"default\" or \"dynamo\")")]
    Format(String),
}

/// A `tcp://HOST:PORT` endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpEndpoint {
    /// The host as written (`*`, `0.0.0.0`, `[::1]`, a name...).
    pub host: String,
    /// The base port (rank 0's); 0 lets rank 0 pick a free one.
    pub port: u16,
}

impl TcpEndpoint {
    fn parse(field: &'static str, s: &str) -> Result<TcpEndpoint, KvConfigError> {
        let bad = || KvConfigError::Endpoint {
            field,
            endpoint: s.to_string(),
        };
        let rest = s.strip_prefix("tcp://").ok_or_else(bad)?;
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        // A bare IPv6 address ("::1") is ambiguous; SGLang refuses it too.
        if host.is_empty() || (host.contains(':') && !host.starts_with('[')) {
            return Err(bad());
        }
        let port = port.parse().map_err(|_| bad())?;
        Ok(TcpEndpoint {
            host: host.to_string(),
            port,
        })
    }

    /// Whether SGLang's heuristic binds this host when `bind` is unset.
    fn is_wildcard(&self) -> bool {
        matches!(self.host.as_str(), "*" | "0.0.0.0" | "[::]")
    }

    /// The address the zeromq crate binds for port `port` (it does not
    /// know libzmq's `*`).
    pub fn bind_address(&self, port: u16) -> String {
        let host = match self.host.as_str() {
            "*" => "0.0.0.0",
            h => h,
        };
        format!("tcp://{host}:{port}")
    }
}

/// The JSON keys of SGLang's `KVEventsConfig`, as given.
#[derive(Debug, Deserialize)]
struct Raw {
    #[serde(default = "default_publisher")]
    publisher: String,
    #[serde(default = "default_endpoint")]
    endpoint: String,
    #[serde(default)]
    bind: Option<bool>,
    #[serde(default)]
    replay_endpoint: Option<String>,
    #[serde(default = "default_buffer_steps")]
    buffer_steps: usize,
    #[serde(default)]
    topic: String,
    #[serde(default = "default_format")]
    format: String,
    // `hwm` and `max_queue_size` are accepted (pydantic would type-check
    // them) but not simulated: the simulator never drops for back-pressure.
    #[serde(default)]
    #[allow(dead_code)]
    hwm: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    max_queue_size: Option<u64>,
}

fn default_publisher() -> String {
    "null".into()
}
fn default_endpoint() -> String {
    "tcp://*:5557".into()
}
fn default_buffer_steps() -> usize {
    10_000
}
fn default_format() -> String {
    "default".into()
}

/// A parsed `--kv-events-config` with `"publisher": "zmq"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// The flag's JSON as given (`/server_info` reports it as a string, as
    /// SGLang's server args do).
    pub raw: String,
    /// PUB endpoint of rank 0; rank `r` binds port + `r`.
    pub endpoint: TcpEndpoint,
    /// Replay ROUTER endpoint of rank 0, if any; rank `r` binds port + `r`.
    pub replay_endpoint: Option<TcpEndpoint>,
    /// Batches each rank keeps for replay.
    pub buffer_steps: usize,
    /// The first frame of every message.
    pub topic: String,
    /// `default` or `dynamo`: the same hashes for the requests the
    /// simulator serves (no LoRA, no cache salt, no extra key).
    pub format: String,
}

impl KvEventsConfig {
    /// Parses the flag's JSON. `Ok(None)` for `"publisher": "null"` (or no
    /// publisher), which publishes nothing, as in SGLang.
    pub fn parse(json: &str) -> Result<Option<KvEventsConfig>, KvConfigError> {
        let raw: Raw =
            serde_json::from_str(json).map_err(|e| KvConfigError::Json(e.to_string()))?;
        match raw.publisher.as_str() {
            "null" => return Ok(None),
            "zmq" => {}
            other => return Err(KvConfigError::Publisher(other.into())),
        }
        if raw.format != "default" && raw.format != "dynamo" {
            return Err(KvConfigError::Format(raw.format));
        }
        let endpoint = TcpEndpoint::parse("endpoint", &raw.endpoint)?;
        if !raw.bind.unwrap_or_else(|| endpoint.is_wildcard()) {
            return Err(KvConfigError::ConnectStyle(raw.endpoint));
        }
        let replay_endpoint = raw
            .replay_endpoint
            .as_deref()
            .map(|e| TcpEndpoint::parse("replay_endpoint", e))
            .transpose()?;
        Ok(Some(KvEventsConfig {
            raw: json.to_string(),
            endpoint,
            replay_endpoint,
            buffer_steps: raw.buffer_steps,
            topic: raw.topic,
            format: raw.format,
        }))
    }

    /// The `kv_events` object of `/server_info` (SGLang 0.5.23
    /// `describe_kv_events_publisher`), with the ports really bound (they
    /// differ from the flag's when it said port 0).
    pub fn descriptor(
        &self,
        pub_port: u16,
        replay_port: Option<u16>,
        block_size: usize,
        dp_size: usize,
    ) -> Value {
        let mut d = json!({
            "publisher": "zmq",
            "endpoint_host": self.endpoint.host,
            "endpoint_port_base": pub_port,
            "topic": self.topic,
            "block_size": block_size,
            "dp_size": dp_size,
        });
        if let (Some(port), Some(obj)) = (replay_port, d.as_object_mut()) {
            obj.insert("replay_endpoint_port_base".into(), json!(port));
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_fields_follow_sglang() {
        let c = KvEventsConfig::parse(r#"{"publisher":"zmq"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(
            c.endpoint,
            TcpEndpoint {
                host: "*".into(),
                port: 5557
            }
        );
        assert_eq!(c.replay_endpoint, None);
        assert_eq!(c.buffer_steps, 10_000);
        assert_eq!(c.topic, "");
        assert_eq!(c.endpoint.bind_address(5558), "tcp://0.0.0.0:5558");
        let c = KvEventsConfig::parse(
            r#"{"publisher":"zmq","endpoint":"tcp://127.0.0.1:7000","bind":true,
                "replay_endpoint":"tcp://*:7100","topic":"kv","buffer_steps":3,"hwm":5,"extra":1}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint.port, 7000);
        assert_eq!(c.replay_endpoint.as_ref().map(|e| e.port), Some(7100));
        assert_eq!((c.topic.as_str(), c.buffer_steps), ("kv", 3));
    }

    #[test]
    fn null_publisher_is_off_and_bad_configs_are_refused() {
        assert_eq!(KvEventsConfig::parse("{}"), Ok(None));
        assert_eq!(KvEventsConfig::parse(r#"{"publisher":"null"}"#), Ok(None));
        assert!(matches!(
            KvEventsConfig::parse(r#"{"publisher":"nats"}"#),
            Err(KvConfigError::Publisher(_))
        ));
        assert!(matches!(
            KvEventsConfig::parse("not json"),
            Err(KvConfigError::Json(_))
        ));
        assert!(matches!(
            KvEventsConfig::parse(r#"{"publisher":"zmq","endpoint":"tcp://10.0.0.1:5557"}"#),
            Err(KvConfigError::ConnectStyle(_))
        ));
        for bad in ["ipc:///tmp/x", "tcp://*", "tcp://::1:5557", "tcp://*:99999"] {
            let json = format!(r#"{{"publisher":"zmq","endpoint":"{bad}","bind":true}}"#);
            assert!(
                matches!(
                    KvEventsConfig::parse(&json),
                    Err(KvConfigError::Endpoint { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            KvEventsConfig::parse(r#"{"publisher":"zmq","format":"vllm"}"#),
            Err(KvConfigError::Format(_))
        ));
    }

    #[test]
    fn descriptor_has_sglangs_keys() {
        let c = KvEventsConfig::parse(r#"{"publisher":"zmq","replay_endpoint":"tcp://*:5558"}"#)
            .unwrap()
            .unwrap();
        let d = c.descriptor(5557, Some(5558), 16, 2);
        assert_eq!(
            d,
            json!({"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557,
                   "topic": "", "block_size": 16, "dp_size": 2,
                   "replay_endpoint_port_base": 5558})
        );
        assert!(c
            .descriptor(1, None, 1, 1)
            .get("replay_endpoint_port_base")
            .is_none());
    }
}
