use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use sglang_envoy_proto::Completion;

/// Most completions kept while the control plane cannot be reached; past it
/// the oldest are dropped (a restarted control plane starts from zero loads
/// anyway, so they would be stale).
const MAX_PENDING: usize = 65_536;

/// Finished requests waiting to be reported. One per wasm VM (Envoy worker
/// thread), shared by the root context and its HTTP contexts; the VM is
/// single-threaded, so `Rc<RefCell<..>>` is enough.
#[derive(Clone, Default)]
pub struct CompletionQueue(Rc<RefCell<VecDeque<Completion>>>);

impl CompletionQueue {
    /// Queues one finished request.
    pub fn push(&self, c: Completion) {
        let mut q = self.0.borrow_mut();
        if q.len() >= MAX_PENDING {
            q.pop_front();
        }
        q.push_back(c);
    }

    /// Takes up to `max` queued completions.
    pub fn take(&self, max: usize) -> Vec<Completion> {
        let mut q = self.0.borrow_mut();
        let n = q.len().min(max);
        q.drain(..n).collect()
    }

    /// Puts back completions whose report failed, ahead of newer ones.
    pub fn requeue(&self, batch: Vec<Completion>) {
        let mut q = self.0.borrow_mut();
        for c in batch.into_iter().rev() {
            if q.len() >= MAX_PENDING {
                break;
            }
            q.push_front(c);
        }
    }

    /// True when nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(ticket: u64) -> Completion {
        Completion {
            ticket,
            ..Default::default()
        }
    }

    #[test]
    fn take_and_requeue_keep_order() {
        let q = CompletionQueue::default();
        for t in 1..=5 {
            q.push(c(t));
        }
        let first = q.take(3);
        assert_eq!(
            first.iter().map(|c| c.ticket).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        q.requeue(first);
        let all = q.take(10);
        assert_eq!(
            all.iter().map(|c| c.ticket).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        assert!(q.is_empty());
    }
}
