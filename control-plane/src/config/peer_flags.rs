//! sglang-router 0.3.2's flags that this router does not take as its own,
//! and its answer to each (smg 1.13.0's own flags are answered the same way
//! in `smg_flags.rs`; `launch_screen.rs` screens launch lines against both,
//! and docs/flags.md's "sglang-router flags" table lists the same answers).
//!
//! Flags given with sglang-router's default value change nothing and are
//! accepted whatever the answer (launch lines often spell defaults out).

use super::flag_answer::{flag, PeerFlag, Values, Verdict, HISTORY, TOKENIZER};
use Values::{Many, One, Switch};
use Verdict::{Elsewhere, NotApplicable};

const TLS: &str = "clients reach Envoy's listener, which serves TLS with these files: envoy/render.sh's LISTEN_TLS_CERT/LISTEN_TLS_KEY, which scripts/quickstart.sh takes from these flags (docker compose from .env); an Envoy configured elsewhere needs its own DownstreamTlsContext";

/// sglang-router flags this control plane parses under the same name but
/// that mean something else here or change nothing, with how: labelled
/// "supported differently" in docs/flags.md, and noted at start when given.
pub const OWN_BUT_DIFFERENT: &[(&str, &str)] = &[
    ("--model-path", super::kv_events_flags::TOKENIZER_DIR),
    ("--tokenizer-path", super::kv_events_flags::TOKENIZER_DIR),
    ("--chat-template", super::kv_events_flags::CHAT_TEMPLATE_FILE),
    (
        "--worker-startup-check-interval",
        "accepted and changes nothing: sglang-router 0.3.2 polls each worker's /get_load at this period for power_of_two; here every policy reads each worker's load report every --load-monitor-interval",
    ),
    (
        "--request-timeout-secs",
        "a request whose end is never reported stops counting after this; Envoy's route timeout (1800 s in envoy/envoy.yaml) bounds the request itself",
    ),
    (
        "--retry-initial-backoff-ms",
        "accepted and changes nothing: Envoy retries with the route's retry_back_off (50 ms to 30 s, doubling, full jitter)",
    ),
    (
        "--retry-max-backoff-ms",
        "accepted and changes nothing: Envoy retries with the route's retry_back_off (50 ms to 30 s, doubling, full jitter)",
    ),
    (
        "--retry-backoff-multiplier",
        "accepted and changes nothing: Envoy retries with the route's retry_back_off (50 ms to 30 s, doubling, full jitter)",
    ),
    (
        "--retry-jitter-factor",
        "accepted and changes nothing: Envoy retries with the route's retry_back_off (50 ms to 30 s, doubling, full jitter)",
    ),
];

/// sglang-router 0.3.2's flags this router does not parse itself.
pub const PEER_FLAGS: &[PeerFlag] = &[
    flag("--port", One, "30000", Elsewhere("clients reach Envoy's listener, whose port is set where Envoy is configured (PORT for scripts/quickstart.sh, the listener in envoy/envoy.yaml); the control plane listens on --admin-port and --grpc-port")),
    flag("--enable-igw", Switch, "", Elsewhere("routing by the request's model is always on: when the workers serve several models, each request goes to those serving its model, and a model none serves is a 404 model_not_found (docs/routing.md)")),
    flag("--mini-lb", Switch, "", NotApplicable("sglang-router's Python debugging balancer")),
    flag("--log-dir", One, "", Elsewhere("logs go to standard output, for the container runtime or systemd to keep")),
    flag("--request-id-headers", Many, "", Elsewhere("Envoy keeps a client's x-request-id (and makes one when it is missing), and every client header reaches the worker unchanged")),
    flag("--cors-allowed-origins", Many, "[]", Elsewhere("browsers' cross-origin requests are answered by Envoy's CORS filter, rendered from the same origins (envoy/render.sh CORS_ALLOWED_ORIGINS; scripts/quickstart.sh passes this flag's origins on; docker compose reads CORS_ALLOWED_ORIGINS)")),
    flag("--tokenizer-cache-enable-l0", Switch, "", NotApplicable(TOKENIZER)),
    flag("--tokenizer-cache-l0-max-entries", One, "10000", NotApplicable(TOKENIZER)),
    flag("--tokenizer-cache-enable-l1", Switch, "", NotApplicable(TOKENIZER)),
    flag("--tokenizer-cache-l1-max-memory", One, "52428800", NotApplicable(TOKENIZER)),
    flag("--reasoning-parser", One, "", NotApplicable(TOKENIZER)),
    flag("--tool-call-parser", One, "", NotApplicable(TOKENIZER)),
    flag("--mcp-config-path", One, "", NotApplicable("the router does not call MCP tools: it forwards requests to SGLang workers")),
    flag("--backend", One, "sglang", NotApplicable("the router routes SGLang workers only (sglang, the default, is accepted)")),
    flag("--history-backend", One, "memory", NotApplicable(HISTORY)),
    flag("--oracle-wallet-path", One, "", NotApplicable(HISTORY)),
    flag("--oracle-tns-alias", One, "", NotApplicable(HISTORY)),
    flag("--oracle-connect-descriptor", One, "", NotApplicable(HISTORY)),
    flag("--oracle-username", One, "", NotApplicable(HISTORY)),
    flag("--oracle-password", One, "", NotApplicable(HISTORY)),
    flag("--oracle-pool-min", One, "1", NotApplicable(HISTORY)),
    flag("--oracle-pool-max", One, "16", NotApplicable(HISTORY)),
    flag("--oracle-pool-timeout-secs", One, "30", NotApplicable(HISTORY)),
    flag("--postgres-db-url", One, "", NotApplicable(HISTORY)),
    flag("--postgres-pool-max", One, "16", NotApplicable(HISTORY)),
    flag("--redis-url", One, "", NotApplicable(HISTORY)),
    flag("--redis-pool-max", One, "16", NotApplicable(HISTORY)),
    flag("--redis-retention-days", One, "30", NotApplicable(HISTORY)),
    flag("--rate-limit-tokens-per-second", One, "", Elsewhere("admission control here is a strict limit of --max-concurrent-requests with a queue; sglang-router refills its request tokens at this rate besides returning them, so more than the limit can run there: the flag is accepted and the limit stays strict")),
    flag("--tls-cert-path", One, "", Elsewhere(TLS)),
    flag("--tls-key-path", One, "", Elsewhere(TLS)),
];
