//! What the lifecycle tells a front door to do, after each event: on the
//! request's side (its head, its body, the control plane's answer) and on
//! the answer's side (its head, its body, the prefill's outcome).

use std::time::Duration;

use sglang_envoy_proto::Completion;

use crate::question::{FollowPrefill, Question};
use crate::reply::LocalReply;

/// What to do after the request head.
#[derive(Debug, PartialEq)]
pub enum HeadStep {
    /// Answer the client with this error.
    Reply(LocalReply),
    /// An inference request: wait for its whole body.
    ReadBody,
    /// A request routed on its head alone (an info `GET`): ask this.
    Ask(Box<Question>),
}

/// What to do after the body, an answer of the control plane, or the end
/// of an admission wait.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Send this routing question to the control plane.
    Ask(Box<Question>),
    /// Admission control queued the request: wait for its slot (up to
    /// `wait_ms`, as the control plane says), still paused.
    AwaitAdmission {
        /// How long the control plane may keep it queued.
        wait_ms: u64,
    },
    /// Send the request on, edited.
    Forward(Forward),
    /// Answer the client with this error.
    Reply(LocalReply),
    /// The control plane gave no answer: route without it if possible
    /// ([`crate::Lifecycle::forwarded_locally`]), else [`LocalReply::unreachable`].
    Fallback,
}

/// What the front door holds while the router waits for something (a
/// decision, an admission slot, a prefill's outcome). Each such hold must
/// end: when whatever it waits for is lost, [`crate::Lifecycle::on_overdue`] says
/// how to end it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The request, paused until the control plane decides (or admits it).
    Request,
    /// PD: the answer's head, until the prefill's outcome.
    AnswerHead,
}

/// How a hold ends once its deadline passed with nothing arriving.
#[derive(Debug, PartialEq)]
pub enum Overdue {
    /// The request's question or admission wait is given up: this step
    /// (the outage fallback, or an error when there is none).
    Request(Step),
    /// The prefill's outcome is given up: the held answer goes on.
    Prefill(PrefillStep),
    /// The lifecycle holds nothing.
    Nothing,
}

/// The edits that send a request to the workers the decision chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// For [`crate::names::ENDPOINT_HEADER`]: the chosen `ip:port` first,
    /// then the ones to retry on.
    pub endpoints: String,
    /// Further request headers to set (retry count, per-try timeout).
    pub headers: Vec<(String, String)>,
    /// The body with the decision's fields spliced in, when it has any
    /// (set `content-length` to its length).
    pub body: Option<Vec<u8>>,
    /// PD: follow the prefill half the control plane sent (its outcome
    /// arrives through [`crate::Lifecycle::on_prefill`]).
    pub prefill: Option<FollowPrefill>,
    /// The chosen worker, for logs.
    pub worker: String,
}

/// How much of the answer's body the lifecycle must be shown from now on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// None of it ([`crate::Lifecycle::on_response_end`] once its head went: a
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

impl Release {
    /// Letting the head go as it is: an SSE stream shown chunk by chunk
    /// (to see that it finished), a JSON answer not at all.
    pub fn pass(sse: bool) -> Self {
        Release {
            strip_length: false,
            watch: if sse { Watch::Chunks } else { Watch::Nothing },
        }
    }
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
    /// Hold it until the prefill's outcome ([`crate::Lifecycle::on_prefill`]),
    /// or until `grace` runs out ([`crate::Lifecycle::on_prefill_unknown`]).
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
