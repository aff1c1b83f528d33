//! Sequence tracking for one publisher (one worker's DP rank).
//!
//! SGLang numbers batches with `itertools.count()` per publisher process:
//! 0, 1, 2, ... with no epoch, so a restart shows up only as the numbers
//! going back. PUB/SUB drops messages silently when a high-water mark is
//! hit, so a jump forward means batches were lost.

/// What one sequence number says about the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    /// The first number seen from this publisher.
    First,
    /// Exactly one more than the last.
    InOrder,
    /// Numbers were skipped: `missed` batches between the last and this one
    /// were never seen (a replay from `last + 1` can recover them while the
    /// publisher's ring buffer still holds them).
    Gap {
        /// How many were skipped.
        missed: u64,
    },
    /// Lower than the last, or the same again: the publisher restarted and
    /// its cache is new. (A PUB/SUB stream never repeats a message, and
    /// this crate's replays ask only for numbers not yet seen, so the same
    /// number twice is a new process that got as far, e.g. a worker that
    /// restarted after publishing only its batch 0.)
    /// The new process counts from 0, so a first number above 0 means its
    /// first `missed` batches were never seen (a replay from 0 can recover
    /// them).
    Restart {
        /// Batches of the new process skipped before this one.
        missed: u64,
    },
}

/// The last sequence number seen from one publisher.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqTracker {
    last: Option<i64>,
}

impl SeqTracker {
    /// A tracker that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The last number accepted.
    pub fn last(&self) -> Option<i64> {
        self.last
    }

    /// Classify `seq` and remember it.
    pub fn observe(&mut self, seq: i64) -> SeqStatus {
        let status = match self.last {
            None => SeqStatus::First,
            Some(last) if seq <= last => SeqStatus::Restart {
                missed: u64::try_from(seq).unwrap_or(0),
            },
            Some(last) => {
                // seq > last here, so the difference is positive; i128 keeps
                // it exact across the whole i64 range.
                let diff = i128::from(seq) - i128::from(last);
                if diff == 1 {
                    SeqStatus::InOrder
                } else {
                    SeqStatus::Gap {
                        missed: u64::try_from(diff - 1).unwrap_or(u64::MAX),
                    }
                }
            }
        };
        self.last = Some(seq);
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_every_transition() {
        let mut t = SeqTracker::new();
        assert_eq!(t.observe(0), SeqStatus::First);
        assert_eq!(t.observe(1), SeqStatus::InOrder);
        assert_eq!(t.observe(1), SeqStatus::Restart { missed: 1 });
        assert_eq!(t.observe(2), SeqStatus::InOrder);
        assert_eq!(t.observe(5), SeqStatus::Gap { missed: 2 });
        assert_eq!(t.last(), Some(5));
        assert_eq!(t.observe(0), SeqStatus::Restart { missed: 0 });
        assert_eq!(t.observe(1), SeqStatus::InOrder);
        assert_eq!(t.observe(7), SeqStatus::Gap { missed: 5 });
        // Back to 2: a new process whose batches 0 and 1 were lost.
        assert_eq!(t.observe(2), SeqStatus::Restart { missed: 2 });
        assert_eq!(t.observe(3), SeqStatus::InOrder);
        assert_eq!(
            t.observe(i64::MAX),
            SeqStatus::Gap {
                missed: (i64::MAX - 4) as u64
            }
        );
    }
}
