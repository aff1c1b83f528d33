//! The calls a request has in flight to the control plane (and, in an
//! outage, to a prefill worker), by what their answers are for.

use std::time::SystemTime;

use crate::contexts::CallOwners;

/// A call in flight, by what its answer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    /// `Route`: the routing question, after `refusals` of it
    /// (`UNAVAILABLE`: a replica gone or draining) by other replicas. An
    /// `UNAVAILABLE` at or after `refused_before` is no refusal but the
    /// call's own timeout (Envoy answers it with a 504, which gRPC maps to
    /// `UNAVAILABLE`): a replica that refuses does so at once.
    Route {
        refusals: u8,
        refused_before: SystemTime,
    },
    /// `AwaitAdmission`: a queued request's slot.
    Admission,
    /// `AwaitPrefill`: the outcome of the prefill half the control plane sent.
    Prefill,
    /// `AwaitPrefill` again, bounded by the decode-error grace.
    Grace,
    /// `Complete` of a failed answer, which waits for it.
    Outcome,
    /// `Complete` of the request's end, sent while the VM has no session
    /// (its first requests); the answer's last bytes wait for it.
    End,
    /// The prefill half the filter sent itself (outage fallback).
    LocalPrefill,
}

/// One request's calls in flight. Each is known to the VM too
/// ([`CallOwners`]): the SDK hands a call's answer to the context that was
/// active when it went out, which is the root's when the root acted for
/// this request (an answer on the session stream, or its loss when the
/// stream broke, sets off the next call), and the root must find the
/// request to pass the answer on. Envoy's call tokens carry their kind in
/// their low bits, so HTTP and gRPC tokens never collide.
pub(super) struct Calls {
    context: u32,
    owners: CallOwners,
    in_flight: Vec<(u32, Call)>,
}

impl Calls {
    /// No calls yet of HTTP context `context`.
    pub(super) fn new(context: u32, owners: CallOwners) -> Self {
        Calls {
            context,
            owners,
            in_flight: Vec::new(),
        }
    }

    /// Call `token` went out.
    pub(super) fn track(&mut self, token: u32, call: Call) {
        self.in_flight.push((token, call));
        self.owners.own(token, self.context);
    }

    /// Forgets and returns the call `token` answered, if it is ours.
    pub(super) fn take(&mut self, token: u32) -> Option<Call> {
        self.owners.disown(token);
        let at = self.in_flight.iter().position(|(t, _)| *t == token)?;
        Some(self.in_flight.swap_remove(at).1)
    }

    /// Forgets the calls that `which` picks: their answers, if they still
    /// come, are ignored.
    pub(super) fn forget(&mut self, which: impl Fn(Call) -> bool) {
        let owners = &self.owners;
        self.in_flight.retain(|(token, call)| {
            let keep = !which(*call);
            if !keep {
                owners.disown(*token);
            }
            keep
        });
    }

    /// Forgets every call (the request is gone).
    pub(super) fn forget_all(&mut self) {
        self.forget(|_| true);
    }
}
