//! sglang-envoy control plane.
//!
//! Reads the flags, builds the engine over the worker registry, registers
//! the initial workers, starts the upkeep tasks, then serves until stopped:
//! - gRPC on `--grpc-port`: the filter's `Route`/`Complete` calls, Envoy's
//!   endpoint discovery (EDS) for the worker clusters, and the `ext_proc`
//!   front door;
//! - HTTP on `--admin-port`: the admin API and `/metrics`.

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::EndpointDiscoveryServiceServer;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use opentelemetry_sdk::trace::SdkTracerProvider;
use sglang_envoy_lifecycle::{ClientKey, Mode};
use sglang_envoy_proto::router_server::RouterServer;
use tonic::transport::server::TcpIncoming;
use tracing::{info, warn};

use sglang_envoy_control_plane::auth::{AdminAuth, AUDIT_TARGET};
use sglang_envoy_control_plane::body_budget::BodyBudget;
use sglang_envoy_control_plane::config::Args;
use sglang_envoy_control_plane::engine::exact::ExactCache;
use sglang_envoy_control_plane::engine::{Engine, EngineOptions, Policies};
use sglang_envoy_control_plane::enrollment::Enrollment;
use sglang_envoy_control_plane::fleet_store::FleetStore;
use sglang_envoy_control_plane::grpc_runtime::GrpcRuntime;
use sglang_envoy_control_plane::kv_events::KvEvents;
use sglang_envoy_control_plane::metrics::Metrics;
use sglang_envoy_control_plane::sessions::Sessions;
use sglang_envoy_control_plane::shared_ends::{shared_ends, EndsSync};
use sglang_envoy_control_plane::shared_loads::SharedLoads;
use sglang_envoy_control_plane::shared_tree::{shared_tree, TreeSync};
use sglang_envoy_control_plane::store_link;
use sglang_envoy_control_plane::workers::persist::StoredWorker;
use sglang_envoy_control_plane::workers::{
    worker_client, AddressPolicy, HealthChecker, LoadMonitor, Registry, WorkerAddress,
};
use sglang_envoy_control_plane::{
    admin, ext_proc, grpc_health, grpc_tls, k8s, policy_flags, service, shutdown, startup, trace,
    upkeep, xds,
};

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
    // Kept to the end: dropping it would stop the span exports.
    let _tracer = init_logging(&args)?;
    for note in &args.peer_notes {
        warn!("{note}");
    }
    if args.admin_token.is_none()
        && args.auth.control_plane_api_keys.is_empty()
        && args.auth.jwt_issuer.is_none()
    {
        if args.host.is_loopback() {
            warn!("no --admin-token, --control-plane-api-keys or --jwt-issuer: the admin port takes changes to the workers from this host only");
        } else {
            // sglang-router's habitual `--host 0.0.0.0` opens the admin API
            // and the gRPC port here, not a client port: say it loudly.
            warn!(
                host = %args.host,
                admin_port = args.admin_port,
                grpc_port = args.grpc_port,
                "--host is not a loopback address and there is no --admin-token, --control-plane-api-keys or --jwt-issuer: the admin port refuses changes to the workers from other hosts (403), and anyone on the network can call the gRPC port; set a credential (docs/security.md) or keep --host on loopback"
            );
        }
    }
    let mut plane = ControlPlane::build(&args)?;
    // Probes every server as soon as it is registered, then on its schedule.
    tokio::spawn(plane.health.clone().run());
    startup::register_initial_workers(&args, &plane.enrollment, &plane.health).await?;
    // Bad selectors or no cluster to reach stop the startup, named.
    k8s::start(&args, plane.enrollment.clone())
        .await
        .context("Kubernetes service discovery")?;
    upkeep::spawn(&args, &plane.engine);
    if let Some(every) = args.load_monitor_interval() {
        let monitor = LoadMonitor::new(
            plane.engine.registry().clone(),
            plane.worker_client.clone(),
            every,
        );
        tokio::spawn(monitor.run());
    }
    if let Some(kv) = &plane.kv_events {
        tokio::spawn(kv.clone().run(plane.engine.registry().clone()));
    }
    // Made before the tree's sharing starts: the others' inserts are
    // applied on the threads that decide.
    let grpc_runtime = plane.grpc_runtime(&args)?;
    if let Some(loads) = plane.shared_loads.take() {
        tokio::spawn(loads.run(
            plane.engine.registry().clone(),
            plane.engine.metrics().clone(),
        ));
    }
    if let Some(sync) = plane.ends_sync.take() {
        tokio::spawn(sync.run(plane.engine.clone()));
    }
    if let Some(sync) = plane.tree_sync.take() {
        tokio::spawn(sync.run(plane.engine.clone(), grpc_runtime.handle()));
    }
    if let Some(store) = &plane.fleet_store {
        // After the initial workers: they are offered to the store.
        tokio::spawn(store.clone().run(
            plane.engine.registry().clone(),
            plane.enrollment.clone(),
            plane.engine.metrics().clone(),
        ));
    }
    plane.serve(&args, grpc_runtime).await
}

/// --log-level sets this crate's level; dependencies (h2, hyper) stay at
/// warn unless RUST_LOG says otherwise. With --enable-trace, decision spans
/// also go to the OTLP endpoint, whatever the log level (the provider that
/// sends them is returned).
fn init_logging(args: &Args) -> anyhow::Result<Option<SdkTracerProvider>> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| {
            // Audit events are written whatever the log level when asked for.
            let audit = if args.auth.control_plane_audit_enabled {
                format!(",{AUDIT_TARGET}=info")
            } else {
                String::new()
            };
            tracing_subscriber::EnvFilter::try_new(format!(
                "warn,sglang_envoy_control_plane={}{audit}",
                args.log_level
            ))
        })
        .context("invalid --log-level")?;
    let provider = if args.enable_trace {
        Some(trace::provider(&args.otlp_traces_endpoint)?)
    } else {
        None
    };
    let spans = provider.as_ref().map(|p| {
        trace::layer(p).with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(trace::TARGET, tracing::Level::INFO),
        )
    });
    tracing_subscriber::registry()
        // Colours only on a terminal: files, pipes and Kubernetes logs get
        // plain text.
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(std::io::stdout().is_terminal())
                .with_filter(filter),
        )
        .with(spans)
        .init();
    Ok(provider)
}

/// The running parts of the control plane.
struct ControlPlane {
    engine: Arc<Engine>,
    health: Arc<HealthChecker>,
    enrollment: Arc<Enrollment>,
    /// The one HTTP client for workers (health probes, load reports).
    worker_client: reqwest::Client,
    /// The KV-event subscriber, unless `--disable-kv-events`.
    kv_events: Option<Arc<KvEvents>>,
    /// The worker list shared with other control planes.
    fleet_store: Option<Arc<FleetStore>>,
    /// The trees' inserts shared with other control planes (taken when
    /// its task starts).
    tree_sync: Option<TreeSync>,
    /// The requests in flight shared with other control planes (taken
    /// when its task starts).
    shared_loads: Option<SharedLoads>,
    /// The ends of tickets another control plane counted, passed on
    /// (taken when its task starts).
    ends_sync: Option<EndsSync>,
}

impl ControlPlane {
    /// The registry, policies, engine and health checker the flags describe.
    fn build(args: &Args) -> anyhow::Result<ControlPlane> {
        let mode = if args.pd_disaggregation {
            Mode::Pd
        } else {
            Mode::Regular
        };
        let registry = Arc::new(Registry::new(args.circuit_config()));
        let policies = match mode {
            Mode::Pd => {
                let prefill = policy_flags::build(args.prefill_policy(), args);
                // Its own instance even when of the same kind: the
                // cache-aware trees of prefill and decode workers must not mix.
                let decode = policy_flags::build(args.decode_policy(), args);
                Policies {
                    regular: prefill.clone(),
                    prefill,
                    decode,
                }
            }
            Mode::Regular => Policies::same(policy_flags::build(args.policy, args)),
        };
        // The client for calls to workers (health checks, discovery), with
        // the TLS flags: bad certificate files stop the startup here. The
        // PD prefill halves get one of their own, whose connections are
        // opened (and so served) on the gRPC port's thread, where the
        // prefill halves run (`EngineOptions::prefill_client`).
        let prefill_client = worker_client(&args.worker_tls(), args.api_key.as_deref())
            .context("the client for prefill halves")?;
        let worker_client = worker_client(&args.worker_tls(), args.api_key.as_deref())
            .context("the client for workers")?;
        let options = EngineOptions {
            retry: args.retry_options(),
            admission: args.admission()?,
            tenant_header: args.trusted_tenant_header(),
            mode,
            dp_aware: args.dp_aware,
            request_timeout: Duration::from_secs(args.request_timeout_secs),
            addresses: AddressPolicy {
                allow_link_local: args.allow_link_local_workers,
                own_ports: [args.admin_port, args.grpc_port]
                    .into_iter()
                    .chain(args.grpc_health_port)
                    .collect(),
                own_host: Some(args.host),
            },
            worker_client: worker_client.clone(),
            prefill_client,
            wire_profile: args.wire_profile.forced(),
            client_key: args.api_key.as_deref().map(ClientKey::from_key),
            trace: args.enable_trace,
            decision_cpu: args.decision_cpu_metric,
            max_body_bytes: args.max_payload_size,
        };
        let buckets = &args.prometheus_duration_buckets;
        let metrics = Arc::new(Metrics::new((!buckets.is_empty()).then_some(&buckets[..])));
        let health = Arc::new(HealthChecker::new(
            registry.clone(),
            args.health_options(),
            worker_client.clone(),
        ));
        let kv_events = args
            .kv_events
            .options()
            .map(|o| KvEvents::new(o, worker_client.clone()));
        let tokenizer = args
            .kv_events
            .tokenizer()
            .context("--tokenizer-path / --model-path")?;
        let mut engine =
            Engine::new(registry, policies, metrics, options).with_health(health.clone());
        match (&kv_events, tokenizer) {
            (Some(kv), Some(tokenizer)) => {
                info!(
                    chat_template = tokenizer.has_chat_template(),
                    "routing on exact cached prefixes where workers publish KV events"
                );
                engine = engine
                    .with_exact_cache(ExactCache::new(kv.index().clone(), Arc::new(tokenizer)));
            }
            (None, Some(_)) => warn!("--tokenizer-path is unused with --disable-kv-events"),
            _ => {}
        }
        // One id marks this process's entries in the store, for the tree
        // and the loads alike.
        let replica = store_link::draw_replica_id();
        let store = &args.fleet_store;
        let prefix = &store.fleet_store_key_prefix;
        let tree_sync = match &store.fleet_store_url {
            Some(url) if !store.disable_shared_tree => {
                let (outbox, sync) =
                    shared_tree(url, prefix, &replica).context("--fleet-store-url")?;
                engine = engine.with_shared_tree(outbox);
                Some(sync)
            }
            _ => None,
        };
        let (shared_loads, ends_sync) = match &store.fleet_store_url {
            Some(url) if !store.disable_shared_loads => {
                let loads = SharedLoads::new(url, prefix, &replica).context("--fleet-store-url")?;
                let (outbox, sync) =
                    shared_ends(url, prefix, &replica).context("--fleet-store-url")?;
                engine = engine.with_shared_ends(outbox);
                (Some(loads), Some(sync))
            }
            _ => (None, None),
        };
        if store.fleet_store_url.is_some() {
            // The store's keys of this replica end in its id.
            info!(%replica, %prefix, "sharing through the fleet store");
        }
        let engine = Arc::new(engine);
        let enrollment = Enrollment::new(engine.clone(), startup::startup_timeout(args));
        info!(
            mode = mode.as_str(),
            dp_aware = args.dp_aware,
            "router built"
        );
        let fleet_store = match &args.fleet_store.fleet_store_url {
            Some(url) => {
                let flags = startup::flag_workers(args)?
                    .into_iter()
                    .map(|(url, spec)| {
                        let url = WorkerAddress::normalise(&url).map_or(url, |n| n.0);
                        StoredWorker::new(url, spec, None)
                    })
                    .collect();
                let prefix = &args.fleet_store.fleet_store_key_prefix;
                Some(FleetStore::new(url, prefix, flags).context("--fleet-store-url")?)
            }
            None => None,
        };
        Ok(ControlPlane {
            engine,
            health,
            enrollment,
            worker_client,
            kv_events,
            fleet_store,
            tree_sync,
            shared_loads,
            ends_sync,
        })
    }

    /// The runtime the gRPC port is served on (`grpc_runtime.rs`): by
    /// default one thread of its own, unless decisions tokenize.
    fn grpc_runtime(&self, args: &Args) -> anyhow::Result<GrpcRuntime> {
        let threads = args
            .grpc_threads
            .unwrap_or(if self.engine.tokenizes() { 0 } else { 1 });
        GrpcRuntime::start(threads).context("the gRPC threads")
    }

    /// Serves gRPC (the filter's calls, EDS, ext_proc) on `grpc_runtime`
    /// and the admin API until one fails or the process is told to stop.
    async fn serve(self, args: &Args, grpc_runtime: GrpcRuntime) -> anyhow::Result<()> {
        let ControlPlane {
            engine,
            health,
            enrollment,
            kv_events,
            fleet_store,
            ..
        } = self;
        let grpc_addr = SocketAddr::new(args.host, args.grpc_port);
        // The filter sessions, registered by the gRPC service and settled
        // by the admin API before it shows loads.
        let drain = shutdown::Drain::default();
        let sessions = Arc::new(Sessions::new(drain.clone()));
        // Questions and ext_proc messages carry whole request bodies:
        // tonic's default limit (4 MiB) would turn larger ones into errors.
        let limit = args.grpc_message_limit();
        let mut builder = tonic::transport::Server::builder();
        if args.secure_serving {
            let names = vec!["localhost".to_string(), args.host.to_string()];
            let tls = grpc_tls::server_config(args.cert_path.as_deref(), names)
                .context("TLS on the gRPC port")?;
            builder = builder.tls_config(tls).context("TLS on the gRPC port")?;
        }
        let grpc = builder
            .add_service(grpc_health::service(&drain).await)
            .add_service(
                RouterServer::new(service::RouterService::new(
                    engine.clone(),
                    sessions.clone(),
                ))
                .max_decoding_message_size(limit),
            )
            .add_service(EndpointDiscoveryServiceServer::new(xds::Eds::new(
                engine.registry().clone(),
                drain.clone(),
            )))
            .add_service(
                ExternalProcessorServer::new(ext_proc::ExtProcService::new(
                    engine.clone(),
                    args.max_payload_size,
                    BodyBudget::new(args.ext_proc_max_buffered_bytes),
                    args.destination_endpoints.into(),
                ))
                .max_decoding_message_size(limit),
            );
        // Bound here, before the admin port answers: whoever waits for
        // `/health` (a test, a readiness probe) then finds the gRPC port
        // taking connections too. Served on the gRPC thread, which may
        // start a little later (Envoy's first connections wait in the
        // backlog rather than being refused, and ejected).
        let listener = std::net::TcpListener::bind(grpc_addr)
            .with_context(|| format!("cannot listen on {grpc_addr}"))?;
        listener
            .set_nonblocking(true)
            .context("the gRPC listener")?;
        let drained = drain.started();
        let mut grpc = grpc_runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            // Draining (`shutdown.rs`) closes the port and sends Envoy's
            // connections GOAWAY.
            grpc.serve_with_incoming_shutdown(incoming, drained).await?;
            anyhow::Ok(())
        });

        let health_only = match args.grpc_health_port {
            Some(port) => {
                let addr = SocketAddr::new(args.host, port);
                let server = tonic::transport::Server::builder()
                    .add_service(grpc_health::service(&drain).await)
                    .serve(addr);
                info!(%addr, "gRPC health also served here");
                Some(server)
            }
            None => None,
        };
        let health_only = async move {
            match health_only {
                Some(server) => server.await,
                None => std::future::pending().await,
            }
        };

        let admin_addr = SocketAddr::new(args.host, args.admin_port);
        let listener = tokio::net::TcpListener::bind(admin_addr)
            .await
            .with_context(|| format!("cannot listen on {admin_addr}"))?;
        // Kept for the drain on SIGTERM.
        let drain_engine = engine.clone();
        let state = admin::AdminState {
            engine,
            health,
            enrollment,
            auth: Arc::new(
                AdminAuth::from_flags(args.admin_token.as_deref(), &args.auth)
                    .map_err(anyhow::Error::msg)?,
            ),
            kv_events,
            fleet_store,
            sessions,
        };
        let prometheus = match args.prometheus_port {
            Some(port) => {
                let addr = SocketAddr::new(args.prometheus_host.unwrap_or(args.host), port);
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr} (--prometheus-port)"))?;
                info!(%addr, "metrics also served here");
                Some(axum::serve(listener, admin::metrics_router(state.clone())))
            }
            None => None,
        };
        // With each peer's address: changes without a credential are taken
        // from this host only (admin.rs, require_token).
        let admin = axum::serve(
            listener,
            admin::router(state).into_make_service_with_connect_info::<SocketAddr>(),
        );
        info!(%grpc_addr, %admin_addr, "control plane listening");

        let prometheus = async move {
            match prometheus {
                Some(server) => server.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = &mut grpc => r.context("gRPC server stopped")?.context("gRPC server failed")?,
            r = health_only => r.context("gRPC health server failed")?,
            r = admin => r.context("admin server failed")?,
            r = prometheus => r.context("metrics server failed")?,
            () = shutdown::signal() => {
                info!("shutting down");
                let served = async move {
                    let _ = grpc.await;
                };
                let grace = Duration::from_secs(args.shutdown_grace_period_secs);
                tokio::select! {
                    _ = shutdown::drain(&drain, &drain_engine, served, grace) => {}
                    // Told twice (Ctrl-C again): no more waiting.
                    () = shutdown::signal() => warn!("told again to stop: exiting without draining further"),
                }
            }
        }
        Ok(())
    }
}
