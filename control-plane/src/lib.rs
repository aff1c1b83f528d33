//! The sglang-envoy control plane as a library: the binary in `main.rs` wires
//! these pieces together; benchmarks and tests use them directly.
//!
//! Data flow: the filter's routing question (on its long-lived `session`
//! stream, or the `Route` call of `service`) reaches the `engine`,
//! which reads the healthy `workers` snapshot, asks the `policy` (which may
//! consult the radix `tree` or the client's `routing_key`), counts load
//! under the request's ticket (`tickets`) and answers; the request's end,
//! on the session (or `Complete`), releases the load. `startup` registers the initial workers, `upkeep` runs the
//! background tasks. `xds` publishes the
//! workers to Envoy, `admin` changes them (`enrollment` registers those not
//! reachable yet in the background; `dns` moves those whose DNS name points
//! elsewhere; `auth` says who may), `metrics` reports on all of it.
//! `kv_events` subscribes to the workers' KV cache events and keeps an
//! index of the blocks each DP rank holds (not routed on yet).
//! In PD mode the engine also builds the bootstrap fields and sends the
//! prefill half itself (`pd`), and the filter waits for it (`AwaitPrefill`).
//! `ext_proc` is a second front door over the same engine, for Envoys that
//! run the built-in `ext_proc` filter instead of the wasm filter; it keeps
//! the bodies Envoy holds for it within a `body_budget`. On SIGTERM,
//! `shutdown` drains: sessions move to other replicas, prefills finish.

pub mod admin;
pub mod auth;
pub mod body_budget;
pub mod config;
pub mod dns;
pub mod engine;
pub mod enrollment;
pub mod ext_proc;
pub mod fleet_store;
pub mod grpc_health;
pub mod grpc_runtime;
pub mod grpc_tls;
pub mod k8s;
pub mod kv_events;
pub mod metrics;
pub mod pd;
pub mod policy_flags;
pub mod service;
pub mod session;
pub mod sessions;
pub mod shared_ends;
pub mod shared_loads;
pub mod shared_tree;
pub mod shutdown;
pub mod startup;
pub mod store_link;
pub mod store_stream;
pub mod trace;
pub mod upkeep;
pub mod workers;
pub mod xds;

pub use sglang_envoy_core::{admission, policy, retry, routing_key, tickets, tree};
