//! smg 1.13.0's flags that neither this control plane nor sglang-router
//! 0.3.2 has, and this router's answer to each: screened like
//! sglang-router's (`launch_screen.rs`), listed in docs/flags.md's
//! "smg flags" table. smg (sglang-router's successor) keeps most of
//! sglang-router's flags under the same names, which are answered there.
//! Defaults are smg 1.13.0's, from `smg launch --help`.

use super::flag_answer::{flag, PeerFlag, Values::*, Verdict::*, HISTORY, TOKENIZER};

const TRANSPORT: &str = "the connection to workers is Envoy's: set it on the workers cluster in envoy/envoy.yaml (typed_extension_protocol_options, common_http_protocol_options)";
const MULTIMODAL: &str =
    "the router forwards requests whole and never fetches or preprocesses media: SGLang workers do";
const EPD: &str = "encode-prefill-decode (EPD) disaggregation is not built: prefill/decode (--pd-disaggregation) is";
const MESH: &str = "several control planes sharing state are not built yet; run one control plane, whose outage the filter survives on its last worker list (docs/failure-modes.md)";
const RL: &str = "the router forwards the inference endpoints only: engine control calls (weight updates, RL fan-out) go to the workers directly";
const SMG_CACHE: &str = "a knob of smg's own cache-aware selection (KV-event index, warm-up, bookings); this router's cache_aware follows sglang-router's algorithm and cost_aware weighs cache against queue (docs/routing.md)";
const ENGINE_LOAD: &str = "engine-reported load (/v1/loads, /get_load) is not read yet: policies use the router's own in-flight counts";
const PD_ADMISSION: &str = "PD admission per worker is not built: --max-concurrent-requests with --queue-size bounds all inference requests";
const DISCOVERY: &str = "file-based discovery is not built: use --service-discovery (Kubernetes), the admin API (POST /workers) or --worker-urls";
const TENANTS: &str = "per-tenant API keys are not built: holders of --api-key are one tenant, other clients are told apart by the trusted tenant header (--trust-tenant-header) or their address";

/// smg's flags this control plane parses under the same name but that
/// change nothing here, with why: "supported differently" in docs/flags.md.
pub const OWN_BUT_DIFFERENT: &[(&str, &str)] = &[
    (
        "--priority-scheduler-tenant-metric-top-n",
        "accepted and changes nothing: there are no per-tenant metrics yet",
    ),
    ("--model-path", super::kv_events_flags::TOKENIZER_DIR),
    ("--tokenizer-path", super::kv_events_flags::TOKENIZER_DIR),
    (
        "--chat-template",
        super::kv_events_flags::CHAT_TEMPLATE_FILE,
    ),
];
const ROUTING_KEY: &str = "the routing key is read from X-SMG-Routing-Key only (--policy manual)";
const KV_EVENTS: &str =
    "KV events are read from each worker's own ZMQ publisher (docs/kv-events.md): the page size comes from the events, the index is SGLang's page hash chain, and a worker is trusted while its sequence has no gap";
const SILENCE: &str = "workers are taken out of routing by health checks (--health-check-*), the circuit breaker (--cb-*) and Envoy's outlier detection, not by silence";
const UNHEALTHY: &str = "an unhealthy worker stays registered and is probed until it recovers";
const NO_JOB_QUEUE: &str = "workers are added and removed at once, without a job queue";
const VLLM_KV: &str =
    "annotations of vLLM workers' KV connectors: this router routes SGLang workers";

/// smg 1.13.0's own flags (those sglang-router 0.3.2 does not have) that
/// this router does not parse itself.
#[rustfmt::skip]
pub const SMG_FLAGS: &[PeerFlag] = &[
    flag("--upstream-http2", Switch, "", Elsewhere(TRANSPORT)),
    flag("--upstream-pool-idle-timeout-secs", One, "3", Elsewhere(TRANSPORT)),
    flag("--health-check-port", One, "", Elsewhere("probes reach the control plane's /health, /liveness and /readiness on --admin-port, and Envoy's listener")),
    flag("--encode-policy", One, "", NotYet(EPD)),
    flag("--power-of-two-load-metric", One, "expected_wait", Elsewhere("power_of_two compares the two workers' requests in flight (smg's `requests`), counted by the router")),
    flag("--balance-token-usage-threshold", One, "1.0", NotYet(ENGINE_LOAD)),
    flag("--overload-token-usage-threshold", One, "1.0", NotYet(ENGINE_LOAD)),
    flag("--worker-overload-waiting-requests", One, "8", NotYet(ENGINE_LOAD)),
    flag("--worker-overload-token-usage", One, "0.8", NotYet(ENGINE_LOAD)),
    flag("--worker-overload-protection", Switch, "", NotYet(ENGINE_LOAD)),
    flag("--disable-worker-overload-protection", Switch, "", Elsewhere("no worker is left out for its engine-reported load here: there is no overload protection to switch off")),
    flag("--worker-overload-shed", Switch, "", NotYet(ENGINE_LOAD)),
    flag("--kv-index", One, "positional", NotApplicable(KV_EVENTS)),
    flag("--worker-stall-secs", One, "2", NotApplicable(SILENCE)),
    flag("--worker-wedge-secs", One, "3", NotApplicable(SILENCE)),
    flag("--worker-stale-secs", One, "15", NotApplicable(KV_EVENTS)),
    flag("--worker-warmup-secs", One, "60", NotApplicable(SMG_CACHE)),
    flag("--worker-warmup-share", One, "0.25", NotApplicable(SMG_CACHE)),
    flag("--worker-warmup-blocks", One, "1024", NotApplicable(SMG_CACHE)),
    flag("--worker-warmup-thin-ratio", One, "0.5", NotApplicable(SMG_CACHE)),
    flag("--worker-warmup-divert-every", One, "8", NotApplicable(SMG_CACHE)),
    flag("--selection-policy", One, "cache-aware-default", NotApplicable(SMG_CACHE)),
    flag("--selection-accounting-ttl-ms", One, "0", NotApplicable(SMG_CACHE)),
    flag("--overlap-decay", One, "0.0", NotApplicable(SMG_CACHE)),
    flag("--selection-temperature", One, "0.0", NotApplicable(SMG_CACHE)),
    flag("--block-size", One, "16", NotApplicable(KV_EVENTS)),
    flag("--cache-boundaries", One, "", NotApplicable(SMG_CACHE)),
    flag("--cache-index", One, "tree", NotApplicable(SMG_CACHE)),
    flag("--cache-ttl-secs", One, "180", NotApplicable(SMG_CACHE)),
    flag("--max-buffered-request-bytes", One, "1048576", Elsewhere("bodies held at once are bounded by the filter's max_buffered_bytes (per Envoy worker thread) and --ext-proc-max-buffered-bytes; each body by --max-payload-size")),
    flag("--pd-admission-wait-secs", One, "30", NotYet(PD_ADMISSION)),
    flag("--stream-body-stall-timeout-secs", One, "300", Elsewhere("a request body that stops arriving is answered 408 by the router's body timeout; Envoy's stream idle_timeout bounds the rest")),
    flag("--sse-keepalive-secs", One, "15", NotApplicable("the worker's SSE stream passes through Envoy unchanged: the router adds no frames to it")),
    flag("--routing-key-override", Switch, "", NotYet(ROUTING_KEY)),
    flag("--routing-key-headers", Many, "", NotYet(ROUTING_KEY)),
    flag("--dp-minimum-tokens-scheduler", Switch, "", Elsewhere("with --dp-aware the rank with the fewest requests in flight (the router's own count) gets the request")),
    flag("--enable-rl", Switch, "", NotApplicable(RL)),
    flag("--rl-control-timeout-secs", One, "600", NotApplicable(RL)),
    flag("--rl-fanout-concurrency", One, "32", NotApplicable(RL)),
    flag("--epd-disaggregation", Switch, "", NotYet(EPD)),
    flag("--encode", Many, "", NotYet(EPD)),
    flag("--prefill-max-inflight-requests-per-worker", One, "-1", NotYet(PD_ADMISSION)),
    flag("--prefill-queue-size", One, "", NotYet(PD_ADMISSION)),
    flag("--prefill-queue-timeout-secs", One, "", NotYet(PD_ADMISSION)),
    flag("--worker-startup-delay", One, "0", Elsewhere("a worker is probed as soon as it is added and routed to once healthy")),
    flag("--job-queue-capacity", One, "1000", Elsewhere(NO_JOB_QUEUE)),
    flag("--job-queue-concurrency", One, "200", Elsewhere(NO_JOB_QUEUE)),
    flag("--multimodal-tensor-transport", One, "", NotApplicable(MULTIMODAL)),
    flag("--multimodal-shm-min-bytes", One, "", NotApplicable(MULTIMODAL)),
    flag("--multimodal-max-inflight-bytes", One, "", NotApplicable(MULTIMODAL)),
    flag("--mm-per-request-image-limit", One, "", NotApplicable(MULTIMODAL)),
    flag("--mm-processing", One, "", NotApplicable(MULTIMODAL)),
    flag("--mm-pixel-cache-mb", One, "", NotApplicable(MULTIMODAL)),
    flag("--mm-pixel-rdma", Switch, "", NotApplicable(MULTIMODAL)),
    flag("--mm-allowed-media-domains", One, "", NotApplicable(MULTIMODAL)),
    flag("--mm-allow-private-media-hosts", Switch, "", NotApplicable(MULTIMODAL)),
    flag("--rdma-listen-ip", One, "", NotApplicable(MULTIMODAL)),
    flag("--rdma-slot-ttl-s", One, "", NotApplicable(MULTIMODAL)),
    flag("--log-mm-timing", Switch, "", NotApplicable(MULTIMODAL)),
    flag("--log-json", Switch, "", NotYet("logs are text lines (tracing's format); Envoy's access log can be JSON (docs/operations.md)")),
    flag("--discovery-provider", One, "", NotYet(DISCOVERY)),
    flag("--discovery-file", One, "", NotYet(DISCOVERY)),
    flag("--discovery-check-interval-secs", One, "", NotYet(DISCOVERY)),
    flag("--kv-connector-annotation", One, "smg.ai/kv-connector", NotApplicable(VLLM_KV)),
    flag("--kv-engine-id-annotation", One, "smg.ai/kv-engine-id", NotApplicable(VLLM_KV)),
    flag("--encode-selector", Many, "", NotYet(EPD)),
    flag("--router-selector", Many, "", NotYet(MESH)),
    flag("--model-id-from", One, "", NotYet("a worker's model comes from the worker itself")),
    flag("--model-alias", One, "", NotYet("a request's model must be one a worker serves")),
    flag("--jemalloc-prof-dir", One, "", NotApplicable("the control plane is not built with jemalloc; profile it with perf")),
    flag("--storage-context-headers", Many, "", NotApplicable(HISTORY)),
    flag("--header-read-timeout-secs", One, "30", Elsewhere("client connections are Envoy's: set it on the listener's HTTP connection manager in envoy/envoy.yaml (request_headers_timeout)")),
    flag("--idle-connection-timeout-secs", One, "90", Elsewhere("client connections are Envoy's: set it on the listener's HTTP connection manager in envoy/envoy.yaml (common_http_protocol_options.idle_timeout)")),
    flag("--max-background-responses", One, "1024", NotApplicable(HISTORY)),
    flag("--remove-unhealthy-workers", Switch, "", Elsewhere(UNHEALTHY)),
    flag("--disable-tokenizer-autoload", Switch, "", Elsewhere("the router loads no tokenizer")),
    flag("--parser", One, "legacy", NotApplicable(TOKENIZER)),
    flag("--tokenizer-cache-l0-max-memory", One, "268435456", NotApplicable(TOKENIZER)),
    flag("--zmq-engine-count", One, "", NotApplicable("workers are reached over HTTP: smg's ZMQ and gRPC engine transports are not used")),
    flag("--enable-wasm", Switch, "", NotApplicable("request hooks go in Envoy's own filter chain (where this router's wasm filter runs), not in router plug-ins")),
    flag("--storage-hook-wasm-path", One, "", NotApplicable(HISTORY)),
    flag("--history-memory-max-responses", One, "10000", NotApplicable(HISTORY)),
    flag("--history-memory-max-items", One, "100000", NotApplicable(HISTORY)),
    flag("--history-memory-retention-secs", One, "86400", NotApplicable(HISTORY)),
    flag("--oracle-external-auth", Switch, "", NotApplicable(HISTORY)),
    flag("--postgres-op-timeout-secs", One, "5", NotApplicable(HISTORY)),
    flag("--redis-op-timeout-secs", One, "5", NotApplicable(HISTORY)),
    flag("--schema-config", One, "", NotApplicable(HISTORY)),
    flag("--tenant-api-key", One, "", NotYet(TENANTS)),
    flag("--enable-mesh", Switch, "", NotYet(MESH)),
    flag("--mesh-server-name", One, "", NotYet(MESH)),
    flag("--mesh-host", One, "0.0.0.0", NotYet(MESH)),
    flag("--mesh-advertise-host", One, "", NotYet(MESH)),
    flag("--mesh-port", One, "39527", NotYet(MESH)),
    flag("--mesh-peer-urls", Many, "", NotYet(MESH)),
    flag("--mesh-tls-ca-cert", One, "", NotYet(MESH)),
    flag("--mesh-tls-cert", One, "", NotYet(MESH)),
    flag("--mesh-tls-key", One, "", NotYet(MESH)),
    flag("--no-remove-unhealthy-workers", Switch, "", Elsewhere(UNHEALTHY)),
];
