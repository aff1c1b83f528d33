//! What the filter reads from Envoy on the lifecycle's behalf: the request
//! (body and headers, read from Envoy's buffers when needed rather than
//! copied), the facts about an answer, and the clock.

use std::borrow::Cow;
use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};
use sglang_envoy_lifecycle::{EndFacts, Source};

/// The request of the HTTP context host calls are made for, whose body
/// Envoy holds `body_bytes` of.
pub struct EnvoyRequest {
    /// Bytes of the body in Envoy's buffer.
    pub body_bytes: usize,
}

impl Source for EnvoyRequest {
    fn body_len(&self) -> usize {
        self.body_bytes
    }

    fn body(&self) -> Cow<'_, [u8]> {
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, self.body_bytes)
            .ok()
            .flatten()
            .unwrap_or_default();
        Cow::Owned(body)
    }

    fn headers(&self) -> Vec<(String, String)> {
        hostcalls::get_map(MapType::HttpRequestHeaders)
            .unwrap_or_default()
            .into_iter()
            .filter(|(name, _)| !name.starts_with(':'))
            .collect()
    }
}

/// What Envoy says about the current request's answer so far;
/// `duration_us` since its head.
pub fn end_facts(duration_us: u64) -> EndFacts {
    let number = |path: &[&str]| {
        property(path)
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map(|b| u64::from_le_bytes(b).min(u64::from(u32::MAX)) as u32)
    };
    let text = |path: &[&str]| property(path).and_then(|b| String::from_utf8(b).ok());
    EndFacts {
        http_status: number(&["response", "code"]),
        code_details: text(&["response", "code_details"]),
        upstream_host: text(&["upstream", "address"]).unwrap_or_default(),
        attempts: number(&["upstream", "request_attempt_count"]).unwrap_or(0),
        duration_us,
    }
}

fn property(path: &[&str]) -> Option<Vec<u8>> {
    hostcalls::get_property(path.to_vec()).ok().flatten()
}

/// The host's clock in nanoseconds since the epoch (0 if it has none): the
/// stand-in for randomness where the VM has no entropy source.
pub fn nanos() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64)
}
