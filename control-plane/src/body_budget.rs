//! The request bodies the ext_proc front door lets Envoy hold at once.
//!
//! Envoy buffers each inference request's body (BUFFERED mode) and keeps it
//! until the worker has read it. Many large bodies at once, or a stalled
//! fleet that never reads them, would grow Envoy (and, for the moment a body
//! is being routed, the control plane) without bound. Each request holds its
//! body's size here, from its head when it declares a content-length (Envoy
//! would otherwise gather a body that cannot fit before we see it), else as
//! its bytes arrive, until its worker answers or the request ends; a body
//! that does not fit gets a JSON 503. The wasm
//! filter keeps the same kind of budget per VM (`filter/src/budget.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes of bodies held, against a limit (`--ext-proc-max-buffered-bytes`).
#[derive(Debug)]
pub struct BodyBudget {
    used: AtomicUsize,
    limit: usize,
}

impl BodyBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(BodyBudget {
            used: AtomicUsize::new(0),
            limit,
        })
    }

    /// Holds `bytes` until the returned guard is dropped; `None` when the
    /// budget cannot hold them.
    pub fn hold(self: &Arc<Self>, bytes: usize) -> Option<BodyHold> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .ok()?;
        Some(BodyHold {
            budget: self.clone(),
            bytes,
        })
    }

    /// Bytes held right now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// One request's body in the budget; released when dropped.
#[derive(Debug)]
pub struct BodyHold {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl BodyHold {
    /// Bytes this hold keeps.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for BodyHold {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_share_the_limit_and_give_back() {
        let budget = BodyBudget::new(100);
        let a = budget.hold(60).unwrap();
        assert!(budget.hold(41).is_none());
        let b = budget.hold(40).unwrap();
        assert_eq!(budget.used(), 100);
        drop(a);
        assert_eq!(budget.used(), 40);
        drop(b);
        assert_eq!(budget.used(), 0);
        assert!(budget.hold(usize::MAX).is_none());
    }
}
