//! Benchmarks of sglang-envoy against sglang-router (the peer): a load
//! generator (closed loop for overhead, streamed SSE answers and PD mode,
//! open-loop Poisson replay of a multi-turn chat schedule for routing
//! quality), process management for the contenders (PD fleets too, and
//! several control planes behind one Envoy, their decision histograms read
//! from `/metrics`), the SSE answer of the streaming case, fixtures for the
//! criterion benches of the decision engine, and the report written to
//! `docs/benchmarks.md`.
//! `scripts/bench.sh` runs it all; every parameter is in [`params`].

pub mod envoy;
pub mod fixture;
pub mod loadgen;
pub mod params;
pub mod procs;
pub mod prom;
pub mod quality;
pub mod replicas;
pub mod report;
pub mod results;
pub mod scenarios;
pub mod shapes;
pub mod sse;
pub mod stats;
pub mod trace;
pub mod workload;
