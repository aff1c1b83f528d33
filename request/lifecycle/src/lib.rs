//! The life of one request through the router, without I/O.
//!
//! Both front doors — the proxy-wasm filter inside Envoy and the ext_proc
//! service in the control plane — see the same things happen to a request:
//! its head, its body, the routing decision, in PD mode the prefill half's
//! outcome, the answer's head and body chunks, its end. They differ only in
//! how they hear of them (host callbacks or ext_proc messages) and how they
//! act (host calls or ext_proc replies). This crate holds everything in
//! between: a [`Lifecycle`] per request takes events and returns what to
//! do, as plain values. The front doors translate, nothing more; a change to
//! how a request behaves is made here, once, and unit-tested natively.
//!
//! Also here, so that each exists once: the names both front doors and the
//! Envoy configs share ([`names`]), request tickets ([`TicketSource`]),
//! randomness and request ids ([`random`]), and which client headers go on
//! to a prefill worker ([`headers`]).

mod answer;
mod cached_tokens;
pub mod client_key;
mod completion;
mod front_door;
pub mod headers;
mod lifecycle;
mod mode;
pub mod names;
mod prefill_end;
mod question;
pub mod random;
mod reply;
mod steps;
mod tickets;
pub mod wire;

pub use client_key::ClientKey;
pub use completion::EndFacts;
pub use front_door::{RequestHead, ResponseHead, Settings, Source};
pub use lifecycle::Lifecycle;
pub use mode::Mode;
pub use question::{Answer, Destination, FollowPrefill, Question, Routed, Unrouted};
pub use reply::LocalReply;
pub use steps::{
    BodyStep, Forward, HeadStep, Held, Overdue, PrefillStep, Release, ResponseStep, Step, Watch,
};
pub use tickets::TicketSource;

#[cfg(test)]
mod tests;
