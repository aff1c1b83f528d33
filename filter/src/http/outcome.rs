//! What the control plane learns of a request's answer: its end (queued for
//! the root context's report), and, as soon as an answer starts with a
//! failure, that failure, reported before the client sees the answer so
//! that the circuit breakers have counted it before the client's next
//! request (a client retrying at once would otherwise meet the same failing
//! worker again).

use std::time::Duration;

use log::warn;
use prost::Message;
use proxy_wasm::traits::Context;
use sglang_envoy_body::is_worker_failure;
use sglang_envoy_proto::{CompleteRequest, Completion, SERVICE_NAME};

use super::Request;

/// The longest a failed answer waits for its report to be taken.
const REPORT_WAIT: Duration = Duration::from_millis(250);

impl Request {
    /// The request as it stands: its end, or (`outcome_only`) what its
    /// answer, just started, says about the workers tried.
    pub(super) fn completion(&self, outcome_only: bool) -> Completion {
        let http_status = self
            .get_property(vec!["response", "code"])
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map_or(0, |b| u64::from_le_bytes(b).min(u64::from(u32::MAX)) as u32);
        let details = self
            .get_property(vec!["response", "code_details"])
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        let upstream_host = self
            .get_property(vec!["upstream", "address"])
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        let attempts = self
            .get_property(vec!["upstream", "request_attempt_count"])
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map_or(0, |b| u64::from_le_bytes(b).min(u64::from(u32::MAX)) as u32);
        Completion {
            ticket: self.ticket,
            http_status,
            // Unfinished and not reset by the worker: the client hung up.
            client_cancelled: !self.response_done && !details.starts_with("upstream"),
            // A worker's answer, or Envoy's own reply about the worker
            // ("upstream_..."), or else one of the router's own.
            local_reply: !(details == "via_upstream" || details.starts_with("upstream")),
            upstream_host,
            duration_us: self.elapsed_us(),
            attempts,
            outcome_only,
        }
    }

    /// An answer that starts with a worker's failure: reported now. True
    /// when the answer must wait for the report to be taken.
    pub(super) fn report_failure(&mut self) -> bool {
        if !self.asked {
            return false;
        }
        let c = self.completion(true);
        if c.local_reply || !is_worker_failure(c.http_status) {
            return false;
        }
        let report = CompleteRequest {
            completions: vec![c],
        }
        .encode_to_vec();
        match self.dispatch_grpc_call(
            &self.config.control_plane_cluster,
            SERVICE_NAME,
            "Complete",
            vec![],
            Some(&report),
            REPORT_WAIT,
        ) {
            Ok(token) => {
                self.outcome_call = Some(token);
                true
            }
            Err(status) => {
                warn!("cannot report a failed answer: {status:?}");
                false
            }
        }
    }
}
