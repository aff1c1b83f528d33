//! sglang-envoy control plane.
//!
//! Reads the flags, registers the initial workers and checks their health,
//! then serves three things until stopped:
//! - gRPC on `--grpc-port`: the filter's `Route`/`Complete` calls and Envoy's
//!   endpoint discovery (EDS) for the worker cluster;
//! - HTTP on `--admin-port`: the admin API and `/metrics`;
//! - background upkeep: health checks, tree eviction, and releasing the load
//!   of requests whose end was never reported.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::EndpointDiscoveryServiceServer;
use sglang_envoy_proto::router_server::RouterServer;
use tracing::{info, warn};

use sglang_envoy_control_plane::config::Args;
use sglang_envoy_control_plane::engine::Engine;
use sglang_envoy_control_plane::metrics::Metrics;
use sglang_envoy_control_plane::workers::{HealthChecker, Registry};
use sglang_envoy_control_plane::{admin, policy, service, xds};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.validate().map_err(anyhow::Error::msg)?;
    tracing_subscriber::fmt()
        .with_env_filter(
            // --log-level sets this crate's level; dependencies (h2, hyper)
            // stay at warn unless RUST_LOG says otherwise.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .or_else(|_| {
                    tracing_subscriber::EnvFilter::try_new(format!(
                        "warn,sglang_envoy_control_plane={}",
                        args.log_level
                    ))
                })
                .context("invalid --log-level")?,
        )
        .init();

    let registry = Arc::new(Registry::default());
    let policy = policy::build(&args);
    let metrics = Arc::new(Metrics::default());
    let engine = Arc::new(Engine::new(
        registry.clone(),
        policy.clone(),
        metrics,
        args.max_fallback_workers,
    ));
    let health = Arc::new(HealthChecker::new(registry.clone(), &args)?);

    for url in &args.worker_urls {
        let worker = engine
            .add_worker(url)
            .await
            .with_context(|| format!("cannot register worker {url}"))?;
        if !health.admit(&worker).await {
            warn!(worker = %worker.url, "worker is not healthy yet; it gets requests once it is");
        }
    }
    info!(
        workers = registry.all().len(),
        healthy = registry.healthy().len(),
        policy = policy.name(),
        "workers registered"
    );

    tokio::spawn(health.clone().run());
    tokio::spawn(evict(
        policy.clone(),
        registry.clone(),
        Duration::from_secs(args.eviction_interval_secs),
    ));
    tokio::spawn(reap(
        engine.clone(),
        Duration::from_secs(args.request_timeout_secs),
    ));

    let grpc_addr = SocketAddr::new(args.host, args.grpc_port);
    let grpc = tonic::transport::Server::builder()
        .add_service(RouterServer::new(service::RouterService::new(
            engine.clone(),
            health.clone(),
        )))
        .add_service(EndpointDiscoveryServiceServer::new(xds::Eds::new(
            registry.clone(),
        )))
        .serve(grpc_addr);

    let admin_addr = SocketAddr::new(args.host, args.admin_port);
    let listener = tokio::net::TcpListener::bind(admin_addr)
        .await
        .with_context(|| format!("cannot listen on {admin_addr}"))?;
    let admin = axum::serve(
        listener,
        admin::router(admin::AdminState {
            engine: engine.clone(),
            health: health.clone(),
        }),
    );
    info!(%grpc_addr, %admin_addr, "control plane listening");

    tokio::select! {
        r = grpc => r.context("gRPC server failed")?,
        r = admin => r.context("admin server failed")?,
        _ = tokio::signal::ctrl_c() => info!("shutting down"),
    }
    Ok(())
}

/// Trims the approximate trees every `every`.
async fn evict(policy: Arc<dyn policy::Policy>, registry: Arc<Registry>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        // Eviction walks the tree; keep it off the async workers.
        let (policy, workers) = (policy.clone(), registry.all());
        let _ = tokio::task::spawn_blocking(move || policy.maintain(&workers)).await;
    }
}

/// Releases the load of requests whose end was never reported.
async fn reap(engine: Arc<Engine>, timeout: Duration) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tick.tick().await;
        let n = engine.reap(timeout);
        if n > 0 {
            warn!(
                released = n,
                "released load of requests whose end was never reported"
            );
        }
    }
}
