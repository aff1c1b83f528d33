//! What a front door asks the engine about a request, and what it is
//! answered, in the router's own types. `wire.rs` converts them to and from
//! the gRPC contract, at the two gRPC edges (the filter's calls and the
//! control plane's service); the ext_proc front door hands them to the
//! engine as they are.

use crate::reply::LocalReply;

/// A routing question about one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Question {
    /// `:path`, query included.
    pub path: String,
    /// `:method`
    pub method: String,
    /// `x-request-id`, empty when absent.
    pub request_id: String,
    /// The client's sticky-session key (`X-SMG-Routing-Key`), empty when absent.
    pub routing_key: String,
    /// The client's `authorization` (inference requests only; empty when
    /// absent), for the `--api-key` check.
    pub authorization: String,
    /// The client's W3C `traceparent`, empty when absent: the decision's
    /// span joins that trace.
    pub traceparent: String,
    /// The body's `model` field (empty when it has none, or not as a
    /// string): the engine routes to the workers serving it (see
    /// `sglang_envoy_core::workers::models`).
    pub model: String,
    /// The tenant header's value (`--tenant-header-name`; empty when absent
    /// or the front door was not told the header): trusted only with
    /// `--trust-tenant-header`.
    pub tenant: String,
    /// The client's `x-smg-priority`, empty when absent.
    pub priority: String,
    /// The client's address as Envoy saw it, empty when unknown.
    pub client_address: String,
    /// The text the cache-aware policies match on.
    pub routing_text: Vec<u8>,
    /// The client asked for a streamed answer.
    pub stream: bool,
    /// Size of the body the question is about.
    pub body_bytes: u64,
    /// The request's ticket (0: none, nothing is counted).
    pub ticket: u64,
    /// The client's headers, without pseudo-headers (with the body only).
    pub headers: Vec<(String, String)>,
    /// The body itself, when the engine needs it (PD: it builds the prefill
    /// half); empty otherwise.
    pub body: Vec<u8>,
    /// The endpoints (`ip:port`) the request may go to, when the gateway
    /// narrows them (the picker protocol's subset hint; ext_proc only).
    pub subset: Option<Vec<String>>,
    /// How many endpoints the Envoy in front takes in the destination
    /// (ext_proc: from `--destination-endpoints` or the Envoy config; the
    /// wasm filter's own configs take a list).
    pub destination: Destination,
}

/// How many endpoints the Envoy in front takes in a destination
/// (`x-gateway-destination-endpoint`, and `envoy.lb` metadata).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Destination {
    /// Exactly one `ip:port`: an `ORIGINAL_DST` cluster reading the header
    /// (InferencePool gateways that route on it) answers a list with 503.
    One,
    /// The chosen one first, then distinct fallbacks: a cluster whose
    /// `override_host` policy walks the list on retries (this project's
    /// own Envoy configs, and gateways that read `envoy.lb` with it).
    #[default]
    List,
}

/// A decision: where the request goes, and what changes on its way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// The ticket the load is counted under.
    pub ticket: u64,
    /// `ip:port` of the chosen unit first, then those to retry on.
    pub endpoints: Vec<String>,
    /// The chosen unit's URL, for logs.
    pub worker: String,
    /// Top-level fields to splice into the body: (key, JSON value).
    pub inject: Vec<(String, String)>,
    /// Request headers to set (Envoy's retry count and per-try timeout).
    pub request_headers: Vec<(String, String)>,
    /// PD: the prefill half was sent; follow it.
    pub prefill: Option<FollowPrefill>,
    /// Read the cached tokens the worker reports and send them with the
    /// request's end (the control plane's KV-event self-check).
    pub report_cached_tokens: bool,
    /// Report when the answer's first bytes arrive (the worker's prefill
    /// of the request is done): [`crate::Lifecycle::on_response_bytes`].
    pub report_prefilled: bool,
}

/// PD: what to do with the prefill half the engine sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowPrefill {
    /// Merge its input logprobs into the answer (the client asked for them).
    pub merge_input_logprobs: bool,
    /// Its outcome comes on the filter's session unasked (the question
    /// asked for it there): wait for it without asking.
    pub outcome_follows: bool,
}

/// Why a question got no decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unrouted {
    /// An error for the client.
    Rejected(LocalReply),
    /// Admission control queued the request: wait for a slot, at most
    /// `wait_ms`, then ask again.
    Queued {
        /// How long the engine may keep it queued.
        wait_ms: u64,
    },
    /// Ask again with the body and headers attached.
    NeedBody,
}

/// The engine's answer to a [`Question`].
pub type Answer = Result<Routed, Unrouted>;
