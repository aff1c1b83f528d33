//! Prefill/decode disaggregation and data-parallel ranks: the fields the
//! router writes into request bodies, the request ids it makes up, and the
//! prefill half of the PD fan-out, which the control plane sends itself while
//! Envoy carries the decode half.

mod fields;
mod prefill;
mod rid;

pub use fields::{
    as_pairs, batch_size, dp_fields, pd_fields, unit, wants_input_logprobs, wire_code,
    wire_profile, PdFields,
};
pub use prefill::{PrefillDispatcher, PrefillJob};
pub use rid::RidSource;
