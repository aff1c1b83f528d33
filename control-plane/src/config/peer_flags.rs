//! sglang-router 0.3.2's flags that this router does not take as its own,
//! and its answer to each (smg 1.13.0's own flags are answered the same way
//! in [`super::smg_flags`]). A launch line copied from an sglang-router or
//! smg deployment either starts this router or stops at the first flag it
//! cannot honour, with a message naming the flag and the table in docs/flags.md
//! ("sglang-router flags", "smg flags") that lists the same answers.
//!
//! Flags given with sglang-router's default value change nothing and are
//! accepted whatever the answer (launch lines often spell defaults out).

use std::ffi::OsString;

use super::smg_flags::SMG_FLAGS;

/// How many values a flag takes (as sglang-router's argparse defines it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// None: a switch.
    Switch,
    /// Exactly one.
    One,
    /// Any number, up to the next flag.
    Many,
}

/// This router's answer to one of sglang-router's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted: what it asks for is done another way (how).
    Elsewhere(&'static str),
    /// Refused: a router inside Envoy has no use for it (why).
    NotApplicable(&'static str),
    /// Refused: not built yet (what to do meanwhile).
    NotYet(&'static str),
}

impl Verdict {
    /// The answer's name in docs/flags.md's table.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Elsewhere(_) => "supported differently",
            Verdict::NotApplicable(_) => "refused: not applicable",
            Verdict::NotYet(_) => "refused: not built yet",
        }
    }

    /// Why, or how.
    pub fn reason(self) -> &'static str {
        match self {
            Verdict::Elsewhere(r) | Verdict::NotApplicable(r) | Verdict::NotYet(r) => r,
        }
    }
}

/// One of sglang-router's flags and this router's answer.
#[derive(Debug, Clone, Copy)]
pub struct PeerFlag {
    /// `--name`
    pub name: &'static str,
    /// How many values it takes.
    pub values: Values,
    /// sglang-router's default, as text (empty: none).
    pub default: &'static str,
    /// This router's answer.
    pub answer: Verdict,
}

pub(super) const fn flag(
    name: &'static str,
    values: Values,
    default: &'static str,
    answer: Verdict,
) -> PeerFlag {
    PeerFlag {
        name,
        values,
        default,
        answer,
    }
}

use Values::{Many, One, Switch};
use Verdict::{Elsewhere, NotApplicable};

pub(super) const TOKENIZER: &str = "the router inside Envoy forwards HTTP: it does not tokenize, apply chat templates or parse model output (SGLang workers do)";
pub(super) const HISTORY: &str = "the router keeps no conversation history: it forwards the OpenAI/SGLang endpoints to workers and stores nothing";
const TLS: &str = "clients reach Envoy's listener, which serves TLS with these files: envoy/render.sh's LISTEN_TLS_CERT/LISTEN_TLS_KEY, which scripts/quickstart.sh takes from these flags (docker compose from .env); an Envoy configured elsewhere needs its own DownstreamTlsContext";

/// sglang-router flags this control plane parses under the same name but
/// that mean something else here or change nothing, with how: labelled
/// "supported differently" in docs/flags.md, and noted at start when given.
pub const OWN_BUT_DIFFERENT: &[(&str, &str)] = &[
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
    flag("--shutdown-grace-period-secs", One, "180", Elsewhere("requests in flight belong to Envoy, which drains them on its own shutdown (--drain-time-s); while the control plane is away the filter keeps routing from its last worker list")),
    flag("--cors-allowed-origins", Many, "[]", Elsewhere("browsers' cross-origin requests are answered by Envoy's CORS filter, rendered from the same origins (envoy/render.sh CORS_ALLOWED_ORIGINS; scripts/quickstart.sh passes this flag's origins on; docker compose reads CORS_ALLOWED_ORIGINS)")),
    flag("--model-path", One, "", NotApplicable(TOKENIZER)),
    flag("--tokenizer-path", One, "", NotApplicable(TOKENIZER)),
    flag("--chat-template", One, "", NotApplicable(TOKENIZER)),
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

/// The router whose flag `name` is (`sglang-router` or `smg`), and its
/// table entry. sglang-router's come first: smg kept most of them.
pub fn find(name: &str) -> Option<(&'static str, &'static PeerFlag)> {
    let of = |router, table: &'static [PeerFlag]| {
        table.iter().find(|f| f.name == name).map(|f| (router, f))
    };
    of("sglang-router", PEER_FLAGS).or_else(|| of("smg", SMG_FLAGS))
}

/// Takes sglang-router's and smg's flags out of `argv`: those accepted (answered
/// `Elsewhere`, or given their default value) are removed, with a note to
/// log for each; the first refused one is an error naming it.
pub fn screen(argv: Vec<OsString>) -> Result<(Vec<OsString>, Vec<String>), String> {
    let mut kept = Vec::with_capacity(argv.len());
    let mut notes = Vec::new();
    let mut rest = argv.into_iter().peekable();
    while let Some(arg) = rest.next() {
        let text = arg.to_string_lossy().into_owned();
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (text.clone(), None),
        };
        let Some((router, peer)) = find(&name) else {
            kept.push(arg);
            continue;
        };
        let is_flag = |a: &OsString| a.to_string_lossy().starts_with("--");
        let mut values: Vec<String> = inline.into_iter().collect();
        match peer.values {
            Values::Switch => {}
            Values::One if values.is_empty() => {
                if let Some(v) = rest.next_if(|a| !is_flag(a)) {
                    values.push(v.to_string_lossy().into_owned());
                }
            }
            Values::One => {}
            Values::Many => {
                while let Some(v) = rest.next_if(|a| !is_flag(a)) {
                    values.push(v.to_string_lossy().into_owned());
                }
            }
        }
        let default = match peer.values {
            Values::Switch => false,
            Values::One => values.len() == 1 && values[0] == peer.default,
            Values::Many => values.is_empty(),
        };
        match peer.answer {
            Verdict::Elsewhere(how) => notes.push(format!("{name} ({router}'s): {how}")),
            _ if default => notes.push(format!(
                "{name} has {router}'s default value and changes nothing here"
            )),
            answer => {
                return Err(format!(
                    "{name} is an {router} flag this router does not take ({}): {}. \
                     See docs/flags.md, section \"{router} flags\", row {name}.",
                    answer.label(),
                    answer.reason()
                ))
            }
        }
    }
    Ok((kept, notes))
}
