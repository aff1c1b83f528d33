//! What the control plane learns of a request: its end, which releases its
//! load, or early, a failed answer.

use sglang_envoy_proto::Completion;

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

/// What the lifecycle knows of a request's outcome, for its completion.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Known {
    pub ticket: u64,
    /// The status the lifecycle saw (0 until known).
    pub status: u32,
    /// The answer reached its end (as opposed to a hang-up or a reset).
    pub response_done: bool,
    /// The router answered the client itself.
    pub replied: bool,
    /// The cached tokens the worker reported, when asked for.
    pub cached_tokens: Option<u64>,
}

impl EndFacts {
    /// The completion of a request, from what the lifecycle knows and
    /// what the host says: its end, or (`outcome_only`) what its answer,
    /// just started, says about the workers tried.
    pub(crate) fn completion(&self, known: Known, outcome_only: bool) -> Completion {
        let details = self.code_details.as_deref().filter(|d| !d.is_empty());
        let about_worker = details.is_some_and(|d| d.starts_with("upstream"));
        Completion {
            ticket: known.ticket,
            http_status: self.http_status.filter(|s| *s != 0).unwrap_or(known.status),
            // Unfinished and not reset by the worker: the client hung up.
            client_cancelled: !known.response_done && !about_worker,
            // The router's own answer, or Envoy's about something other
            // than the worker.
            local_reply: known.replied
                || details.is_some_and(|d| d != "via_upstream" && !about_worker),
            upstream_host: self.upstream_host.clone(),
            duration_us: self.duration_us,
            attempts: self.attempts,
            outcome_only,
            cached_tokens: known.cached_tokens,
            prefilled: false,
        }
    }
}
