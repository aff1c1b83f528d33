//! The report that a worker finished a request's prefill: the answer's
//! first body bytes. A policy that prices the prefill queued on each worker
//! (`cost_aware`) asks for it; without it, a request's prefill would count
//! as queued until the request ends, its decode included.

use sglang_envoy_proto::Completion;

use crate::front_door::ResponseHead;

/// Where a request stands with that report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrefillEnd {
    /// Not asked for, already reported, or not to be: a failed or empty
    /// answer, or a whole JSON one (its bytes come at its end, which is
    /// reported anyway).
    Unwatched,
    /// Asked for; the answer has not started.
    Awaited,
    /// A 2xx stream started: its first body bytes end the prefill (a
    /// worker streams nothing before its first token).
    Watching,
}

impl PrefillEnd {
    /// The state after a decision that did (`asked`) or did not ask.
    pub(crate) fn asked(asked: bool) -> Self {
        if asked {
            PrefillEnd::Awaited
        } else {
            PrefillEnd::Unwatched
        }
    }

    /// The state once the answer's `head` arrived.
    pub(crate) fn on_head(self, head: ResponseHead) -> Self {
        match self {
            PrefillEnd::Awaited
                if head.sse && (200..300).contains(&head.status) && !head.end_of_stream =>
            {
                PrefillEnd::Watching
            }
            _ => PrefillEnd::Unwatched,
        }
    }

    /// `size` bytes of the answer's body arrived: the report for `ticket`
    /// when they are its first.
    pub(crate) fn on_bytes(&mut self, size: usize, ticket: u64) -> Option<Completion> {
        if size == 0 || *self != PrefillEnd::Watching {
            return None;
        }
        *self = PrefillEnd::Unwatched;
        Some(Completion {
            ticket,
            prefilled: true,
            ..Default::default()
        })
    }
}
