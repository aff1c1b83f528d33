//! Routing without the control plane (its outage): a recently healthy
//! worker in turn, and in PD mode the prefill half sent by the filter itself
//! through Envoy's prefill cluster, with bootstrap fields it builds.

use std::time::Duration;

use log::warn;
use proxy_wasm::traits::{Context, HttpContext};
use sglang_envoy_body::pd::{as_pairs, pd_fields, wants_input_logprobs, Bootstrap, Unit};
use sglang_envoy_body::{prefill_input_logprobs, RequestBody};
use sglang_envoy_lifecycle::{headers, random, Source};
use sglang_envoy_proto::{PrefillEndpoint, PrefillOutcome};

use super::calls::Call;
use super::Request;
use crate::fallback::Profiles;
use crate::host;

/// Stands for the router's address in request ids the filter makes (it
/// does not know the control plane's).
const RID_SUFFIX: &str = "envoy";

impl Request {
    /// The control plane did not answer: sends the request to a recently
    /// healthy worker in turn. The completion is still reported (the
    /// control plane may have counted the request before it went silent).
    /// Returns false when there is nothing to fall back on.
    pub(super) fn route_locally(&mut self) -> bool {
        let config = &self.shared.config;
        let now = self.get_current_time();
        let max_age = Duration::from_millis(config.fallback_max_age_ms);
        let Some(choice) = self
            .shared
            .fallback
            .choose(now, max_age, config.fallback_retries)
        else {
            return false;
        };
        let mut prefill_merge = None;
        if let Some(prefill) = &choice.prefill {
            match self.send_prefill_locally(prefill, choice.profiles) {
                Ok(merge) => prefill_merge = merge,
                Err(e) => {
                    warn!("local PD fallback impossible: {e}");
                    return false;
                }
            }
        }
        let endpoints = choice.endpoints.join(",");
        self.shared.local_fallbacks.increment();
        log::log!(
            self.shared.outage_level(),
            "control plane unavailable; {} -> {endpoints} (local fallback)",
            self.lc.path()
        );
        self.set_http_request_header(&self.shared.config.endpoint_header, Some(&endpoints));
        self.lc.forwarded_locally(prefill_merge);
        true
    }

    /// PD mode without the control plane: writes the bootstrap fields into
    /// both halves itself (each in its worker's wire profile, with no DP
    /// rank: the workers pick theirs from the room), sends the prefill half
    /// to `prefill` through Envoy's prefill cluster, and leaves the decode
    /// half in the request. `Some(merge logprobs)` once the prefill is sent;
    /// `None` for requests without a body (nothing to prefill).
    fn send_prefill_locally(
        &mut self,
        prefill: &PrefillEndpoint,
        profiles: Profiles,
    ) -> Result<Option<bool>, String> {
        let Some(route) = self.lc.route() else {
            return Ok(None); // info GETs need no prefill
        };
        let source = self.source();
        let body = source.body();
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
        let fields = pd_fields(
            route,
            &parsed,
            &bootstrap,
            || random::rid(route, RID_SUFFIX, host::nanos),
            || random::u64(host::nanos),
        );
        let prefill_body = parsed
            .with_fields(&as_pairs(&fields.prefill))
            .map_err(|e| e.to_string())?;
        let decode_body = parsed
            .with_fields(&as_pairs(&fields.decode))
            .map_err(|e| e.to_string())?;
        let merge = wants_input_logprobs(route, &parsed);
        let client = self.get_http_request_headers();
        let forwarded = headers::for_prefill(
            client
                .iter()
                .filter(|(name, _)| *name != self.shared.config.endpoint_header)
                .map(|(n, v)| (n.as_str(), v.as_str())),
        );
        let path = self.lc.path().to_string();
        let mut call_headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", &path),
            (":authority", &prefill.endpoint),
            (&self.shared.config.endpoint_header, &prefill.endpoint),
        ];
        call_headers.extend(forwarded.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        let token = self
            .dispatch_http_call(
                &self.shared.config.prefill_cluster,
                call_headers,
                Some(&prefill_body),
                vec![],
                Duration::from_millis(self.shared.config.prefill_timeout_ms),
            )
            .map_err(|s| format!("cannot send the prefill: {s:?}"))?;
        // Registered with the VM as well: a fallback set off while the root
        // acts for this request (the session broke under its question)
        // sends this call as the root, whose context gets the answer.
        self.calls.track(token, Call::LocalPrefill);
        self.prefill_sent();
        self.set_http_request_body(0, body.len(), &decode_body);
        self.set_http_request_header("content-length", Some(&decode_body.len().to_string()));
        Ok(Some(merge))
    }

    /// The outcome of the prefill half the filter sent itself, from its
    /// answer (`body_size` bytes).
    pub(super) fn local_prefill_outcome(&self, body_size: usize) -> PrefillOutcome {
        let status = self
            .get_http_call_response_header(":status")
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(0);
        if !(200..300).contains(&status) {
            return PrefillOutcome {
                http_status: if status == 0 { 502 } else { status },
                message: format!("prefill worker failed (status {status}) while the control plane was unavailable"),
                error_type: "prefill_failed".into(),
                ..Default::default()
            };
        }
        // Read only when the answer may need them (the lifecycle ignores
        // them otherwise).
        let logprobs = self
            .get_http_call_response_body(0, body_size)
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| prefill_input_logprobs(&v))
            .unwrap_or_default();
        PrefillOutcome {
            ok: true,
            http_status: status,
            input_token_logprobs: logprobs,
            ..Default::default()
        }
    }
}
