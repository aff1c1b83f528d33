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
use tracing::{error, info, warn};

use sglang_envoy_control_plane::body_budget::BodyBudget;
use sglang_envoy_control_plane::config::Args;
use sglang_envoy_control_plane::engine::{Engine, EngineOptions, Policies};
use sglang_envoy_control_plane::enrollment::{Enrolled, Enrollment};
use sglang_envoy_control_plane::metrics::Metrics;
use sglang_envoy_control_plane::workers::{
    persist, worker_client, AddressPolicy, HealthChecker, Registry, Role, WorkerAddress, WorkerId,
    WorkerSpec,
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

    // Probes every server as soon as it is registered, then on its schedule.
    tokio::spawn(health.clone().run());
    let enrollment = Enrollment::new(
        engine.clone(),
        Duration::from_secs(args.worker_startup_timeout_secs),
    );
    let mut registered = Vec::new();
    for InitialWorker {
        url,
        spec,
        id,
        from_flags,
    } in initial_workers(&args)?
    {
        match enrollment.enroll(&url, spec, id).await {
            Ok(Enrolled::Pending(_)) => {
                info!(worker = %url, "worker not reachable yet; it is registered once it is")
            }
            Ok(Enrolled::Registered(_, units)) => registered.extend(units.into_iter().take(1)),
            Ok(Enrolled::Existing(_)) => {}
            // A stored worker that is no longer valid (or the other mode's)
            // must not keep the router from starting.
            Err(e) if !from_flags => {
                warn!(worker = %url, error = %e, "stored worker not restored")
            }
            Err(e) => return Err(e).with_context(|| format!("cannot register worker {url}")),
        }
    }
    // Serve only once the workers that are up are known to be: a restarted
    // control plane must not answer "no healthy workers" for the few
    // milliseconds its first probes take (the others are admitted as soon
    // as they answer). The probes run at once, so this takes at most one
    // health-check timeout.
    let up = futures::future::join_all(registered.iter().map(|w| health.admit(w))).await;
    info!(
        healthy = up.iter().filter(|ok| **ok).count(),
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
    tokio::spawn(evict(
        engine.clone(),
        Duration::from_secs(args.eviction_interval_secs),
    ));
    tokio::spawn(tick_circuits(registry.clone()));
    if args.dns_refresh_secs > 0 {
        tokio::spawn(sglang_envoy_control_plane::dns::follow(
            engine.clone(),
            Duration::from_secs(args.dns_refresh_secs),
        ));
    }
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
            enrollment: enrollment.clone(),
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

/// A worker to register at startup.
struct InitialWorker {
    url: String,
    spec: WorkerSpec,
    /// Its id in the state file, if it is there.
    id: Option<WorkerId>,
    /// Named by the flags (else only by the state file).
    from_flags: bool,
}

/// The workers to register at startup: the flags' (`--worker-urls`,
/// `--prefill`, `--decode`), then the state file's others.
fn initial_workers(args: &Args) -> anyhow::Result<Vec<InitialWorker>> {
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
    let stored = match &args.state_file {
        Some(path) => persist::load(path)?,
        None => Vec::new(),
    };
    let same = |a: &str, b: &str| match (WorkerAddress::normalise(a), WorkerAddress::normalise(b)) {
        (Ok(a), Ok(b)) => a.0 == b.0,
        _ => a == b,
    };
    let mut out: Vec<_> = initial
        .into_iter()
        .map(|(url, spec)| {
            // A flag's worker keeps the id the state file gave it.
            let id = stored
                .iter()
                .find(|s| same(&s.url, &url))
                .and_then(|s| s.id);
            InitialWorker {
                url,
                spec,
                id,
                from_flags: true,
            }
        })
        .collect();
    for s in stored {
        if out.iter().any(|w| same(&w.url, &s.url)) {
            continue;
        }
        match s.spec() {
            Some(spec) => out.push(InitialWorker {
                url: s.url,
                spec,
                id: s.id,
                from_flags: false,
            }),
            None => {
                warn!(worker = %s.url, kind = %s.worker_type, "unknown worker type in state file; skipped")
            }
        }
    }
    Ok(out)
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
