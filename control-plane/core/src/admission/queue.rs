//! The requests waiting for an admission slot: one queue per priority
//! class, first come first served within a class. A free slot goes to the
//! highest class that has a waiter, except that a class whose oldest waiter
//! has waited past its starvation bound goes first (smg's promotion). With
//! the priority scheduler off every request is `Default`, and this is the
//! plain FIFO queue of `--queue-size`.

use std::collections::VecDeque;
use std::time::Instant;

use tokio::sync::oneshot;

use super::class::{Class, ClassQueue};

struct Waiter {
    ticket: u64,
    since: Instant,
    slot: oneshot::Sender<()>,
}

/// The waiting requests, by class.
pub struct Waiting {
    config: [ClassQueue; 4],
    classes: [VecDeque<Waiter>; 4],
}

impl Waiting {
    /// Queues configured per class, indexed by `Class as usize`.
    pub fn new(config: [ClassQueue; 4]) -> Waiting {
        Waiting {
            config,
            classes: Default::default(),
        }
    }

    /// How `class`'s queue behaves.
    pub fn config(&self, class: Class) -> &ClassQueue {
        &self.config[class as usize]
    }

    /// Queues `ticket` in `class`; `false` when that class's queue is full.
    pub fn push(&mut self, class: Class, ticket: u64, slot: oneshot::Sender<()>) -> bool {
        let size = self.config[class as usize].size;
        let queue = &mut self.classes[class as usize];
        if queue.len() >= size {
            return false;
        }
        queue.push_back(Waiter {
            ticket,
            since: Instant::now(),
            slot,
        });
        true
    }

    /// The next waiter a free slot goes to: a starving class's oldest
    /// first (the highest such class), else the highest class's oldest.
    pub fn pop(&mut self) -> Option<(u64, oneshot::Sender<()>)> {
        let starving = Class::ALL.into_iter().rev().find(|c| {
            self.classes[*c as usize]
                .front()
                .is_some_and(|w| w.since.elapsed() >= self.config[*c as usize].starvation)
        });
        let class = starving.or_else(|| {
            Class::ALL
                .into_iter()
                .rev()
                .find(|c| !self.classes[*c as usize].is_empty())
        })?;
        self.classes[class as usize]
            .pop_front()
            .map(|w| (w.ticket, w.slot))
    }

    /// `ticket` leaves the queue (it gave up or ended).
    pub fn remove(&mut self, ticket: u64) {
        for queue in &mut self.classes {
            queue.retain(|w| w.ticket != ticket);
        }
    }

    /// Requests waiting, all classes.
    pub fn len(&self) -> usize {
        self.classes.iter().map(VecDeque::len).sum()
    }

    /// Nobody waits.
    pub fn is_empty(&self) -> bool {
        self.classes.iter().all(VecDeque::is_empty)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn queues(size: usize, starvation: Duration) -> Waiting {
        Waiting::new(Class::ALL.map(|_| ClassQueue {
            size,
            timeout: Duration::from_secs(60),
            starvation,
        }))
    }

    fn push(w: &mut Waiting, class: Class, ticket: u64) -> bool {
        let (tx, _rx) = oneshot::channel();
        w.push(class, ticket, tx)
    }

    #[test]
    fn higher_classes_go_first_and_fifo_within_a_class() {
        let mut w = queues(4, Duration::from_secs(3600));
        for (class, ticket) in [
            (Class::Bulk, 1),
            (Class::Default, 2),
            (Class::Bulk, 3),
            (Class::Interactive, 4),
            (Class::Default, 5),
        ] {
            assert!(push(&mut w, class, ticket));
        }
        let order: Vec<u64> = std::iter::from_fn(|| w.pop().map(|(t, _)| t)).collect();
        assert_eq!(order, vec![4, 2, 5, 1, 3]);
    }

    #[test]
    fn each_class_has_its_own_bound() {
        let mut w = queues(1, Duration::from_secs(3600));
        assert!(push(&mut w, Class::Bulk, 1));
        assert!(!push(&mut w, Class::Bulk, 2), "bulk's queue is full");
        assert!(
            push(&mut w, Class::Interactive, 3),
            "another class still has room"
        );
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn a_starving_class_goes_before_higher_ones() {
        let mut w = queues(4, Duration::ZERO);
        assert!(push(&mut w, Class::Bulk, 1));
        assert!(push(&mut w, Class::System, 2));
        // Every head is past a zero bound: the highest starving class wins.
        assert_eq!(w.pop().map(|(t, _)| t), Some(2));
        let mut w = Waiting::new(Class::ALL.map(|c| ClassQueue {
            size: 4,
            timeout: Duration::from_secs(60),
            starvation: if c == Class::Bulk {
                Duration::ZERO
            } else {
                Duration::from_secs(3600)
            },
        }));
        assert!(push(&mut w, Class::Bulk, 1));
        assert!(push(&mut w, Class::System, 2));
        assert_eq!(w.pop().map(|(t, _)| t), Some(1), "bulk waited too long");
    }
}
