//! The state of a VM's stream to the control plane, and its moves: when the
//! next stream is due, whether questions wait for one, and what a break
//! leads to (an at-once reopening or a backoff).

use std::time::{Duration, SystemTime};

/// First wait before reopening a broken stream; doubled on each failure.
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait before reopening.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// A stream that was up and broke is reopened on the root's next tick, up
/// to this many times in a row while each try fails, before the backoff
/// starts; questions wait for these tries. A try may reach the dead
/// replica again: Envoy ejects it on the first refused connection, but
/// each worker thread learns that a moment later, and the cluster's round
/// robin may pick it once more in between (measured: with 3 replicas, 1
/// kill in 8 saw two tries in a row refused). A VM's first stream gets
/// them too: its round robin may pick a draining replica first.
pub(super) const QUICK_TRIES: u8 = 3;
/// The longest root tick a VM's first questions wait for (the first
/// stream opens on the tick); with a longer one they take calls.
pub(super) const FIRST_WAIT_MAX_TICK: Duration = Duration::from_millis(100);
/// An opening the control plane has not answered after this long is given
/// up, and the next try goes at once: a live one answers within a few
/// milliseconds, and one whose address is gone (its container stopped)
/// would hold the questions waiting on it until Envoy's connect timeout
/// (1 s), past their deadline (`route_timeout_ms`, 500 ms by default).
pub(super) const OPENING_PATIENCE: Duration = Duration::from_millis(200);
/// A stream up at least this long had worked when it breaks: its next one
/// is opened at once. One that breaks sooner (a control plane that answers
/// and then drops every session) keeps backing off.
const STEADY: Duration = Duration::from_secs(1);

/// The state of the VM's stream to the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Link {
    /// The VM's first stream is being opened, on the root's next tick
    /// (`opening: None`) or under way (`Some(token)`), with `tries` left
    /// counting this one: a replica that refuses it (draining) is followed
    /// by another try at once, one of the [`QUICK_TRIES`], as after a
    /// break. With `questions_wait` (a tick of at most
    /// [`FIRST_WAIT_MAX_TICK`], as by default), questions wait for it
    /// rather than take calls of their own, and the root makes no call
    /// meanwhile: a VM that has no stream yet has no worker list either,
    /// and a call could reach the draining replica, whose refusals close
    /// the calls' gate (`reach.rs`) while another replica would answer.
    First {
        questions_wait: bool,
        tries: u8,
        opening: Option<(u32, SystemTime)>,
    },
    /// No stream. The next attempt is due at `retry_at`. With `quick`
    /// above 0, a stream that worked just broke and the next is due at
    /// once (the root's next tick), one of the [`QUICK_TRIES`]: questions
    /// wait for it rather than take calls of their own. `quick` counts
    /// that try and the ones left after it.
    Down {
        retry_at: SystemTime,
        backoff: Duration,
        quick: u8,
    },
    /// Opened at `since`; the control plane has not answered its opening
    /// yet: questions wait for it. `quick`: as the `Down` it came from.
    Opening {
        token: u32,
        since: SystemTime,
        backoff: Duration,
        quick: u8,
    },
    /// The control plane answered (at `since`): questions and ends go on
    /// it. `backoff` is the opening's, for a stream that breaks too soon.
    /// `ends_ride`: its control plane takes ends with the next message.
    Up {
        token: u32,
        since: SystemTime,
        backoff: Duration,
        ends_ride: bool,
    },
}

impl Link {
    /// A fresh VM's: its first stream due on the next tick.
    pub(super) fn first(questions_wait: bool) -> Link {
        Link::First {
            questions_wait,
            tries: QUICK_TRIES,
            opening: None,
        }
    }

    /// True when a question asked at `now` goes on the stream: it is up,
    /// opening, or about to be reopened (the question waits for it).
    pub(super) fn takes_questions(self, now: SystemTime) -> bool {
        match self {
            Link::First { questions_wait, .. } => questions_wait,
            Link::Down {
                retry_at, quick, ..
            } => quick > 0 && retry_at <= now,
            Link::Opening { .. } | Link::Up { .. } => true,
        }
    }

    /// True when no stream is open and the next attempt is due at `now`.
    pub(super) fn due(self, now: SystemTime) -> bool {
        match self {
            Link::First { opening, .. } => opening.is_none(),
            Link::Down { retry_at, .. } => retry_at <= now,
            Link::Opening { .. } | Link::Up { .. } => false,
        }
    }

    /// The stream `token` was opened at `now`.
    pub(super) fn opened(self, token: u32, now: SystemTime) -> Link {
        match self {
            Link::First {
                questions_wait,
                tries,
                ..
            } => Link::First {
                questions_wait,
                tries,
                opening: Some((token, now)),
            },
            Link::Down { backoff, quick, .. } => Link::Opening {
                token,
                since: now,
                backoff,
                quick,
            },
            Link::Opening { .. } | Link::Up { .. } => Link::Opening {
                token,
                since: now,
                backoff: FIRST_BACKOFF,
                quick: 0,
            },
        }
    }

    /// The stream whose opening is still unanswered at `now`, past
    /// [`OPENING_PATIENCE`]: to be given up.
    pub(super) fn overdue(self, now: SystemTime) -> Option<u32> {
        let (token, since) = match self {
            Link::First {
                opening: Some(opening),
                ..
            } => opening,
            Link::Opening { token, since, .. } => (token, since),
            Link::First { opening: None, .. } | Link::Down { .. } | Link::Up { .. } => return None,
        };
        (now >= since + OPENING_PATIENCE).then_some(token)
    }

    /// The control plane answered the opening of stream `token` at `now`.
    pub(super) fn confirmed(self, token: u32, now: SystemTime, ends_ride: bool) -> Link {
        let up = |backoff| Link::Up {
            token,
            since: now,
            backoff,
            ends_ride,
        };
        match self {
            Link::First {
                opening: Some((t, _)),
                ..
            } if t == token => up(FIRST_BACKOFF),
            Link::Opening {
                token: t, backoff, ..
            } if t == token => up(backoff),
            other => other,
        }
    }

    /// True when `token` is the current stream.
    pub(super) fn owns(self, token: u32) -> bool {
        match self {
            Link::First { opening, .. } => opening.is_some_and(|(t, _)| t == token),
            Link::Opening { token: t, .. } | Link::Up { token: t, .. } => t == token,
            Link::Down { .. } => false,
        }
    }

    /// The stream broke (or could not be opened) at `now`: the next state.
    pub(super) fn broke(self, now: SystemTime) -> Link {
        let backing_off = |backoff: Duration| {
            let wait = backoff.max(FIRST_BACKOFF);
            Link::Down {
                retry_at: now + wait,
                backoff: next_backoff(wait),
                quick: 0,
            }
        };
        match self {
            // The first stream was refused: the next try at once, while
            // there are tries left.
            Link::First {
                questions_wait,
                tries,
                ..
            } if tries > 1 => Link::First {
                questions_wait,
                tries: tries - 1,
                opening: None,
            },
            Link::First { .. } => backing_off(FIRST_BACKOFF),
            // It had worked: its replica may be gone, another may be up.
            Link::Up { since, .. } if now >= since + STEADY => Link::Down {
                retry_at: now,
                backoff: Duration::ZERO,
                quick: QUICK_TRIES,
            },
            // A quick try reached no control plane: the next one at once,
            // while there are tries left.
            Link::Opening { quick, .. } if quick > 1 => Link::Down {
                retry_at: now,
                backoff: Duration::ZERO,
                quick: quick - 1,
            },
            Link::Up { backoff, .. }
            | Link::Opening { backoff, .. }
            | Link::Down { backoff, .. } => backing_off(backoff),
        }
    }

    /// True while the VM's first stream is being tried (one is opening,
    /// or one was refused and the next is due) and its questions wait for
    /// it. The root makes no call then: with two replicas, a call between
    /// every two tries moves the thread's round robin on by one, and every
    /// try goes to the same replica, the one refusing them (measured: all
    /// three tries of a VM's first stream refused, in most rounds of
    /// `replica_calls::questions_waiting_on_a_first_session_a_replica_refuses_are_answered`).
    /// Not before the first try: a VM opens its stream with its first
    /// request, and until then its worker list must be polled, or a first
    /// question whose stream hangs has nothing to fall back on (the
    /// compose HA test saw that 503). A stream that worked and broke holds
    /// no call either: its ends must not wait.
    pub(super) fn first_tries(self) -> bool {
        match self {
            Link::First {
                questions_wait,
                tries,
                opening,
            } => questions_wait && (opening.is_some() || tries < QUICK_TRIES),
            Link::Down { .. } | Link::Opening { .. } | Link::Up { .. } => false,
        }
    }

    /// True when the questions of a broken stream wait for the next: it is
    /// one of the quick tries, due now.
    pub(super) fn retries_now(self) -> bool {
        match self {
            Link::First { opening, .. } => opening.is_none(),
            Link::Down { quick, .. } => quick > 0,
            Link::Opening { .. } | Link::Up { .. } => false,
        }
    }
}

/// The wait after a try that waited `wait` failed: doubled up to the cap.
fn next_backoff(wait: Duration) -> Duration {
    (wait * 2).min(MAX_BACKOFF)
}
