//! Admission control: a request the control plane queued waits, still
//! paused, for its slot (`AwaitAdmission`), then asks again.

use std::time::Duration;

use log::warn;
use prost::Message;
use proxy_wasm::traits::Context;
use proxy_wasm::types::Action;
use sglang_envoy_proto::{AdmissionOutcome, AdmissionWait, SERVICE_NAME};

use super::Request;
use crate::reply::send_error;

impl Request {
    /// Admission control queued the request: wait (still paused) until it
    /// holds a slot, a little longer than the control plane will.
    pub(super) fn await_admission(&mut self, wait_ms: u64) {
        let wait = AdmissionWait {
            ticket: self.ticket,
        }
        .encode_to_vec();
        match self.dispatch_grpc_call(
            &self.config.control_plane_cluster,
            SERVICE_NAME,
            "AwaitAdmission",
            vec![],
            Some(&wait),
            Duration::from_millis(wait_ms.saturating_add(2_000)),
        ) {
            Ok(token) => self.admission_call = Some(token),
            Err(status) => {
                warn!("cannot wait for admission: {status:?}");
                self.unanswered();
            }
        }
    }

    /// The wait for admission ended: admitted requests ask again.
    pub(super) fn admission_ended(&mut self, status_code: u32, size: usize) {
        if status_code != 0 {
            warn!("admission wait lost (grpc status {status_code})");
            return self.unanswered();
        }
        let bytes = self
            .get_grpc_call_response_body(0, size)
            .unwrap_or_default();
        match AdmissionOutcome::decode(bytes.as_slice()) {
            Ok(AdmissionOutcome { admitted: true, .. }) => {
                if self.ask() == Action::Continue {
                    self.resume();
                }
            }
            Ok(AdmissionOutcome {
                rejection: Some(r), ..
            }) => {
                let status = u16::try_from(r.http_status).unwrap_or(503);
                send_error(self, status, &r.error_type, &r.message);
            }
            _ => send_error(
                self,
                502,
                "bad_gateway",
                "the router's control plane sent an unreadable answer",
            ),
        }
    }
}
