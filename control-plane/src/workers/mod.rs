//! The workers the control plane routes to ([`sglang_envoy_core::workers`]),
//! and what reaches them over the network: the one HTTP client for workers,
//! their server info, health probes, and their own load reports.

mod client;
mod discovery;
mod health;
mod load_monitor;

pub use client::{error_chain, worker_client, WorkerClientError, WorkerTls};
pub use discovery::{
    ask_server_info, served_model, server_facts, server_info, DiscoveryError, ServerInfo,
};
pub use health::{HealthChecker, HealthOptions};
pub use load_monitor::LoadMonitor;
pub use sglang_envoy_core::workers::*;
