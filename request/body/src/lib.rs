//! Request bodies as the sglang-envoy filter sees them.
//!
//! The router must forward the client's body byte-for-byte apart from the few
//! top-level fields it injects (sglang-router re-serialises bodies and turns
//! `0.7` into `0.699999988079071`). So nothing here builds a JSON tree: the body
//! is validated once, its top-level fields are located by byte span, the text
//! the routing policies need is pulled out, and injected fields are spliced
//! into the original bytes.

mod error;
mod layout;
mod logprobs;
mod openai_error;
mod parse;
pub mod pd;
mod route;
mod status;
mod text;
pub mod wire;

pub use error::BodyError;
pub use layout::Layout;
pub use logprobs::{merge_first_sse_event, merge_input_logprobs, prefill_input_logprobs, SseMerge};
pub use openai_error::{openai_error_json, openai_error_json_coded};
pub use parse::{RequestBody, MAX_DEPTH, MAX_FIELDS};
pub use route::{is_info_path, over_budget, too_large, Endpoint, Head, Refusal, Route, INFO_PATHS};
pub use status::is_worker_failure;
pub use text::MAX_TEXT_DEPTH;
pub use wire::WireProfile;
