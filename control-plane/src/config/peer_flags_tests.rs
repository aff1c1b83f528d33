//! Every flag of sglang-router 0.3.2 is accounted for, launch lines are
//! screened as the table says, and docs/flags.md's table agrees with it.

use std::collections::BTreeSet;
use std::ffi::OsString;

use clap::CommandFactory;

use super::flag_answer::Verdict;
use super::launch_screen::screen;
use super::peer_flags::{OWN_BUT_DIFFERENT, PEER_FLAGS};
use super::Args;

/// `python -m sglang_router.launch_router --help` of sglang-router 0.3.2:
/// the long name of every flag (98), in its order.
const SGLANG_ROUTER_0_3_2: &[&str] = &[
    "--host",
    "--port",
    "--worker-urls",
    "--policy",
    "--prefill-policy",
    "--decode-policy",
    "--worker-startup-timeout-secs",
    "--worker-startup-check-interval",
    "--cache-threshold",
    "--balance-abs-threshold",
    "--balance-rel-threshold",
    "--bucket-adjust-interval-secs",
    "--eviction-interval-secs",
    "--max-tree-size",
    "--max-idle-secs",
    "--assignment-mode",
    "--max-payload-size",
    "--enable-igw",
    "--pd-disaggregation",
    "--prefill",
    "--decode",
    "--mini-lb",
    "--max-concurrent-requests",
    "--queue-size",
    "--queue-timeout-secs",
    "--rate-limit-tokens-per-second",
    "--log-dir",
    "--log-level",
    "--service-discovery",
    "--selector",
    "--service-discovery-port",
    "--service-discovery-namespace",
    "--prefill-selector",
    "--decode-selector",
    "--prometheus-port",
    "--prometheus-host",
    "--prometheus-duration-buckets",
    "--request-id-headers",
    "--request-timeout-secs",
    "--shutdown-grace-period-secs",
    "--cors-allowed-origins",
    "--retry-max-retries",
    "--retry-initial-backoff-ms",
    "--retry-max-backoff-ms",
    "--retry-backoff-multiplier",
    "--retry-jitter-factor",
    "--disable-retries",
    "--cb-failure-threshold",
    "--cb-success-threshold",
    "--cb-timeout-duration-secs",
    "--cb-window-duration-secs",
    "--disable-circuit-breaker",
    "--health-failure-threshold",
    "--health-success-threshold",
    "--health-check-timeout-secs",
    "--health-check-interval-secs",
    "--health-check-endpoint",
    "--disable-health-check",
    "--dp-aware",
    "--model-path",
    "--tokenizer-path",
    "--chat-template",
    "--tokenizer-cache-enable-l0",
    "--tokenizer-cache-l0-max-entries",
    "--tokenizer-cache-enable-l1",
    "--tokenizer-cache-l1-max-memory",
    "--reasoning-parser",
    "--tool-call-parser",
    "--mcp-config-path",
    "--backend",
    "--history-backend",
    "--oracle-wallet-path",
    "--oracle-tns-alias",
    "--oracle-connect-descriptor",
    "--oracle-username",
    "--oracle-password",
    "--oracle-pool-min",
    "--oracle-pool-max",
    "--oracle-pool-timeout-secs",
    "--postgres-db-url",
    "--postgres-pool-max",
    "--redis-url",
    "--redis-pool-max",
    "--redis-retention-days",
    "--client-cert-path",
    "--client-key-path",
    "--ca-cert-paths",
    "--tls-cert-path",
    "--tls-key-path",
    "--enable-trace",
    "--otlp-traces-endpoint",
    "--api-key",
    "--control-plane-api-keys",
    "--control-plane-audit-enabled",
    "--jwt-issuer",
    "--jwt-audience",
    "--jwt-jwks-uri",
    "--jwt-role-mapping",
];

/// The long flags `Args` parses itself.
pub(super) fn own_flags() -> BTreeSet<String> {
    Args::command()
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(|l| format!("--{l}"))
        .collect()
}

/// `line` as the control plane's argv.
pub(super) fn argv(line: &str) -> Vec<OsString> {
    std::iter::once("sglang-envoy-control-plane")
        .chain(line.split_whitespace())
        .map(OsString::from)
        .collect()
}

#[test]
fn every_sglang_router_flag_is_parsed_or_answered_never_both() {
    assert_eq!(SGLANG_ROUTER_0_3_2.len(), 98);
    let own = own_flags();
    for name in SGLANG_ROUTER_0_3_2 {
        let answered = PEER_FLAGS.iter().any(|f| f.name == *name);
        assert!(
            own.contains(*name) != answered,
            "{name}: parsed {}, answered {answered}",
            own.contains(*name)
        );
    }
    for f in PEER_FLAGS {
        assert!(
            SGLANG_ROUTER_0_3_2.contains(&f.name),
            "{} is not sglang-router's",
            f.name
        );
    }
}

#[test]
fn accepted_flags_leave_the_line_with_a_note_and_the_rest_is_parsed() {
    let line = "--worker-urls http://10.0.0.1:8000 --port 30000 --log-dir /var/log/r \
                --request-id-headers x-request-id x-trace-id --backend sglang \
                --history-backend=memory --policy round_robin --prometheus-port 29000";
    let args = Args::try_parse_args(argv(line)).unwrap();
    assert_eq!(args.worker_urls, ["http://10.0.0.1:8000"]);
    assert_eq!(args.policy, super::PolicyKind::RoundRobin);
    assert_eq!(args.prometheus_port, Some(29000));
    assert_eq!(args.peer_notes.len(), 5, "{:?}", args.peer_notes);
    assert!(
        args.peer_notes[0].starts_with("--port"),
        "{:?}",
        args.peer_notes
    );
}

#[test]
fn refused_flags_are_named_with_the_readme_row() {
    for (line, flag) in [
        ("--backend openai", "--backend"),
        (
            "--history-backend redis --redis-url redis://r",
            "--history-backend",
        ),
    ] {
        let e = Args::try_parse_args(argv(&format!("--worker-urls http://a:1 {line}")))
            .expect_err(line)
            .to_string();
        assert!(
            e.contains(&format!("{flag} is an sglang-router flag")),
            "{e}"
        );
        assert!(e.contains("\"sglang-router flags\", row"), "{e}");
    }
}

#[test]
fn the_screen_leaves_unknown_flags_to_clap() {
    let (kept, notes) = screen(argv("--no-such-flag 1 --port 2")).unwrap();
    assert_eq!(kept, argv("--no-such-flag 1"));
    assert_eq!(notes.len(), 1);
    assert!(Args::try_parse_args(argv("--no-such-flag 1")).is_err());
}

#[test]
fn the_flag_table_gives_every_flag_the_same_answer() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/flags.md")).unwrap();
    let section = doc
        .split("## sglang-router flags")
        .nth(1)
        .expect("a docs/flags.md section \"sglang-router flags\"");
    let own = own_flags();
    for name in SGLANG_ROUTER_0_3_2 {
        let row = section
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}`")))
            .unwrap_or_else(|| panic!("no docs/flags.md row for {name}"));
        let different = OWN_BUT_DIFFERENT.iter().find(|(f, _)| f == name);
        let label = match PEER_FLAGS.iter().find(|f| f.name == *name) {
            Some(f) => f.answer.label(),
            None if different.is_some() => "supported differently",
            None => {
                assert!(own.contains(*name));
                "supported"
            }
        };
        if let Some((_, how)) = different {
            assert!(own.contains(*name), "{name} is parsed here");
            assert!(row.contains(how), "{name}: docs/flags.md says how: {row}");
        }
        let cell = row.split('|').nth(2).unwrap_or_default().trim();
        assert_eq!(cell, label, "docs/flags.md row of {name}: {row}");
        if let Some(f) = PEER_FLAGS.iter().find(|f| f.name == *name) {
            if let Verdict::Elsewhere(_) = f.answer {
                assert!(
                    row.contains(f.answer.reason()),
                    "{name}: docs/flags.md says how"
                );
            }
        }
    }
}
