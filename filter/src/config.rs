use serde::Deserialize;

/// The filter's plugin configuration (the JSON `configuration` of Envoy's wasm
/// filter). Every field has a default, so `{}` works.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    /// Envoy cluster of the control plane's gRPC port.
    pub control_plane_cluster: String,
    /// How long to wait for a routing decision before answering 503.
    pub route_timeout_ms: u64,
    /// Largest request body accepted; larger bodies get 413.
    pub max_body_bytes: usize,
    /// How often finished requests are reported to the control plane.
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
}

impl Default for FilterConfig {
    fn default() -> Self {
        FilterConfig {
            control_plane_cluster: "sglang_control_plane".into(),
            // Decisions take microseconds; a control plane that has not
            // answered in this long is treated as down (local fallback).
            route_timeout_ms: 500,
            // sglang-router's --max-payload-size default is 256 MiB; a wasm VM
            // per Envoy thread holding that much is not sensible, 32 MiB is
            // already far beyond any real prompt.
            max_body_bytes: 32 * 1024 * 1024,
            report_interval_ms: 20,
            endpoint_header: "x-gateway-destination-endpoint".into(),
            prefill_timeout_ms: 1_800_000,
            prefill_cluster: "sglang_prefill_workers".into(),
            workers_refresh_ms: 1000,
            fallback_max_age_ms: 300_000,
            fallback_retries: 2,
        }
    }
}

impl FilterConfig {
    /// Parses the plugin configuration; empty means all defaults.
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(FilterConfig::default());
        }
        serde_json::from_slice(bytes)
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
    }
}
