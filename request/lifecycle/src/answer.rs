//! A request's answer, from its head to its end: early failure reports, and
//! in PD mode the decode answer held for the prefill half's outcome (a
//! failed prefill becomes the client's error) and the prefill's input
//! logprobs merged into it.

use std::time::Duration;

use sglang_envoy_body::pd::prefill_error_status;
use sglang_envoy_body::{is_worker_failure, merge_first_sse_event, merge_input_logprobs, SseMerge};
use sglang_envoy_proto::{Completion, PrefillOutcome};

use crate::completion::EndFacts;
use crate::lifecycle::{Lifecycle, Load, Mode, State};
use crate::names::DECODE_ERROR_GRACE;
use crate::reply::LocalReply;

/// What remains to do with the answer of a request that went upstream.
#[derive(Debug)]
pub(crate) enum Answer {
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

/// What the lifecycle knows of the answer's head.
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead {
    /// `:status`
    pub status: u32,
    /// `content-type` is `text/event-stream`.
    pub sse: bool,
    /// No body follows.
    pub end_of_stream: bool,
}

/// How much of the answer's body the lifecycle must be shown from now on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// None of it ([`Lifecycle::on_response_end`] once its head went: a
    /// JSON answer is whole at the worker when its head comes).
    Nothing,
    /// Each chunk as it comes (an SSE stream: to see that it finished, and
    /// to merge into its first event).
    Chunks,
    /// All of it (a JSON answer to merge into); chunks may come one by
    /// one, the lifecycle holds them until the end.
    Whole,
}

/// Letting the answer's head go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// Remove `content-length`: a merge changes the body's length.
    pub strip_length: bool,
    /// What of the body to show the lifecycle.
    pub watch: Watch,
}

/// What to do with the answer's head.
#[derive(Debug, PartialEq)]
pub enum ResponseStep {
    /// Let it go; first report `report` (an answer that starts with a
    /// worker's failure) so the circuit breakers have counted it before
    /// the client can send its next request.
    Continue {
        /// How.
        release: Release,
        /// The failure to report before the answer goes on.
        report: Option<Completion>,
    },
    /// Hold it until the prefill's outcome ([`Lifecycle::on_prefill`]),
    /// or until `grace` runs out ([`Lifecycle::on_prefill_unknown`]).
    Hold {
        /// How long at most, when the wait is bounded.
        grace: Option<Duration>,
    },
}

/// What to do after the prefill's outcome, or after giving up on it.
#[derive(Debug, PartialEq)]
pub enum PrefillStep {
    /// Nothing now.
    Nothing,
    /// The prefill failed before the answer went out: the client gets its
    /// error instead (the decode request is reset).
    Reply(LocalReply),
    /// Let the held head go, with the body held so far replaced by
    /// `replace` when given.
    Release {
        /// How.
        release: Release,
        /// The merged body, instead of everything held so far.
        replace: Option<Vec<u8>>,
    },
    /// Keep holding the head until the merge is done; remove its
    /// `content-length` now (the merged body has another length).
    KeepHolding,
}

/// What to do with a chunk of the answer's body.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyStep {
    /// Let it through.
    Pass,
    /// Hold it back (the lifecycle keeps a copy when it needs one).
    Hold,
    /// Send this instead of everything held back so far and this chunk
    /// (with the held head, if any).
    Replace(Vec<u8>),
}

impl Lifecycle {
    /// The answer's head arrived. `facts` tells what the host says about
    /// it; asked for only when a failure may need reporting (reading them
    /// costs host calls on every answer otherwise).
    pub fn on_response_head(
        &mut self,
        head: ResponseHead,
        facts: impl FnOnce() -> EndFacts,
    ) -> ResponseStep {
        self.status = head.status;
        self.response_done |= head.end_of_stream;
        let ok = (200..300).contains(&head.status);
        let pass = |sse: bool| Release {
            strip_length: false,
            watch: if sse { Watch::Chunks } else { Watch::Nothing },
        };
        let State::Upstream(answer) = &mut self.state else {
            // The router's own reply passing out.
            return ResponseStep::Continue {
                release: pass(false),
                report: None,
            };
        };
        match std::mem::replace(answer, Answer::Pass) {
            Answer::PrefillRunning { merge } => {
                *answer = Answer::HeadHeld {
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
            Answer::PrefillDone {
                logprobs: Some(logprobs),
            } if ok && !head.end_of_stream => {
                *answer = Answer::Merging {
                    logprobs,
                    sse: head.sse,
                    held: Vec::new(),
                };
                ResponseStep::Continue {
                    release: merging(head.sse),
                    report: None,
                }
            }
            _ => {
                // A failed answer counts against its workers at once; not
                // in PD mode, where a decode's failure may be its
                // prefill's: the end tells.
                let report = (self.load == Load::Counted
                    && self.mode == Mode::Regular
                    && is_worker_failure(head.status))
                .then(|| self.completion(&facts(), true))
                .filter(|c| !c.local_reply && is_worker_failure(c.http_status));
                ResponseStep::Continue {
                    release: pass(head.sse),
                    report,
                }
            }
        }
    }

    /// The prefill half's outcome arrived.
    pub fn on_prefill(&mut self, outcome: PrefillOutcome) -> PrefillStep {
        let State::Upstream(answer) = &mut self.state else {
            return PrefillStep::Nothing;
        };
        let (merge, decode_failed, head) = match answer {
            Answer::PrefillRunning { merge } => (*merge, false, None),
            Answer::HeadHeld {
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
            let reply = LocalReply::new(status, &outcome.error_type, outcome.message);
            return PrefillStep::Reply(self.refuse(reply));
        }
        let logprobs = (merge && !decode_failed && !outcome.input_token_logprobs.is_empty())
            .then_some(outcome.input_token_logprobs);
        let Some((sse, held)) = head else {
            *answer = Answer::PrefillDone { logprobs };
            return PrefillStep::Nothing;
        };
        let Some(logprobs) = logprobs else {
            *answer = Answer::Pass;
            return PrefillStep::Release {
                release: Release {
                    strip_length: false,
                    watch: if sse { Watch::Chunks } else { Watch::Nothing },
                },
                replace: None,
            };
        };
        if !self.settings.body_while_head_held {
            // Nothing of the body can come while the head is held: let it
            // go and merge as the body comes.
            *answer = Answer::Merging {
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
        let done = try_merge(&logprobs, sse, &held, self.response_done);
        match done {
            Some(out) => {
                *answer = Answer::Pass;
                PrefillStep::Release {
                    release: Release {
                        strip_length: true,
                        watch: Watch::Nothing,
                    },
                    replace: Some(out),
                }
            }
            None => {
                *answer = Answer::Merging {
                    logprobs,
                    sse,
                    held,
                };
                PrefillStep::KeepHolding
            }
        }
    }

    /// The prefill's outcome cannot be known (the control plane went away,
    /// or a decode error's grace ran out): the decode answer goes through
    /// as it is. If the KV never came, the decode worker's own wait times
    /// out and the client gets that error rather than a hang.
    pub fn on_prefill_unknown(&mut self) -> PrefillStep {
        let State::Upstream(answer) = &mut self.state else {
            return PrefillStep::Nothing;
        };
        match answer {
            Answer::PrefillRunning { .. } => {
                *answer = Answer::PrefillDone { logprobs: None };
                PrefillStep::Nothing
            }
            Answer::HeadHeld { sse, .. } => {
                let sse = *sse;
                *answer = Answer::Pass;
                PrefillStep::Release {
                    release: Release {
                        strip_length: false,
                        watch: if sse { Watch::Chunks } else { Watch::Nothing },
                    },
                    replace: None,
                }
            }
            _ => PrefillStep::Nothing,
        }
    }

    /// A chunk of the answer's body arrived (`end`: the last).
    pub fn on_response_body(&mut self, chunk: &[u8], end: bool) -> BodyStep {
        self.response_done |= end;
        let State::Upstream(answer) = &mut self.state else {
            return BodyStep::Pass;
        };
        match answer {
            Answer::HeadHeld { merge, held, .. } => {
                if *merge {
                    held.extend_from_slice(chunk);
                }
                BodyStep::Hold
            }
            Answer::Merging {
                logprobs,
                sse,
                held,
                ..
            } => {
                held.extend_from_slice(chunk);
                match try_merge(logprobs, *sse, held, end) {
                    Some(out) => {
                        *answer = Answer::Pass;
                        BodyStep::Replace(out)
                    }
                    None => BodyStep::Hold,
                }
            }
            _ => BodyStep::Pass,
        }
    }

    /// The lifecycle must be shown the answer's bytes (to merge into them);
    /// otherwise `on_response_body` needs only each chunk's end flag.
    pub fn needs_response_bytes(&self) -> bool {
        matches!(
            self.state,
            State::Upstream(Answer::HeadHeld { merge: true, .. } | Answer::Merging { .. })
        )
    }

    /// The answer has been seen to end.
    pub fn response_ended(&self) -> bool {
        self.response_done
    }

    /// The answer is known to have ended (its trailers came, or ext_proc
    /// stops watching a JSON answer whose head went).
    pub fn on_response_end(&mut self) {
        self.response_done = true;
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
