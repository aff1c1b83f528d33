//! Messages (and, with the `grpc` feature, the tonic service) of the contract
//! between the sglang-envoy wasm filter and the control plane. See
//! `router.proto` for what each field means.

#![allow(clippy::doc_lazy_continuation)]

/// Generated from `router.proto`. A session's `Route` question outweighs
/// its other messages; boxing it would change every caller for a few bytes
/// per message on a stream, so the size lint is off for generated code.
#[allow(clippy::large_enum_variant)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/sglang.envoy.router.v1.rs"));
}

pub use v1::*;

/// Fully qualified gRPC service name, as the filter dispatches it.
pub const SERVICE_NAME: &str = "sglang.envoy.router.v1.Router";

/// Initial metadata of a control plane's `Session` answer: it counts the
/// ends that ride up in `SessionUp.ends` (value [`ENDS_RIDE`]). Filters
/// send ends on their own to control planes without it.
pub const ENDS_RIDE_METADATA: &str = "x-sglang-session-ends";

/// The value of [`ENDS_RIDE_METADATA`].
pub const ENDS_RIDE: &str = "ride";

/// Initial metadata of a filter's `Session` request: it reads the answers
/// in `SessionDown.more` (value [`BATCHES`]). A control plane sends each
/// answer in a message of its own to filters without it.
pub const BATCHES_METADATA: &str = "x-sglang-session-batches";

/// The value of [`BATCHES_METADATA`].
pub const BATCHES: &str = "more";

/// The request header carrying a client's sticky-session key (sglang-router's
/// `X-SMG-Routing-Key`, lower-cased as Envoy hands headers over). Both front
/// doors copy it into [`RouteRequest::routing_key`].
pub const ROUTING_KEY_HEADER: &str = "x-smg-routing-key";

/// The request header naming a request's priority class (smg's
/// `X-SMG-Priority`: system, interactive, default or bulk). Both front
/// doors copy it into [`RouteRequest::priority`].
pub const PRIORITY_HEADER: &str = "x-smg-priority";

impl Decision {
    /// The fields to inject, as the `(key, JSON value)` pairs the body
    /// crate's `RequestBody::with_fields` takes (both front doors use it).
    pub fn inject_pairs(&self) -> Vec<(&str, &str)> {
        self.inject
            .iter()
            .map(|f| (f.key.as_str(), f.json_value.as_str()))
            .collect()
    }
}
