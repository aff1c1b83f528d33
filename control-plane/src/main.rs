//! sglang-envoy control plane.
//!
//! Reads the flags, registers the initial workers and checks their health,
//! then serves three things until stopped:
//! - gRPC on `--grpc-port`: the filter's `Route`/`Complete` calls, Envoy's
//!   endpoint discovery (EDS) for the worker cluster, and the `ext_proc`
//!   front door;
//! - HTTP on `--admin-port`: the admin API and `/metrics`;
//! - background upkeep: health checks, tree eviction, and releasing the load
//!   of requests whose end was never reported.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::EndpointDiscoveryServiceServer;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use sglang_envoy_proto::router_server::RouterServer;
use tracing::{debug, error, info, warn};

use sglang_envoy_control_plane::body_budget::BodyBudget;
use sglang_envoy_control_plane::config::Args;
use sglang_envoy_control_plane::engine::{Engine, EngineOptions, Policies};
use sglang_envoy_control_plane::metrics::Metrics;
use sglang_envoy_control_plane::workers::{
    persist, worker_client, AddressPolicy, HealthChecker, Registry, Role, WorkerSpec,
};
use sglang_envoy_control_plane::{admin, ext_proc, policy, service, xds};

/// mimalloc instead of glibc's allocator: a routing decision allocates a
/// few small buffers and the tree grows by the new part of every prompt;
/// with glibc those allocations gave single decisions a p99 two to three
/// times their p50 (trimming and refilling the heap top), with mimalloc
/// the p99 stays within 1.5x (`bench-engine`, docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse_args();
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

    if args.admin_token.is_none() {
        warn!("no --admin-token: anyone who reaches the admin API can add and remove workers");
    }
    let registry = Arc::new(Registry::new(args.circuit_config()));
    let policies = if args.pd_disaggregation {
        let prefill = policy::build(args.prefill_policy(), &args);
        // Its own instance even when of the same kind: the cache-aware trees
        // of prefill and decode workers must not mix.
        let decode = policy::build(args.decode_policy(), &args);
        Policies {
            regular: prefill.clone(),
            prefill,
            decode,
        }
    } else {
        Policies::same(policy::build(args.policy, &args))
    };
    let metrics = Arc::new(Metrics::default());
    // One client for every call to a worker (health checks, discovery, PD
    // prefill halves), with the TLS flags: bad certificate files stop the
    // startup here.
    let worker_client = worker_client(&args.worker_tls()).context("TLS to workers")?;
    let engine = Arc::new(Engine::new(
        registry.clone(),
        policies,
        metrics,
        EngineOptions {
            retry: args.retry_options(),
            admission: args.admission(),
            pd: args.pd_disaggregation,
            dp_aware: args.dp_aware,
            request_timeout: Duration::from_secs(args.request_timeout_secs),
            addresses: AddressPolicy {
                allow_link_local: args.allow_link_local_workers,
                own_ports: vec![args.admin_port, args.grpc_port],
                own_host: Some(args.host),
            },
            worker_client: worker_client.clone(),
            wire_profile: args.wire_profile.forced(),
        },
    )?);
    let health = Arc::new(HealthChecker::new(registry.clone(), &args, worker_client));

    let mut initial: Vec<(String, WorkerSpec)> = args
        .worker_urls
        .iter()
        .map(|u| (u.clone(), WorkerSpec::REGULAR))
        .collect();
    for (url, bootstrap_port) in args.prefill_workers().map_err(anyhow::Error::msg)? {
        let spec = WorkerSpec {
            role: Role::Prefill,
            bootstrap_port,
        };
        initial.push((url, spec));
    }
    for url in &args.decode {
        let spec = WorkerSpec {
            role: Role::Decode,
            bootstrap_port: None,
        };
        initial.push((url.clone(), spec));
    }
    if let Some(path) = &args.state_file {
        for stored in persist::load(path)? {
            match stored.spec() {
                Some(spec) if !initial.iter().any(|(u, _)| *u == stored.url) => {
                    initial.push((stored.url, spec));
                }
                Some(_) => {}
                None => {
                    warn!(worker = %stored.url, kind = %stored.worker_type, "unknown worker type in state file; skipped")
                }
            }
        }
    }
    let startup_timeout = Duration::from_secs(args.worker_startup_timeout_secs);
    for (url, spec) in initial {
        if args.dp_aware {
            // A DP-aware worker's ranks are only known once it answers, which
            // a freshly started GPU server may take minutes to do.
            tokio::spawn(register_when_up(
                engine.clone(),
                health.clone(),
                url,
                spec,
                startup_timeout,
            ));
            continue;
        }
        let units = match engine.add_worker(&url, spec).await {
            Ok(units) => units,
            // A stored worker that vanished (or the other mode's) must not
            // keep the router from starting.
            Err(e)
                if !args.worker_urls.contains(&url)
                    && !args.decode.contains(&url)
                    && !args.prefill_groups.iter().any(|g| g.first() == Some(&url)) =>
            {
                warn!(worker = %url, error = %e, "stored worker not restored");
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot register worker {url}")),
        };
        if !health.admit(&units[0]).await {
            warn!(worker = %url, "worker is not healthy yet; it gets requests once it is");
        }
    }
    info!(
        workers = registry.all().len(),
        mode = if args.pd_disaggregation {
            "pd"
        } else {
            "regular"
        },
        dp_aware = args.dp_aware,
        "workers registered"
    );

    if let Some(path) = args.state_file.clone() {
        tokio::spawn(persist_changes(registry.clone(), path));
    }
    tokio::spawn(health.clone().run());
    tokio::spawn(evict(
        engine.clone(),
        Duration::from_secs(args.eviction_interval_secs),
    ));
    tokio::spawn(tick_circuits(registry.clone()));
    tokio::spawn(reap(
        engine.clone(),
        Duration::from_secs(args.request_timeout_secs),
    ));

    let grpc_addr = SocketAddr::new(args.host, args.grpc_port);
    // Questions and ext_proc messages carry whole request bodies: tonic's
    // default limit (4 MiB) would turn larger ones into errors.
    let limit = args.grpc_message_limit();
    let grpc = tonic::transport::Server::builder()
        .add_service(
            RouterServer::new(service::RouterService::new(engine.clone(), health.clone()))
                .max_decoding_message_size(limit),
        )
        .add_service(EndpointDiscoveryServiceServer::new(xds::Eds::new(
            registry.clone(),
        )))
        .add_service(
            ExternalProcessorServer::new(ext_proc::ExtProcService::new(
                engine.clone(),
                health.clone(),
                args.max_payload_size,
                BodyBudget::new(args.ext_proc_max_buffered_bytes),
            ))
            .max_decoding_message_size(limit),
        )
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
            token: args.admin_token.as_deref().map(Arc::from),
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

/// Registers a DP-aware worker once it answers `/get_server_info`, trying
/// every second until `timeout`.
async fn register_when_up(
    engine: Arc<Engine>,
    health: Arc<HealthChecker>,
    url: String,
    spec: WorkerSpec,
    timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match engine.add_worker(&url, spec).await {
            Ok(units) => {
                let healthy = health.admit(&units[0]).await;
                info!(worker = %url, ranks = units.len(), healthy, "DP-aware worker registered");
                return;
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                debug!(worker = %url, error = %e, "worker not ready; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                error!(worker = %url, error = %e, "gave up registering worker");
                return;
            }
        }
    }
}

/// Trims every policy's approximate trees every `every`.
async fn evict(engine: Arc<Engine>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        for (_, policy) in engine.policies().each() {
            // Each policy sees the units it routes over, no others.
            let all = engine.registry().all();
            let units: Vec<_> = all
                .iter()
                .filter(|w| Arc::ptr_eq(engine.policies().of(w.role()), &policy))
                .cloned()
                .collect();
            // Eviction walks the tree; keep it off the async workers.
            let _ = tokio::task::spawn_blocking(move || policy.maintain(&units)).await;
        }
    }
}

/// Writes the worker set to `path` whenever it changes.
///
/// The first write waits for a change, so a restart whose workers are still
/// coming up (DP-aware registration) does not overwrite the file with fewer.
async fn persist_changes(registry: Arc<Registry>, path: std::path::PathBuf) {
    let mut changes = registry.subscribe();
    let mut last = Some(persist::snapshot(&registry));
    loop {
        if changes.changed().await.is_err() {
            return;
        }
        let now = persist::snapshot(&registry);
        if last.as_ref() != Some(&now) {
            match persist::save(&path, &now) {
                Ok(()) => last = Some(now),
                Err(e) => error!(error = %e, "cannot save the worker state"),
            }
        }
    }
}

/// Lets open circuits whose time is up take requests again.
async fn tick_circuits(registry: Arc<Registry>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        registry.tick_circuits();
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
