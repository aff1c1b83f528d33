//! What a decision tells the other control planes (`--fleet-store-url`,
//! `shared_tree.rs`): the units whose trees recorded the question's
//! routing text, then the text itself.
//!
//! The decision only notes the units ([`Shares`]); the text is handed to
//! the outbox after it, by the caller that owns the question. A front door
//! gives its question up ([`Engine::route_owned`]), so the text moves into
//! the outbox without a copy. Copying it inside the decision (a few KB per
//! question, allocated there and freed on the sync task's thread) had
//! added 4 us to the median decision of a control plane with the store
//! (15.8 vs 19.7 us; docs/benchmarks.md, "Several control planes").

use std::sync::Arc;

use sglang_envoy_lifecycle::{Answer, Question};

use super::Engine;
use crate::policy::Policy;
use crate::shared_tree::MAX_TEXT;
use crate::workers::Worker;

/// The units one decision sent its routing text to, whose trees are
/// shared: at most two (PD's prefill and decode).
#[derive(Default)]
pub(super) struct Shares([Option<Arc<Worker>>; 2]);

impl Shares {
    fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

impl Engine {
    /// Answers `q`, which the caller gives up: its routing text goes to the
    /// other control planes without a copy. The front doors call this.
    pub fn route_owned(&self, mut q: Question) -> Answer {
        let mut shares = Shares::default();
        let answer = self.route_noting(&q, &mut shares);
        self.send_shares(shares, || std::mem::take(&mut q.routing_text));
        answer
    }

    /// Notes in `shares` that `policy` just recorded the question's text as
    /// sent to `unit`, when its trees are shared and it keeps one.
    pub(super) fn note_share(
        &self,
        policy: &dyn Policy,
        unit: &Arc<Worker>,
        text: &[u8],
        shares: &mut Shares,
    ) {
        if self.shared_tree.is_none() || text.is_empty() || !policy.keeps_tree() {
            return;
        }
        if let Some(slot) = shares.0.iter_mut().find(|s| s.is_none()) {
            *slot = Some(unit.clone());
        }
    }

    /// Hands the routing text (from `text`, called only when there is
    /// something to share) to the outbox for each unit of `shares`.
    pub(super) fn send_shares(&self, shares: Shares, text: impl FnOnce() -> Vec<u8>) {
        let Some(outbox) = &self.shared_tree else {
            return;
        };
        if shares.is_empty() {
            return;
        }
        let mut text = text();
        if text.len() > MAX_TEXT {
            // A copy of the cut: the outbox must not hold a whole large
            // prompt's allocation for its first 32 KB.
            text = text[..MAX_TEXT].to_vec();
        }
        let mut units = shares.0.into_iter().flatten().peekable();
        while let Some(unit) = units.next() {
            let own = if units.peek().is_some() {
                text.clone()
            } else {
                std::mem::take(&mut text)
            };
            if !outbox.record(&unit.url, own) {
                self.metrics.shared_tree("dropped", 1);
            }
        }
    }
}
