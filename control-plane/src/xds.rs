//! Endpoint discovery (EDS) for Envoy's worker cluster.
//!
//! Envoy's `override_host` policy only sends a request to a host that is an
//! endpoint of the cluster, so every registered worker is published here and
//! workers added at run time are usable without restarting Envoy.
//!
//! An `https://` worker's endpoint carries `tls: true` in its
//! `envoy.transport_socket_match` metadata: the worker clusters'
//! `transport_socket_matches` (envoy/envoy.yaml) then open TLS connections
//! to it, and plain ones to every other endpoint. When its URL names it by a
//! DNS name, that name is the endpoint's `hostname`, which Envoy sends as SNI
//! and checks the certificate against (`auto_host_sni`,
//! `auto_sni_san_validation`).

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    address, socket_address, Address, Metadata, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::EndpointDiscoveryService;
use envoy_types::pb::google::protobuf::{value, Any, Struct, Value};
use futures::Stream;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use crate::shutdown::{self, Drain};
use crate::workers::{Registry, Role, Worker};

const CLA_TYPE: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// Serves `StreamEndpoints`: every requested cluster gets all registered workers.
pub struct Eds {
    registry: Arc<Registry>,
    /// Started when this control plane is going away: each stream then
    /// ends (`shutdown.rs`), and Envoy asks another replica.
    drain: Drain,
}

impl Eds {
    /// An EDS server publishing `registry` until `drain` starts.
    pub fn new(registry: Arc<Registry>, drain: Drain) -> Self {
        Eds { registry, drain }
    }
}

/// The cluster of prefill workers; every other cluster name gets the
/// servers Envoy sends requests to.
pub use sglang_envoy_lifecycle::names::PREFILL_CLUSTER;

/// The endpoint metadata namespace Envoy's `transport_socket_matches` read.
pub const TRANSPORT_SOCKET_MATCH: &str = "envoy.transport_socket_match";

/// The key, in [`TRANSPORT_SOCKET_MATCH`], that is `true` on `https://`
/// workers; envoy/envoy.yaml's TLS match is `{ tls: true }`.
pub const TLS_MATCH_KEY: &str = "tls";

/// One worker server as an Envoy endpoint.
fn lb_endpoint(w: &Worker) -> LbEndpoint {
    let metadata = w.tls.then(|| Metadata {
        filter_metadata: [(
            TRANSPORT_SOCKET_MATCH.to_string(),
            Struct {
                fields: [(
                    TLS_MATCH_KEY.to_string(),
                    Value {
                        kind: Some(value::Kind::BoolValue(true)),
                    },
                )]
                .into(),
            },
        )]
        .into(),
        ..Default::default()
    });
    let hostname = match (w.tls, &w.dns_name) {
        (true, Some(name)) => name.clone(),
        _ => String::new(),
    };
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
            address: Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: w.endpoint.ip().to_string(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                        w.endpoint.port(),
                    ))),
                    ..Default::default()
                })),
            }),
            hostname,
            ..Default::default()
        })),
        metadata,
        ..Default::default()
    }
}

fn assignment(registry: &Registry, cluster: &str) -> ClusterLoadAssignment {
    let all = registry.all();
    // Envoy sends requests to regular and decode servers; prefill servers only
    // during a control-plane outage, from their own cluster. Each server once,
    // however many DP ranks it has.
    let prefill = cluster == PREFILL_CLUSTER;
    let mut seen = std::collections::HashSet::new();
    let lb_endpoints = all
        .iter()
        .filter(|w| (w.role() == Role::Prefill) == prefill && seen.insert(w.endpoint))
        .map(|w| lb_endpoint(w))
        .collect();
    ClusterLoadAssignment {
        cluster_name: cluster.to_string(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn response(registry: &Registry, names: &[String], version: u64) -> DiscoveryResponse {
    let resources = names
        .iter()
        .map(|n| Any {
            type_url: CLA_TYPE.to_string(),
            value: assignment(registry, n).encode_to_vec(),
        })
        .collect();
    DiscoveryResponse {
        version_info: version.to_string(),
        resources,
        type_url: CLA_TYPE.to_string(),
        nonce: version.to_string(),
        ..Default::default()
    }
}

type EdsStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl EndpointDiscoveryService for Eds {
    type StreamEndpointsStream = EdsStream<DiscoveryResponse>;
    type DeltaEndpointsStream = EdsStream<DeltaDiscoveryResponse>;

    async fn stream_endpoints(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamEndpointsStream>, Status> {
        let mut inbound = request.into_inner();
        let registry = self.registry.clone();
        let mut changes = registry.subscribe();
        if self.drain.is_started() {
            return Err(shutdown::refusal());
        }
        let drained = self.drain.started();
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            tokio::pin!(drained);
            let mut names: Vec<String> = Vec::new();
            loop {
                let send = tokio::select! {
                    () = &mut drained => break,
                    msg = inbound.message() => match msg {
                        Ok(Some(req)) => {
                            if let Some(err) = &req.error_detail {
                                warn!("Envoy rejected endpoints version {}: {}", req.version_info, err.message);
                            }
                            // Answer the first request and every change of the
                            // subscribed names; ACKs need no answer.
                            let changed = req.resource_names != names || req.response_nonce.is_empty();
                            names = req.resource_names;
                            changed
                        }
                        Ok(None) | Err(_) => break,
                    },
                    changed = changes.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        !names.is_empty()
                    }
                };
                if send {
                    let version = *changes.borrow_and_update();
                    debug!(?names, version, "sending endpoints");
                    if tx
                        .send(Ok(response(&registry, &names, version)))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_endpoints(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaEndpointsStream>, Status> {
        Err(Status::unimplemented(
            "use the state-of-the-world StreamEndpoints",
        ))
    }

    async fn fetch_endpoints(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let names = request.into_inner().resource_names;
        let version = *self.registry.subscribe().borrow();
        Ok(Response::new(response(&self.registry, &names, version)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::{WorkerAddress, WorkerSpec};

    #[test]
    fn assignment_lists_every_server_envoy_talks_to_once() {
        let r = Registry::default();
        let specs = [
            (7001u16, WorkerSpec::REGULAR, None),
            (7002, WorkerSpec::REGULAR, Some(4)),
            (
                7003,
                WorkerSpec::Prefill {
                    bootstrap_port: None,
                },
                None,
            ),
        ];
        for (port, spec, dp) in specs {
            let address = WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
            r.add(address, spec, dp).unwrap();
        }
        let cla = assignment(&r, "sglang_workers");
        assert_eq!(cla.cluster_name, "sglang_workers");
        let ports: Vec<u32> = cla.endpoints[0]
            .lb_endpoints
            .iter()
            .filter_map(|e| match &e.host_identifier {
                Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                    match &ep.address.as_ref()?.address {
                        Some(address::Address::SocketAddress(sa)) => match sa.port_specifier {
                            Some(socket_address::PortSpecifier::PortValue(p)) => Some(p),
                            _ => None,
                        },
                        _ => None,
                    }
                }
                _ => None,
            })
            .collect();
        assert_eq!(ports, [7001, 7002]);
        let prefill = assignment(&r, PREFILL_CLUSTER);
        assert_eq!(prefill.endpoints[0].lb_endpoints.len(), 1);
    }

    fn tls_of(e: &LbEndpoint) -> Option<&Value> {
        e.metadata
            .as_ref()?
            .filter_metadata
            .get(TRANSPORT_SOCKET_MATCH)?
            .fields
            .get(TLS_MATCH_KEY)
    }

    fn hostname_of(e: &LbEndpoint) -> &str {
        match &e.host_identifier {
            Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => &ep.hostname,
            _ => "",
        }
    }

    #[tokio::test]
    async fn https_workers_are_marked_for_envoys_tls_match() {
        let r = Registry::default();
        for url in [
            "http://127.0.0.1:7001",
            "https://127.0.0.1:7002",
            "https://localhost:7003",
        ] {
            let address = WorkerAddress::resolve(url).await.unwrap();
            r.add(address, WorkerSpec::REGULAR, None).unwrap();
        }
        let cla = assignment(&r, "sglang_workers");
        let eps = &cla.endpoints[0].lb_endpoints;
        assert_eq!(eps.len(), 3);
        let tls = Value {
            kind: Some(value::Kind::BoolValue(true)),
        };
        // Plain workers: no metadata, Envoy's default (raw) socket.
        assert!(eps[0].metadata.is_none());
        assert_eq!(hostname_of(&eps[0]), "");
        // TLS by IP: no SNI; TLS by name: the name is SNI.
        assert_eq!(tls_of(&eps[1]), Some(&tls));
        assert_eq!(hostname_of(&eps[1]), "");
        assert_eq!(tls_of(&eps[2]), Some(&tls));
        assert_eq!(hostname_of(&eps[2]), "localhost");
    }
}
