use std::sync::atomic::{AtomicU64, Ordering};

/// Request tickets: a random 64-bit base plus a counter, so that tickets of
/// every Envoy thread, Envoy instance and ext_proc front door sharing a
/// control plane do not collide. Zero is never handed out (it means "no
/// ticket" on the wire).
#[derive(Debug)]
pub struct TicketSource {
    base: u64,
    next: AtomicU64,
}

impl TicketSource {
    /// A source starting from `base` (normally [`crate::random::u64`]).
    pub fn new(base: u64) -> Self {
        TicketSource {
            base,
            next: AtomicU64::new(1),
        }
    }

    /// A fresh non-zero ticket.
    pub fn next(&self) -> u64 {
        loop {
            let ticket = self
                .base
                .wrapping_add(self.next.fetch_add(1, Ordering::Relaxed));
            if ticket != 0 {
                return ticket;
            }
        }
    }
}
