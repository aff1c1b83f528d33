//! Kubernetes service discovery, as sglang-router does it
//! (`--service-discovery`): pods whose labels match `--selector` (in PD
//! mode `--prefill-selector` / `--decode-selector`), running and ready, are
//! workers at `http://pod-ip:--service-discovery-port`; a prefill pod's
//! bootstrap port comes from its `sglang.ai/bootstrap-port` annotation.
//! Pods that stop matching, stop being ready or are deleted are removed.
//! The client is configured as kubectl's (`KUBECONFIG`, else in-cluster).

pub mod pods;
pub mod watch;

use std::sync::Arc;

use crate::config::Args;
use crate::enrollment::Enrollment;
use pods::{parse_selector, Rules};

/// Why discovery could not start.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// A selector is malformed or missing.
    #[error("{0}")]
    Selector(String),
    /// No Kubernetes client could be configured.
    #[error("no Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// The discovery rules the flags give.
pub fn rules(args: &Args) -> Result<Rules, DiscoveryError> {
    let selector = parse_selector(&args.selector).map_err(DiscoveryError::Selector)?;
    let pd = if args.pd_disaggregation {
        let prefill = parse_selector(&args.prefill_selector).map_err(DiscoveryError::Selector)?;
        let decode = parse_selector(&args.decode_selector).map_err(DiscoveryError::Selector)?;
        if prefill.is_empty() || decode.is_empty() {
            return Err(DiscoveryError::Selector(
                "PD service discovery needs --prefill-selector and --decode-selector".into(),
            ));
        }
        Some((prefill, decode))
    } else {
        if selector.is_empty() {
            return Err(DiscoveryError::Selector(
                "--service-discovery needs --selector key=value".into(),
            ));
        }
        None
    };
    Ok(Rules {
        selector,
        pd,
        port: args.service_discovery_port,
    })
}

/// Starts watching the pods, when `--service-discovery` is on.
pub async fn start(args: &Args, enrollment: Arc<Enrollment>) -> Result<(), DiscoveryError> {
    if !args.service_discovery {
        return Ok(());
    }
    let rules = rules(args)?;
    let client = kube::Client::try_default().await?;
    let namespace = args.service_discovery_namespace.clone();
    tracing::info!(?namespace, ?rules, "Kubernetes service discovery on");
    tokio::spawn(watch::run(client, namespace, rules, enrollment));
    Ok(())
}
