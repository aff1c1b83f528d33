//! What remains to do with a request's answer once the request went
//! upstream, and how each event on the answer's side moves it on: in PD
//! mode the decode answer held for the prefill half's outcome (a failed
//! prefill becomes the client's error) and the prefill's input logprobs
//! merged into it. The lifecycle keeps one [`AnswerState`] per request
//! and hands it the answer's events; what is the request's own (its
//! status, its load, the router's own replies) stays with the lifecycle.

use sglang_envoy_body::pd::prefill_error_status;
use sglang_envoy_body::{merge_first_sse_event, merge_input_logprobs, SseMerge};
use sglang_envoy_proto::PrefillOutcome;

use crate::front_door::ResponseHead;
use crate::names::DECODE_ERROR_GRACE;
use crate::reply::LocalReply;
use crate::steps::{BodyStep, PrefillStep, Release, ResponseStep, Watch};

/// What remains to do with the answer of a request that went upstream.
#[derive(Debug)]
pub(crate) enum AnswerState {
    /// Let it through (regular requests; PD once the prefill no longer
    /// matters).
    Pass,
    /// PD: the prefill half runs; the answer has not started.
    PrefillRunning {
        /// Merge the prefill's input logprobs into the answer.
        merge: bool,
    },
    /// PD: the prefill succeeded before the answer started.
    PrefillDone {
        /// Its input logprobs to merge, when asked for.
        logprobs: Option<String>,
    },
    /// PD: the answer's head waits for the prefill's outcome.
    HeadHeld {
        merge: bool,
        /// The decode worker answered an error.
        decode_failed: bool,
        sse: bool,
        /// The answer's body so far, when it may need a merge.
        held: Vec<u8>,
    },
    /// The prefill's logprobs go into the answer's first event (SSE) or
    /// whole body (JSON), once enough of it is here.
    Merging {
        logprobs: String,
        sse: bool,
        /// The answer's body so far (the front door holds it back, and
        /// in the wasm filter the head too: letting the head go would let
        /// the held body go unmerged).
        held: Vec<u8>,
    },
}

impl AnswerState {
    /// The state of an answer to a request just sent on: `prefill_merge`
    /// is `Some(merge logprobs)` when a PD prefill half runs beside it.
    pub(crate) fn after_forward(prefill_merge: Option<bool>) -> Self {
        match prefill_merge {
            Some(merge) => AnswerState::PrefillRunning { merge },
            None => AnswerState::Pass,
        }
    }

    /// The front door holds the answer's head for the prefill's outcome.
    pub(crate) fn holds_head(&self) -> bool {
        matches!(self, AnswerState::HeadHeld { .. })
    }

    /// The answer's bytes must be shown (to merge into them).
    pub(crate) fn needs_bytes(&self) -> bool {
        matches!(
            self,
            AnswerState::HeadHeld { merge: true, .. } | AnswerState::Merging { .. }
        )
    }

    /// The answer's head arrived. A `Continue` carries no report: whether
    /// the answer's failure is reported is the request's business.
    pub(crate) fn on_head(&mut self, head: ResponseHead) -> ResponseStep {
        let ok = (200..300).contains(&head.status);
        match std::mem::replace(self, AnswerState::Pass) {
            AnswerState::PrefillRunning { merge } => {
                *self = AnswerState::HeadHeld {
                    merge: merge && ok,
                    decode_failed: !ok,
                    sse: head.sse,
                    held: Vec::new(),
                };
                // A decode error may be its prefill's: the prefill's error
                // is the cause, but only worth a short wait.
                let grace = (!ok).then_some(DECODE_ERROR_GRACE);
                ResponseStep::Hold { grace }
            }
            AnswerState::PrefillDone {
                logprobs: Some(logprobs),
            } if ok && !head.end_of_stream => {
                *self = AnswerState::Merging {
                    logprobs,
                    sse: head.sse,
                    held: Vec::new(),
                };
                ResponseStep::Continue {
                    release: merging(head.sse),
                    report: None,
                }
            }
            _ => ResponseStep::Continue {
                release: Release::pass(head.sse),
                report: None,
            },
        }
    }

    /// The prefill half's outcome arrived. `body_while_head_held`: the
    /// front door sees the body while it holds the head; `ended`: the
    /// answer's last byte came. A `Reply` is the prefill's error, for the
    /// client instead of the answer.
    pub(crate) fn on_prefill(
        &mut self,
        outcome: PrefillOutcome,
        body_while_head_held: bool,
        ended: bool,
    ) -> PrefillStep {
        let (merge, decode_failed, head) = match self {
            AnswerState::PrefillRunning { merge } => (*merge, false, None),
            AnswerState::HeadHeld {
                merge,
                decode_failed,
                sse,
                held,
            } => (*merge, *decode_failed, Some((*sse, std::mem::take(held)))),
            // Too late: the answer no longer waits for it.
            _ => return PrefillStep::Nothing,
        };
        if !outcome.ok {
            // The answer has not gone out (its head waits for this, or has
            // not come), so the client gets the prefill's error.
            let status = prefill_error_status(outcome.http_status);
            *self = AnswerState::Pass;
            return PrefillStep::Reply(LocalReply::new(
                status,
                &outcome.error_type,
                outcome.message,
            ));
        }
        let logprobs = (merge && !decode_failed && !outcome.input_token_logprobs.is_empty())
            .then_some(outcome.input_token_logprobs);
        let Some((sse, held)) = head else {
            *self = AnswerState::PrefillDone { logprobs };
            return PrefillStep::Nothing;
        };
        let Some(logprobs) = logprobs else {
            *self = AnswerState::Pass;
            return PrefillStep::Release {
                release: Release::pass(sse),
                replace: None,
            };
        };
        if !body_while_head_held {
            // Nothing of the body can come while the head is held: let it
            // go and merge as the body comes.
            *self = AnswerState::Merging {
                logprobs,
                sse,
                held,
            };
            return PrefillStep::Release {
                release: merging(sse),
                replace: None,
            };
        }
        // The whole answer may be held already (a short JSON answer).
        match try_merge(&logprobs, sse, &held, ended) {
            Some(out) => {
                *self = AnswerState::Pass;
                PrefillStep::Release {
                    release: Release {
                        strip_length: true,
                        watch: Watch::Nothing,
                    },
                    replace: Some(out),
                }
            }
            None => {
                *self = AnswerState::Merging {
                    logprobs,
                    sse,
                    held,
                };
                PrefillStep::KeepHolding
            }
        }
    }

    /// The prefill's outcome cannot be known: the decode answer goes
    /// through as it is.
    pub(crate) fn on_prefill_unknown(&mut self) -> PrefillStep {
        match self {
            AnswerState::PrefillRunning { .. } => {
                *self = AnswerState::PrefillDone { logprobs: None };
                PrefillStep::Nothing
            }
            AnswerState::HeadHeld { sse, .. } => {
                let sse = *sse;
                *self = AnswerState::Pass;
                PrefillStep::Release {
                    release: Release::pass(sse),
                    replace: None,
                }
            }
            _ => PrefillStep::Nothing,
        }
    }

    /// A chunk of the answer's body arrived (`end`: the last).
    pub(crate) fn on_body(&mut self, chunk: &[u8], end: bool) -> BodyStep {
        match self {
            AnswerState::HeadHeld { merge, held, .. } => {
                if *merge {
                    held.extend_from_slice(chunk);
                }
                BodyStep::Hold
            }
            AnswerState::Merging {
                logprobs,
                sse,
                held,
            } => {
                held.extend_from_slice(chunk);
                match try_merge(logprobs, *sse, held, end) {
                    Some(out) => {
                        *self = AnswerState::Pass;
                        BodyStep::Replace(out)
                    }
                    None => BodyStep::Hold,
                }
            }
            _ => BodyStep::Pass,
        }
    }
}

/// A head released for a merge: the body's length changes, and the body
/// must be seen (an SSE stream chunk by chunk, a JSON answer whole).
fn merging(sse: bool) -> Release {
    Release {
        strip_length: true,
        watch: if sse { Watch::Chunks } else { Watch::Whole },
    }
}

/// The merged body once enough of it is `held`: the first event of an SSE
/// stream, the whole of a JSON answer (`end`). An answer with nothing to
/// merge into goes unchanged.
fn try_merge(logprobs: &str, sse: bool, held: &[u8], end: bool) -> Option<Vec<u8>> {
    if sse {
        match merge_first_sse_event(held, logprobs, end) {
            SseMerge::NeedMore => None,
            SseMerge::Done(out) => Some(out),
        }
    } else if end {
        Some(merge_input_logprobs(held, logprobs).unwrap_or_else(|| held.to_vec()))
    } else {
        None
    }
}
