//! What a front door tells the lifecycle: what it can do, the heads it
//! sees, and where the request can be read again.

use std::borrow::Cow;

use crate::client_key::ClientKey;

/// What a front door can and cannot do, where the two differ.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Largest request body accepted; larger ones get 413.
    pub max_body_bytes: usize,
    /// The front door is shown the answer's body while it holds the
    /// answer's head (the wasm filter: Envoy keeps calling it; ext_proc:
    /// Envoy sends nothing until the head is answered). Decides whether a
    /// merge may wait, head held, for the body's first event.
    pub body_while_head_held: bool,
    /// `--api-key`: inference requests without it are refused (401)
    /// before their body is read. `None`: not required, or not known yet
    /// (the control plane's own check then stands).
    pub client_key: Option<ClientKey>,
}

/// What the lifecycle needs of the request head.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// `:method`
    pub method: &'a str,
    /// `:path`, query included.
    pub path: &'a str,
    /// No body follows.
    pub end_of_stream: bool,
    /// `content-length`, when present and a number.
    pub content_length: Option<usize>,
    /// `x-request-id`, empty when absent.
    pub request_id: &'a str,
    /// sglang-router's sticky-session key (`X-SMG-Routing-Key`), empty
    /// when absent.
    pub routing_key: &'a str,
    /// `authorization`, empty when absent.
    pub authorization: &'a str,
    /// W3C `traceparent`, empty when absent.
    pub traceparent: &'a str,
    /// The tenant header's value (the header the control plane names),
    /// empty when absent.
    pub tenant: &'a str,
    /// smg's `x-smg-priority`, empty when absent.
    pub priority: &'a str,
    /// The client's address as Envoy saw it, empty when unknown.
    pub client_address: &'a str,
}

/// What the lifecycle knows of the answer's head.
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead {
    /// `:status`
    pub status: u32,
    /// `content-type` is `text/event-stream`.
    pub sse: bool,
    /// No body follows.
    pub end_of_stream: bool,
}

/// Where the lifecycle reads the request from when it needs it again. The
/// filter reads Envoy's buffer (and keeps no copy), ext_proc its own.
pub trait Source {
    /// The body's length, without reading it.
    fn body_len(&self) -> usize;
    /// The whole request body.
    fn body(&self) -> Cow<'_, [u8]>;
    /// The client's headers, without pseudo-headers.
    fn headers(&self) -> Vec<(String, String)>;
}
