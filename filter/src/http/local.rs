//! Routing without the control plane (its outage): a recently healthy
//! worker in turn, and in PD mode the prefill half sent by the filter itself
//! through Envoy's prefill cluster, with bootstrap fields it builds.

use std::time::Duration;

use log::warn;
use proxy_wasm::traits::{Context, HttpContext};
use sglang_envoy_body::pd::{as_pairs, pd_fields, wants_input_logprobs, Bootstrap, Unit};
use sglang_envoy_body::{prefill_input_logprobs, RequestBody, Route};
use sglang_envoy_proto::{PrefillEndpoint, PrefillOutcome};

use super::{Prefill, Request};
use crate::fallback::Profiles;

impl Request {
    /// The control plane did not answer: sends the request to a recently
    /// healthy worker in turn. The completion is still reported (the
    /// control plane may have counted the request before it went silent).
    /// Returns false when there is nothing to fall back on.
    pub(super) fn route_locally(&mut self) -> bool {
        let now = self.get_current_time();
        let max_age = Duration::from_millis(self.config.fallback_max_age_ms);
        let Some(choice) = self
            .fallback
            .choose(now, max_age, self.config.fallback_retries)
        else {
            return false;
        };
        if let Some(prefill) = &choice.prefill {
            if let Err(e) = self.send_prefill_locally(prefill, choice.profiles) {
                warn!("local PD fallback impossible: {e}");
                return false;
            }
        }
        let endpoints = choice.endpoints.join(",");
        warn!(
            "control plane unavailable; {} -> {endpoints} (local fallback)",
            self.path
        );
        self.set_http_request_header(&self.config.endpoint_header, Some(&endpoints));
        true
    }

    /// PD mode without the control plane: writes the bootstrap fields into
    /// both halves itself (each in its worker's wire profile, with no DP
    /// rank: the workers pick theirs from the room), sends the prefill half
    /// to `prefill` through Envoy's prefill cluster, and leaves the decode
    /// half in the request.
    pub(super) fn send_prefill_locally(
        &mut self,
        prefill: &PrefillEndpoint,
        profiles: Profiles,
    ) -> Result<(), String> {
        let Some(route) = self.route else {
            return Ok(()); // info GETs need no prefill
        };
        let body = self
            .get_http_request_body(0, self.body_bytes)
            .unwrap_or_default();
        let parsed = RequestBody::parse(&body).map_err(|e| e.to_string())?;
        let bootstrap = Bootstrap {
            host: &prefill.host,
            port: u16::try_from(prefill.bootstrap_port)
                .ok()
                .filter(|p| *p > 0),
            prefill: Unit {
                profile: profiles.prefill,
                ..Unit::default()
            },
            decode: Unit {
                profile: profiles.serving,
                ..Unit::default()
            },
        };
        let fields = pd_fields(route, &parsed, &bootstrap, || local_rid(route), random_u64);
        let prefill_body = parsed
            .with_fields(&as_pairs(&fields.prefill))
            .map_err(|e| e.to_string())?;
        let decode_body = parsed
            .with_fields(&as_pairs(&fields.decode))
            .map_err(|e| e.to_string())?;
        let client_headers = self.get_http_request_headers();
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", &self.path),
            (":authority", &prefill.endpoint),
            ("content-type", "application/json"),
            (&self.config.endpoint_header, &prefill.endpoint),
        ];
        headers.extend(
            client_headers
                .iter()
                .filter(|(name, _)| forwardable(name, &self.config.endpoint_header))
                .map(|(n, v)| (n.as_str(), v.as_str())),
        );
        let token = self
            .dispatch_http_call(
                &self.config.prefill_cluster,
                headers,
                Some(&prefill_body),
                vec![],
                Duration::from_millis(self.config.prefill_timeout_ms),
            )
            .map_err(|s| format!("cannot send the prefill: {s:?}"))?;
        self.prefill_http = Some(token);
        self.prefill = Prefill::Pending;
        self.merge_logprobs = wants_input_logprobs(route, &parsed);
        self.set_http_request_body(0, body.len(), &decode_body);
        self.set_http_request_header("content-length", Some(&decode_body.len().to_string()));
        Ok(())
    }

    /// The prefill half the filter sent itself (outage fallback) answered.
    pub(super) fn local_prefill_answered(&mut self, body_size: usize) {
        let status = self
            .get_http_call_response_header(":status")
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(0);
        let outcome = if (200..300).contains(&status) {
            let logprobs = if self.merge_logprobs {
                self.get_http_call_response_body(0, body_size)
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|v| prefill_input_logprobs(&v))
                    .unwrap_or_default()
            } else {
                String::new()
            };
            PrefillOutcome {
                ok: true,
                http_status: status,
                input_token_logprobs: logprobs,
                ..Default::default()
            }
        } else {
            PrefillOutcome {
                http_status: if status == 0 { 502 } else { status },
                message: format!("prefill worker failed (status {status}) while the control plane was unavailable"),
                error_type: "prefill_failed".into(),
                ..Default::default()
            }
        };
        self.prefill_ended(outcome);
    }
}

/// Client headers worth passing to the prefill worker (not hop-by-hop,
/// pseudo, length or routing headers).
fn forwardable(name: &str, endpoint_header: &str) -> bool {
    !(name.starts_with(':')
        || name.starts_with("x-envoy-")
        || name == endpoint_header
        || matches!(
            name,
            "host"
                | "content-length"
                | "content-type"
                | "transfer-encoding"
                | "connection"
                | "keep-alive"
                | "te"
                | "upgrade"
                | "expect"
        ))
}

/// A request id in sglang-router's format, with `envoy` where the router's
/// address would be (the filter does not know it).
fn local_rid(route: Route) -> String {
    const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 24];
    fill_random(&mut bytes);
    let random: String = bytes
        .iter()
        .map(|b| ALPHANUMERIC[usize::from(*b) % ALPHANUMERIC.len()] as char)
        .collect();
    format!("{}{random}-envoy", route.rid_prefix())
}

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    fill_random(&mut bytes);
    u64::from_le_bytes(bytes)
}

fn fill_random(bytes: &mut [u8]) {
    if getrandom::fill(bytes).is_err() {
        // No entropy source: the clock still makes collisions unlikely.
        let nanos = proxy_wasm::hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (nanos.rotate_left(i as u32 * 7) >> (i % 8)) as u8;
        }
    }
}
