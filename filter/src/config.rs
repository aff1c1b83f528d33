use serde::Deserialize;
use sglang_envoy_lifecycle::names;

/// The filter's plugin configuration (the JSON `configuration` of Envoy's wasm
/// filter). Every field has a default, so `{}` works.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    /// Envoy cluster of the control plane's gRPC port.
    pub control_plane_cluster: String,
    /// How long to wait for a routing decision before routing locally (or
    /// answering 503), plus as much again per 4 MiB of request body.
    pub route_timeout_ms: u64,
    /// Largest request body accepted; larger bodies get 413.
    pub max_body_bytes: usize,
    /// The root context's tick: it (re)opens the session stream, times out
    /// questions on it, and reports ends in a batch while it is down.
    pub report_interval_ms: u64,
    /// Header read by the worker cluster's `override_host` policy.
    pub endpoint_header: String,
    /// PD mode: longest wait for the prefill half before the client gets 503.
    pub prefill_timeout_ms: u64,
    /// Envoy cluster of the prefill workers (PD outage fallback only).
    pub prefill_cluster: String,
    /// How often the list of healthy workers is fetched for the fallback.
    pub workers_refresh_ms: u64,
    /// A worker list older than this is not used for the fallback.
    pub fallback_max_age_ms: u64,
    /// Endpoints after the locally chosen one that Envoy may retry on.
    pub fallback_retries: usize,
    /// Most bytes of request bodies this VM (one per Envoy worker thread)
    /// holds at once, from a body's first byte until its worker answers;
    /// a body that does not fit gets a JSON 503. At least `max_body_bytes`.
    pub max_buffered_bytes: usize,
    /// A request whose body makes no progress for this long gets 408.
    pub body_idle_timeout_ms: u64,
    /// The largest question (a PD or exact-cache question carries the
    /// body) asked on the session stream; a larger one takes a call of
    /// its own (`session::DEFAULT_QUESTION_MAX_BYTES` says why).
    pub session_question_max_bytes: usize,
    /// Hold an answer's last bytes until the control plane has counted the
    /// request's end (one round trip on the session stream), so a client
    /// that has its answer never finds its request in `/get_loads`.
    /// `false` reports the end without waiting (a little less latency and
    /// CPU; the count then lags the answer by up to a millisecond or so).
    pub exact_loads: bool,
    /// Tests only: a request carrying this header traps the VM, to prove
    /// that Envoy replaces a failed VM (`failure_policy: FAIL_RELOAD`).
    /// Never set in production.
    pub test_trap_header: Option<String>,
}

impl Default for FilterConfig {
    fn default() -> Self {
        FilterConfig {
            control_plane_cluster: "sglang_control_plane".into(),
            // Decisions take microseconds; a control plane that has not
            // answered in this long is treated as down (local fallback).
            route_timeout_ms: 500,
            max_body_bytes: names::DEFAULT_MAX_BODY_BYTES,
            report_interval_ms: 20,
            endpoint_header: names::ENDPOINT_HEADER.into(),
            prefill_timeout_ms: 1_800_000,
            prefill_cluster: names::PREFILL_CLUSTER.into(),
            workers_refresh_ms: 1000,
            fallback_max_age_ms: 300_000,
            fallback_retries: 2,
            // Eight bodies of the largest size. The VM's memory peaks at a
            // few copies of the one body being validated (the rest wait in
            // Envoy's buffers), so this bounds the bodies Envoy holds for
            // this thread more than the VM itself.
            max_buffered_bytes: 256 * 1024 * 1024,
            // Well under a client's patience, far over any pause between
            // the packets of a healthy upload.
            body_idle_timeout_ms: 4000,
            session_question_max_bytes: crate::session::DEFAULT_QUESTION_MAX_BYTES,
            exact_loads: true,
            test_trap_header: None,
        }
    }
}

impl FilterConfig {
    /// Parses the plugin configuration; empty means all defaults.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(FilterConfig::default());
        }
        let config: FilterConfig = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if config.max_buffered_bytes < config.max_body_bytes {
            return Err(format!(
                "max_buffered_bytes ({}) must be at least max_body_bytes ({})",
                config.max_buffered_bytes, config.max_body_bytes
            ));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_partial_configs_use_defaults() {
        let c = FilterConfig::parse(b"").unwrap();
        assert_eq!(c.control_plane_cluster, "sglang_control_plane");
        let c = FilterConfig::parse(br#"{"max_body_bytes": 10}"#).unwrap();
        assert_eq!(c.max_body_bytes, 10);
        assert_eq!(c.route_timeout_ms, 500);
        assert!(FilterConfig::parse(br#"{"max_body_byte": 10}"#).is_err());
        assert!(
            FilterConfig::parse(br#"{"max_body_bytes": 10, "max_buffered_bytes": 9}"#).is_err()
        );
        assert!(c.test_trap_header.is_none());
    }
}
