//! The workers the control plane routes to: who they are, whether they are
//! healthy, and how many requests each has in flight.

mod address;
mod circuit;
mod engine_load;
mod id;
pub mod models;
pub mod persist;
pub mod prefill_queue;
pub mod probe_schedule;
mod registry;
mod worker;

pub use address::{identity, AddressError, AddressPolicy, WorkerAddress};
pub use circuit::{Circuit, CircuitConfig, CircuitState};
pub use engine_load::{EngineLoad, Sent};
pub use id::{BadWorkerId, WorkerId};
pub use prefill_queue::PrefillQueue;
pub use registry::{Registry, RegistryError};
pub use worker::{Health, Role, ServerFacts, Worker, WorkerSpec};
