//! What the control plane learns of a request: its end, which releases its
//! load, or early, a failed answer.

use sglang_envoy_proto::Completion;

use crate::lifecycle::{Lifecycle, Load};

/// What the host says about a request's answer (Envoy's `response.*` and
/// `upstream.*` attributes).
#[derive(Debug, Clone, Default)]
pub struct EndFacts {
    /// The status sent to the client, when the host says.
    pub http_status: Option<u32>,
    /// Why the answer is what it is (`via_upstream`, `upstream_...` for
    /// Envoy's replies about the worker, anything else for Envoy's own).
    pub code_details: Option<String>,
    /// `ip:port` Envoy finally sent the request to, empty if none.
    pub upstream_host: String,
    /// Attempts Envoy made (0: unknown).
    pub attempts: u32,
    /// Time since the request head, in microseconds.
    pub duration_us: u64,
}

impl Lifecycle {
    /// The request as it stands: its end, or (`outcome_only`) what its
    /// answer, just started, says about the workers tried.
    pub fn completion(&self, facts: &EndFacts, outcome_only: bool) -> Completion {
        let details = facts.code_details.as_deref().filter(|d| !d.is_empty());
        let about_worker = details.is_some_and(|d| d.starts_with("upstream"));
        Completion {
            ticket: self.ticket(),
            http_status: facts.http_status.filter(|s| *s != 0).unwrap_or(self.status),
            // Unfinished and not reset by the worker: the client hung up.
            client_cancelled: !self.response_done && !about_worker,
            // The router's own answer, or Envoy's about something other
            // than the worker.
            local_reply: self.replied()
                || details.is_some_and(|d| d != "via_upstream" && !about_worker),
            upstream_host: facts.upstream_host.clone(),
            duration_us: facts.duration_us,
            attempts: facts.attempts,
            outcome_only,
        }
    }

    /// The request ended: its completion, to report when the control plane
    /// may have counted it and it was not reported yet (a host may report
    /// as the answer's last byte leaves, before the client can ask for the
    /// loads, and again when the stream is gone).
    pub fn end(&mut self, facts: &EndFacts) -> Option<Completion> {
        if self.load != Load::Counted {
            return None;
        }
        self.load = Load::Released;
        Some(self.completion(facts, false))
    }
}
