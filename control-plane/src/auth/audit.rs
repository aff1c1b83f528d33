//! `--control-plane-audit-enabled`: one structured log event per attempt
//! to change the fleet, under its own target so operators can route it
//! apart (`RUST_LOG=sglang_envoy_control_plane::audit=info`).

use tracing::info;

/// The log target audit events use.
pub const TARGET: &str = "sglang_envoy_control_plane::audit";

/// What became of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Authenticated and allowed.
    Allowed,
    /// Refused: no credentials, bad ones, or not an admin.
    Denied,
}

/// Writes audit events when enabled.
#[derive(Debug, Clone, Copy, Default)]
pub struct Audit {
    enabled: bool,
}

impl Audit {
    /// An audit log that writes when `enabled`.
    pub fn new(enabled: bool) -> Audit {
        Audit { enabled }
    }

    /// True when events are written.
    pub fn enabled(self) -> bool {
        self.enabled
    }

    /// Records one attempt. Values come from clients, so they are logged
    /// as debug-escaped strings (no control characters reach the log) and
    /// cut to a bounded length.
    pub fn record(self, outcome: Outcome, principal: &str, method: &str, path: &str, detail: &str) {
        if !self.enabled {
            return;
        }
        info!(
            target: TARGET,
            outcome = ?outcome,
            principal = ?bounded(principal),
            method = ?bounded(method),
            path = ?bounded(path),
            detail = ?bounded(detail),
            "control plane audit"
        );
    }
}

/// At most 256 characters of `s`.
fn bounded(s: &str) -> &str {
    match s.char_indices().nth(256) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_values_are_cut() {
        let long = "é".repeat(300);
        assert_eq!(super::bounded(&long).chars().count(), 256);
        assert_eq!(super::bounded("short"), "short");
    }
}
