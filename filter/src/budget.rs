//! The memory a wasm VM may spend on request bodies it holds.
//!
//! A request's body stays in Envoy's buffer, and is copied into the VM while
//! it is validated, from its first byte until its worker starts answering.
//! Without a bound, many large bodies at once (or a stalled fleet that never
//! answers) grow the VM until an allocation fails, and a VM that traps stays
//! dead for every later request on its Envoy thread. So every request
//! reserves its body's size here and gives it back when the worker answers
//! or the request ends; a body that does not fit is refused with a JSON 503
//! instead.

use std::cell::Cell;
use std::rc::Rc;

/// The budget of one VM (one Envoy worker thread), shared by its requests.
#[derive(Clone, Debug)]
pub struct Budget {
    used: Rc<Cell<usize>>,
    limit: usize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Budget {
            used: Rc::new(Cell::new(0)),
            limit,
        }
    }

    /// Bytes reserved right now.
    pub fn used(&self) -> usize {
        self.used.get()
    }

    /// An empty reservation against this budget.
    pub fn reservation(&self) -> Reservation {
        Reservation {
            budget: self.clone(),
            bytes: 0,
        }
    }
}

/// One request's share of the budget; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Budget,
    bytes: usize,
}

impl Reservation {
    /// Grows the reservation to `total` bytes. False, with nothing changed,
    /// when the budget cannot hold that.
    pub fn grow_to(&mut self, total: usize) -> bool {
        if total <= self.bytes {
            return true;
        }
        let extra = total - self.bytes;
        let used = self.budget.used.get();
        if used.saturating_add(extra) > self.budget.limit {
            return false;
        }
        self.budget.used.set(used + extra);
        self.bytes = total;
        true
    }

    /// Gives the reserved bytes back.
    pub fn release(&mut self) {
        let used = self.budget.used.get();
        self.budget.used.set(used.saturating_sub(self.bytes));
        self.bytes = 0;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_the_limit_and_give_back() {
        let budget = Budget::new(100);
        let mut a = budget.reservation();
        let mut b = budget.reservation();
        assert!(a.grow_to(60));
        assert!(!b.grow_to(41), "over the limit");
        assert_eq!(budget.used(), 60);
        assert!(b.grow_to(40));
        assert!(a.grow_to(50), "shrinking is a no-op");
        assert_eq!(budget.used(), 100);
        a.release();
        assert_eq!(budget.used(), 40);
        drop(b);
        assert_eq!(budget.used(), 0);
        drop(a);
        assert_eq!(budget.used(), 0);
    }
}
