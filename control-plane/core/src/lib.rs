//! What the sglang-envoy control plane decides with, without its network
//! edges (no gRPC, HTTP server or HTTP client here): the `workers` and
//! their health, circuits and loads, the approximate radix `tree`s, the
//! routing `policy`s (and the `stable_hash` the hashing ones place keys
//! with), the `tickets` of requests in flight, `retry` plans
//! and `admission` control. The control plane binary wires these to the
//! world: the gRPC service, ext_proc, EDS, the admin API, health probes
//! and the PD prefill requests.

pub mod admission;
pub mod policy;
pub mod retry;
pub mod routing_key;
pub mod stable_hash;
pub mod tickets;
pub mod tree;
pub mod workers;
