use sglang_envoy_body::{openai_error_json, Refusal};

/// An answer the router gives the client itself: an OpenAI-shaped JSON
/// error with its HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    /// HTTP status.
    pub status: u16,
    /// OpenAI error `type` (also sent in [`crate::names::ERROR_HEADER`]).
    pub kind: String,
    /// Error message.
    pub message: String,
}

impl LocalReply {
    /// A reply of `status` with error type `kind`.
    pub fn new(status: u16, kind: &str, message: impl Into<String>) -> Self {
        LocalReply {
            status,
            kind: kind.to_string(),
            message: message.into(),
        }
    }

    /// The control plane cannot be reached and nothing can be routed
    /// without it.
    pub fn unreachable() -> Self {
        LocalReply::new(
            503,
            "service_unavailable",
            "the router's control plane cannot be reached",
        )
    }

    /// The control plane's answer cannot be read.
    pub fn unreadable() -> Self {
        LocalReply::new(
            502,
            "bad_gateway",
            "the router's control plane sent an unreadable answer",
        )
    }

    /// The body of the reply.
    pub fn json(&self) -> String {
        openai_error_json(self.status, &self.kind, &self.message)
    }
}

impl From<Refusal> for LocalReply {
    fn from(r: Refusal) -> Self {
        LocalReply {
            status: r.status,
            kind: r.kind.to_string(),
            message: r.message,
        }
    }
}
