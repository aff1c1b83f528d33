//! PD mode: the decode answer's headers wait for the prefill half's outcome
//! (a failed prefill becomes the client's error), and the prefill's input
//! logprobs are merged into the answer when asked for.

use std::time::Duration;

use log::warn;
use prost::Message;
use proxy_wasm::traits::{Context, HttpContext};
use sglang_envoy_body::pd::prefill_error_status;
use sglang_envoy_body::{merge_first_sse_event, merge_input_logprobs, SseMerge};
use sglang_envoy_proto::{PrefillOutcome, PrefillWait, SERVICE_NAME};

use super::Request;
use crate::reply::send_error;

/// Where the prefill half of a PD request stands, as far as this stream knows.
#[derive(Debug)]
pub(super) enum Prefill {
    /// Not a PD request.
    None,
    /// Sent by the control plane; `AwaitPrefill` has not answered.
    Pending,
    /// Succeeded; the prefill's input logprobs to merge, if asked for.
    Done(Option<String>),
    /// Failed, or no longer matters (the decode answer was an error).
    Over,
}

impl Request {
    /// Asks the control plane for the outcome of the prefill half it sent
    /// (`AwaitPrefill`); the decode answer's headers wait for it. False,
    /// with the client answered, when the question cannot be sent.
    pub(super) fn await_prefill(&mut self, merge_logprobs: bool) -> bool {
        let wait = PrefillWait {
            ticket: self.ticket,
        }
        .encode_to_vec();
        match self.dispatch_grpc_call(
            &self.config.control_plane_cluster,
            SERVICE_NAME,
            "AwaitPrefill",
            vec![],
            Some(&wait),
            Duration::from_millis(self.config.prefill_timeout_ms),
        ) {
            Ok(token) => {
                self.prefill_call = Some(token);
                self.prefill = Prefill::Pending;
                self.merge_logprobs = merge_logprobs;
                true
            }
            Err(status) => {
                warn!("cannot wait for the prefill: {status:?}");
                send_error(
                    self,
                    503,
                    "service_unavailable",
                    "the router's control plane cannot be reached",
                );
                false
            }
        }
    }

    /// The control plane answered `AwaitPrefill`.
    pub(super) fn prefill_answered(&mut self, status_code: u32, size: usize) {
        let outcome = if status_code == 0 {
            let bytes = self
                .get_grpc_call_response_body(0, size)
                .unwrap_or_default();
            PrefillOutcome::decode(bytes.as_slice()).unwrap_or_else(|_| PrefillOutcome {
                http_status: 502,
                message: "the router's control plane sent an unreadable answer".into(),
                error_type: "bad_gateway".into(),
                ..Default::default()
            })
        } else {
            // The control plane went away mid-request: whether its
            // prefill finished is unknown. Let the decode answer through;
            // if the KV never came, the decode worker's own wait times
            // out and the client gets that error instead of a hang.
            warn!("prefill outcome lost (grpc status {status_code}); passing the decode answer on");
            PrefillOutcome {
                ok: true,
                ..Default::default()
            }
        };
        self.prefill_ended(outcome);
    }

    /// The prefill's outcome arrived.
    pub(super) fn prefill_ended(&mut self, outcome: PrefillOutcome) {
        if !matches!(self.prefill, Prefill::Pending) {
            return;
        }
        if !outcome.ok {
            self.prefill = Prefill::Over;
            let status = prefill_error_status(outcome.http_status);
            // The decode answer has not gone out (its headers wait for this),
            // so the client gets the prefill's error; Envoy resets the decode.
            send_error(self, status, &outcome.error_type, &outcome.message);
            return;
        }
        let logprobs = (self.merge_logprobs && !outcome.input_token_logprobs.is_empty())
            .then_some(outcome.input_token_logprobs);
        let merging = logprobs.is_some();
        self.prefill = Prefill::Done(logprobs);
        if !self.response_paused {
            return;
        }
        self.prepare_response_for_merge();
        // Without a merge, or once what arrived so far could be merged, the
        // answer goes on; else it stays held until the body callbacks can.
        if !merging || (self.buffered > 0 && self.merge_buffered(self.buffered, self.body_ended)) {
            self.response_paused = false;
            self.resume_http_response();
        }
    }

    /// Tries to merge the prefill's logprobs into the `size` bytes of answer
    /// held so far. True when done (merged, or nothing to merge into): the
    /// answer may go on.
    pub(super) fn merge_buffered(&mut self, size: usize, end_of_stream: bool) -> bool {
        let Prefill::Done(Some(logprobs)) = &self.prefill else {
            return true;
        };
        let logprobs = logprobs.clone();
        let Some(held) = self.get_http_response_body(0, size) else {
            warn!("cannot read the held answer to merge prefill logprobs");
            self.prefill = Prefill::Over;
            return true;
        };
        let merged = if self.response_is_sse {
            match merge_first_sse_event(&held, &logprobs, end_of_stream) {
                SseMerge::NeedMore => return false,
                SseMerge::Done(out) => Some(out),
            }
        } else if end_of_stream {
            merge_input_logprobs(&held, &logprobs)
        } else {
            return false;
        };
        if let Some(out) = merged {
            self.set_http_response_body(0, size, &out);
        }
        self.prefill = Prefill::Over;
        true
    }

    /// A merged body has another length.
    pub(super) fn prepare_response_for_merge(&mut self) {
        if matches!(self.prefill, Prefill::Done(Some(_))) {
            self.set_http_response_header("content-length", None);
        }
    }
}
