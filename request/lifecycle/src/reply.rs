use sglang_envoy_body::{openai_error_json_coded, Refusal};

/// An answer the router gives the client itself: an OpenAI-shaped JSON
/// error with its HTTP status, or (`body`) a JSON answer of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    /// HTTP status.
    pub status: u16,
    /// OpenAI error `type` (also sent in [`crate::names::ERROR_HEADER`]).
    pub kind: String,
    /// Error message.
    pub message: String,
    /// OpenAI error `code` when it is a name (`model_not_found`); empty:
    /// the status.
    pub code: String,
    /// The whole JSON body when the reply is not an error (the model list
    /// over several models); empty: the error built from the fields above.
    pub body: String,
}

impl LocalReply {
    /// A reply of `status` with error type `kind`.
    pub fn new(status: u16, kind: &str, message: impl Into<String>) -> Self {
        LocalReply {
            status,
            kind: kind.to_string(),
            message: message.into(),
            code: String::new(),
            body: String::new(),
        }
    }

    /// A 200 answer with this JSON `body`; `kind` names it in
    /// [`crate::names::ERROR_HEADER`], which marks every reply of the
    /// router's own (Envoy's `local_reply_config` leaves those alone).
    pub fn answer(kind: &str, body: String) -> Self {
        LocalReply {
            body,
            ..LocalReply::new(200, kind, "")
        }
    }

    /// This reply with `code` as its OpenAI error code.
    pub fn with_code(self, code: &str) -> Self {
        LocalReply {
            code: code.to_string(),
            ..self
        }
    }

    /// This reply with `body` as its whole body (see [`LocalReply::body`]).
    pub fn with_body(self, body: String) -> Self {
        LocalReply { body, ..self }
    }

    /// smg's answer to a request for a model no worker serves: 404
    /// `model_not_found`, its message and type.
    pub fn model_not_found(model: &str) -> Self {
        LocalReply::new(
            404,
            "invalid_request_error",
            format!("No worker available for model '{model}'"),
        )
        .with_code("model_not_found")
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
        if !self.body.is_empty() {
            return self.body.clone();
        }
        openai_error_json_coded(self.status, &self.kind, &self.message, &self.code)
    }
}

impl From<Refusal> for LocalReply {
    fn from(r: Refusal) -> Self {
        LocalReply {
            status: r.status,
            kind: r.kind.to_string(),
            message: r.message,
            code: String::new(),
            body: String::new(),
        }
    }
}
