//! A circuit breaker per worker server: consecutive failed requests take it
//! out of rotation for a while, even when its `/health` answers (a worker can
//! fail every request and still look healthy). sglang-router's flags and
//! state machine: `--cb-failure-threshold` consecutive failures open the
//! circuit; after `--cb-timeout-duration-secs` it is half-open and gets
//! requests again; one failure there opens it again, `--cb-success-threshold`
//! successes close it.
//!
//! Unlike sglang-router, a streak only counts failures closer together than
//! `--cb-window-duration-secs` (the peer accepts the flag and ignores it):
//! ten failures spread over a day are not a broken worker. And only answers
//! that say the worker failed count (5xx, 408, 429, no answer), not a
//! client's 4xx.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How the circuits of all workers behave (the `--cb-*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitConfig {
    /// Consecutive failures that open a closed circuit.
    pub failure_threshold: u32,
    /// Consecutive successes that close a half-open circuit.
    pub success_threshold: u32,
    /// How long an open circuit keeps its worker out of rotation.
    pub open_for: Duration,
    /// Failures further apart than this start a new streak.
    pub window: Duration,
    /// `--disable-circuit-breaker`: circuits never open.
    pub enabled: bool,
}

impl Default for CircuitConfig {
    /// sglang-router 0.3.2's defaults.
    fn default() -> Self {
        CircuitConfig {
            failure_threshold: 10,
            success_threshold: 3,
            open_for: Duration::from_secs(60),
            window: Duration::from_secs(120),
            enabled: true,
        }
    }
}

/// The state a circuit reports (`/workers`, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Requests flow.
    Closed,
    /// No new requests until the timeout passes.
    Open,
    /// Requests flow again, on probation.
    HalfOpen,
}

impl CircuitState {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug)]
enum State {
    Closed {
        failures: u32,
        last_failure: Option<Instant>,
    },
    Open {
        since: Instant,
    },
    HalfOpen {
        successes: u32,
    },
}

/// One server's circuit. Changed on every attributed request outcome, so a
/// plain mutex (held for a few instructions) is enough.
#[derive(Debug)]
pub struct Circuit {
    state: Mutex<State>,
}

impl Default for Circuit {
    fn default() -> Self {
        Circuit {
            state: Mutex::new(State::Closed {
                failures: 0,
                last_failure: None,
            }),
        }
    }
}

impl Circuit {
    /// Records one request outcome at `now`. Returns the new state when the
    /// circuit changed state (the routing snapshot must then be rebuilt).
    pub fn record(&self, ok: bool, now: Instant, config: &CircuitConfig) -> Option<CircuitState> {
        if !config.enabled {
            return None;
        }
        let mut state = self.state.lock();
        let next = match (&*state, ok) {
            (State::Closed { .. }, true) => State::Closed {
                failures: 0,
                last_failure: None,
            },
            (
                State::Closed {
                    failures,
                    last_failure,
                },
                false,
            ) => {
                let streak = match last_failure {
                    Some(at) if now.saturating_duration_since(*at) <= config.window => failures + 1,
                    _ => 1,
                };
                if streak >= config.failure_threshold {
                    State::Open { since: now }
                } else {
                    State::Closed {
                        failures: streak,
                        last_failure: Some(now),
                    }
                }
            }
            // Answers to requests sent before it opened change nothing.
            (State::Open { .. }, _) => return None,
            (State::HalfOpen { successes }, true) => {
                if successes + 1 >= config.success_threshold {
                    State::Closed {
                        failures: 0,
                        last_failure: None,
                    }
                } else {
                    State::HalfOpen {
                        successes: successes + 1,
                    }
                }
            }
            (State::HalfOpen { .. }, false) => State::Open { since: now },
        };
        let changed = std::mem::discriminant(&next) != std::mem::discriminant(&*state);
        *state = next;
        changed.then(|| public(&state))
    }

    /// Moves an open circuit whose time is up to half-open. Returns true
    /// when it did.
    pub fn tick(&self, now: Instant, config: &CircuitConfig) -> bool {
        let mut state = self.state.lock();
        match &*state {
            State::Open { since } if now.saturating_duration_since(*since) >= config.open_for => {
                *state = State::HalfOpen { successes: 0 };
                true
            }
            _ => false,
        }
    }

    /// The current state.
    pub fn state(&self) -> CircuitState {
        public(&self.state.lock())
    }

    /// Consecutive failures counted while closed.
    pub fn failures(&self) -> u32 {
        match &*self.state.lock() {
            State::Closed { failures, .. } => *failures,
            _ => 0,
        }
    }

    /// Back to closed (the worker was re-added or recovered its health).
    pub fn reset(&self) {
        *self.state.lock() = State::Closed {
            failures: 0,
            last_failure: None,
        };
    }
}

fn public(state: &State) -> CircuitState {
    match state {
        State::Closed { .. } => CircuitState::Closed,
        State::Open { .. } => CircuitState::Open,
        State::HalfOpen { .. } => CircuitState::HalfOpen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> CircuitConfig {
        CircuitConfig {
            failure_threshold: 3,
            success_threshold: 2,
            open_for: Duration::from_secs(10),
            window: Duration::from_secs(60),
            enabled: true,
        }
    }

    #[test]
    fn opens_after_consecutive_failures_and_recovers_through_half_open() {
        let c = Circuit::default();
        let cfg = config();
        let t = Instant::now();
        assert_eq!(c.record(false, t, &cfg), None);
        assert_eq!(c.record(false, t, &cfg), None);
        assert_eq!(c.failures(), 2);
        assert_eq!(c.record(false, t, &cfg), Some(CircuitState::Open));
        // Late answers of requests sent before it opened change nothing.
        assert_eq!(c.record(true, t, &cfg), None);
        assert!(!c.tick(t + Duration::from_secs(9), &cfg));
        assert!(c.tick(t + Duration::from_secs(10), &cfg));
        assert_eq!(c.state(), CircuitState::HalfOpen);
        assert_eq!(c.record(true, t, &cfg), None);
        assert_eq!(c.record(true, t, &cfg), Some(CircuitState::Closed));
    }

    #[test]
    fn a_failure_while_half_open_opens_again() {
        let c = Circuit::default();
        let cfg = config();
        let t = Instant::now();
        for _ in 0..3 {
            c.record(false, t, &cfg);
        }
        c.tick(t + cfg.open_for, &cfg);
        assert_eq!(c.record(true, t, &cfg), None);
        assert_eq!(c.record(false, t, &cfg), Some(CircuitState::Open));
    }

    #[test]
    fn a_success_or_a_gap_longer_than_the_window_breaks_the_streak() {
        let c = Circuit::default();
        let cfg = config();
        let t = Instant::now();
        c.record(false, t, &cfg);
        c.record(false, t, &cfg);
        c.record(true, t, &cfg);
        assert_eq!(c.record(false, t, &cfg), None);
        assert_eq!(c.failures(), 1);
        c.record(false, t, &cfg);
        let later = t + cfg.window + Duration::from_secs(1);
        assert_eq!(c.record(false, later, &cfg), None, "a new streak");
        assert_eq!(c.failures(), 1);
    }

    #[test]
    fn disabled_circuits_never_open() {
        let c = Circuit::default();
        let cfg = CircuitConfig {
            enabled: false,
            ..config()
        };
        for _ in 0..100 {
            assert_eq!(c.record(false, Instant::now(), &cfg), None);
        }
        assert_eq!(c.state(), CircuitState::Closed);
    }
}
