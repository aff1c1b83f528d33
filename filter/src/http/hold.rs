//! The safety net under every wait of a request (see `holds.rs`): what the
//! request registers when the filter pauses it or its answer, and how the
//! hold ends when its deadline passes with nothing arriving.

use std::time::Duration;

use log::warn;
use proxy_wasm::traits::{Context, HttpContext};
use sglang_envoy_lifecycle::{Held, LocalReply, Overdue};

use super::calls::Call;
use super::Request;
use crate::holds::{Hold, SLACK};
use crate::session::Wait;

/// PD: once the decode answer is whole while its head waits for the
/// prefill's outcome, the prefill is over (the decode could not have
/// answered without its KV cache): its outcome is worth this long a wait at
/// most, not the rest of `prefill_timeout_ms`.
pub(super) const WHOLE_ANSWER_WAIT: Duration = Duration::from_secs(5);

impl Request {
    /// The filter holds this request (or its answer) for `hold`, for
    /// `timeout` at most (plus the slack the wait's own deadline gets).
    pub(super) fn hold(&self, hold: Hold, timeout: Duration) {
        let deadline = self.get_current_time() + timeout + SLACK;
        self.shared.holds.hold(self.context_id, hold, deadline);
    }

    /// Nothing is held any more (it went on, was answered, or ended).
    pub(super) fn unhold(&self) {
        self.shared.holds.release(self.context_id);
    }

    /// Holds the answer's head for the prefill's outcome: until the
    /// prefill's own deadline, or briefly when the answer is whole.
    pub(super) fn hold_head_for_prefill(&self) {
        let now = self.get_current_time();
        let full = Duration::from_millis(self.shared.config.prefill_timeout_ms);
        let mut left = self
            .prefill_until
            .map_or(full, |until| until.duration_since(now).unwrap_or_default());
        if self.lc.response_ended() {
            left = left.min(WHOLE_ANSWER_WAIT);
        }
        self.hold(Hold::AnswerHead, left);
    }

    /// The decode answer just ended: if its head still waits for the
    /// prefill's outcome, that wait is cut short (see [`WHOLE_ANSWER_WAIT`]).
    pub(super) fn answer_whole(&self) {
        if self.lc.held() == Some(Held::AnswerHead) {
            self.hold_head_for_prefill();
        }
    }

    /// The prefill's own deadline starts now (it was sent, or the control
    /// plane sent it).
    pub(super) fn prefill_sent(&mut self) {
        let timeout = Duration::from_millis(self.shared.config.prefill_timeout_ms);
        self.prefill_until = Some(self.get_current_time() + timeout);
    }

    /// The root's tick found `hold` past its deadline: whatever it waited
    /// for is taken as lost, and the hold ends: a held request takes the
    /// outage fallback (or gets a JSON 503), a held answer goes on.
    pub fn overdue(&mut self, hold: Hold) {
        warn!(
            "{} (ticket {}) held too long for {hold:?}; ending the hold",
            self.lc.path(),
            self.lc.ticket()
        );
        let ticket = self.lc.ticket();
        match hold {
            Hold::Request => {
                // An answer that still comes finds nobody waiting.
                self.shared.session.forget_wait(ticket, Wait::Answer);
                self.calls
                    .forget(|c| matches!(c, Call::Route { .. } | Call::Admission));
                match self.lc.on_overdue() {
                    Overdue::Request(step) => self.run_resuming(step),
                    // Not held by the lifecycle: it went on or was
                    // answered already.
                    _ if self.lc.forwarded() || self.lc.replied() => {}
                    _ => self.reply(LocalReply::unreachable()),
                }
            }
            Hold::AnswerHead => {
                self.calls.forget(|c| matches!(c, Call::Outcome));
                match self.lc.on_overdue() {
                    Overdue::Prefill(step) => self.prefill_step(step),
                    // Held for a failure's report (`report_failure`).
                    _ => self.resume_http_response(),
                }
            }
            // Its `Complete` call is late: the answer goes on.
            Hold::AnswerEnd => self.resume_http_response(),
        }
    }
}
