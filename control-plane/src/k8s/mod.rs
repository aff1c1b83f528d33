//! Kubernetes service discovery, as sglang-router does it
//! (`--service-discovery`): pods whose labels match `--selector` (in PD
//! mode `--prefill-selector` / `--decode-selector`), running and ready, are
//! workers at `http://pod-ip:--service-discovery-port`; a prefill pod's
//! bootstrap port comes from its `sglang.ai/bootstrap-port` annotation.
//! Pods that stop matching, stop being ready or are deleted are removed.
//! The client is configured as kubectl's (`KUBECONFIG`, else in-cluster).
//!
//! `--pool-name` does the same for an InferencePool's pods (`pool.rs`): the
//! pool's selector and target ports are the rules.

pub mod pods;
pub mod pool;
pub mod watch;

use std::sync::Arc;

use crate::config::Args;
use crate::enrollment::Enrollment;
use pods::{parse_selector, Rules};

/// How long to wait before reading a missing InferencePool again.
const POOL_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

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
        ports: vec![args.service_discovery_port],
    })
}

/// Starts watching the pods, when `--service-discovery` or `--pool-name`
/// asks for it.
pub async fn start(args: &Args, enrollment: Arc<Enrollment>) -> Result<(), DiscoveryError> {
    if let Some(name) = &args.pool_name {
        let client = kube::Client::try_default().await?;
        let (group, namespace, name) = (
            args.pool_group.clone(),
            args.pool_namespace.clone(),
            name.clone(),
        );
        tokio::spawn(async move {
            // The pool may be created after its picker: wait for it.
            let rules = loop {
                match pool::read(client.clone(), &group, &namespace, &name).await {
                    Ok(rules) => break rules,
                    Err(e) => {
                        tracing::warn!(error = %e, "waiting for the InferencePool");
                        tokio::time::sleep(POOL_RETRY).await;
                    }
                }
            };
            tracing::info!(pool = %name, ?rules, "serving the InferencePool's pods");
            watch::run(client, Some(namespace), rules, enrollment).await;
        });
        return Ok(());
    }
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
