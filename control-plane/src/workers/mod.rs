//! The workers the control plane routes to: who they are, whether they are
//! healthy, and how many requests each has in flight.

mod address;
mod circuit;
mod client;
mod discovery;
mod health;
mod id;
pub mod persist;
mod probe_schedule;
mod registry;
mod worker;

pub use address::{identity, AddressError, AddressPolicy, WorkerAddress};
pub use circuit::{Circuit, CircuitConfig, CircuitState};
pub use client::{error_chain, worker_client, WorkerClientError, WorkerTls};
pub use discovery::{server_facts, server_info, DiscoveryError, ServerInfo};
pub use health::HealthChecker;
pub use id::{BadWorkerId, WorkerId};
pub use registry::{Registry, RegistryError};
pub use worker::{Health, Role, ServerFacts, Worker, WorkerSpec};
