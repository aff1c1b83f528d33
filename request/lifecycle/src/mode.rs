//! Whether a request is served by one worker or split between a prefill
//! and a decode worker.

/// Regular routing, or prefill/decode disaggregation for this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One worker serves the request.
    Regular,
    /// A prefill worker runs the prompt, the decode worker Envoy sends the
    /// request to generates the answer.
    Pd,
}

impl Mode {
    /// The mode's name (`regular`, `pd`) in logs, messages and the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Regular => "regular",
            Mode::Pd => "pd",
        }
    }
}
