//! The gRPC health service (`grpc.health.v1.Health`) on the gRPC port, as
//! the Gateway API Inference Extension's endpoint picker protocol asks of a
//! picker: gateways and Kubernetes probes check these names before they
//! send requests (`deploy/`, docs: "use it as your InferencePool's endpoint
//! picker").

use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::ServingStatus;

use crate::shutdown::Drain;

/// The service names answered, each `SERVING` while the control plane runs:
/// the whole server (`""`), the picker protocol's `liveness`, `readiness`
/// and `inference-extension`, and the ext_proc service itself.
///
/// Readiness does not wait for a healthy worker: with none, each request
/// gets the protocol's 503, which a gateway failing over to another picker
/// replica would not improve.
pub const SERVICES: [&str; 5] = [
    "",
    "liveness",
    "readiness",
    "inference-extension",
    "envoy.service.ext_proc.v3.ExternalProcessor",
];

/// The one name still `SERVING` while the control plane drains: it is
/// alive, and a liveness probe that restarted it would cut short the work
/// it is waiting for (`shutdown.rs`).
const ALIVE: &str = "liveness";

/// The health service, every name in [`SERVICES`] serving until `drain`
/// starts; from then on every one but [`ALIVE`] is `NOT_SERVING`, so that
/// a gateway checking it sends its next requests to another replica.
pub async fn service(drain: &Drain) -> HealthServer<impl Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    for name in SERVICES {
        reporter
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    let drained = drain.started();
    tokio::spawn(async move {
        drained.await;
        for name in SERVICES.into_iter().filter(|name| *name != ALIVE) {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
    });
    service
}
