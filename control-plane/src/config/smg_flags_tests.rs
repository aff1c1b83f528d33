//! Every flag of smg 1.13.0 is accounted for (parsed here, answered as
//! sglang-router's, or answered as smg's own), launch lines copied from an
//! smg deployment are screened as the table says, and docs/flags.md's
//! "smg flags" table agrees with it.

use std::collections::BTreeSet;

use super::launch_screen::find;
use super::peer_flags::PEER_FLAGS;
use super::peer_flags_tests::{argv, own_flags};
use super::smg_flags::{OWN_BUT_DIFFERENT, SMG_FLAGS};
use super::{Args, LEAST_LOAD_ENGINE_FLAGS, LEAST_LOAD_ENGINE_NOTE};

/// `smg launch --help` of smg 1.13.0: the long name of every flag (212), in
/// its order, then the negative form of its one `--[no-]` switch.
const SMG_1_13_0: &[&str] = &[
    "--host",
    "--port",
    "--worker-urls",
    "--upstream-http2",
    "--upstream-pool-idle-timeout-secs",
    "--health-check-port",
    "--policy",
    "--encode-policy",
    "--prefill-policy",
    "--decode-policy",
    "--cache-threshold",
    "--prefix-token-count",
    "--prefix-hash-load-factor",
    "--prefix-hash-balance-abs-threshold",
    "--least-load-kv-pressure-weight",
    "--least-load-default-throughput",
    "--least-load-mean-prefill-tokens",
    "--least-load-max-waiting-requests",
    "--power-of-two-load-metric",
    "--balance-abs-threshold",
    "--balance-rel-threshold",
    "--balance-token-usage-threshold",
    "--overload-token-usage-threshold",
    "--worker-overload-waiting-requests",
    "--worker-overload-token-usage",
    "--worker-overload-protection",
    "--disable-worker-overload-protection",
    "--worker-overload-shed",
    "--kv-index",
    "--worker-stall-secs",
    "--worker-wedge-secs",
    "--worker-stale-secs",
    "--worker-warmup-secs",
    "--worker-warmup-share",
    "--worker-warmup-blocks",
    "--worker-warmup-thin-ratio",
    "--worker-warmup-divert-every",
    "--selection-policy",
    "--selection-accounting-ttl-ms",
    "--overlap-decay",
    "--selection-temperature",
    "--bucket-adjust-interval-secs",
    "--eviction-interval-secs",
    "--max-tree-size",
    "--block-size",
    "--cache-boundaries",
    "--cache-index",
    "--cache-ttl-secs",
    "--max-idle-secs",
    "--assignment-mode",
    "--max-payload-size",
    "--max-buffered-request-bytes",
    "--pd-admission-wait-secs",
    "--stream-body-stall-timeout-secs",
    "--sse-keepalive-secs",
    "--dp-aware",
    "--routing-key-override",
    "--routing-key-headers",
    "--dp-minimum-tokens-scheduler",
    "--enable-igw",
    "--enable-rl",
    "--rl-control-timeout-secs",
    "--rl-fanout-concurrency",
    "--pd-disaggregation",
    "--epd-disaggregation",
    "--encode",
    "--prefill",
    "--decode",
    "--prefill-max-inflight-requests-per-worker",
    "--prefill-queue-size",
    "--prefill-queue-timeout-secs",
    "--worker-startup-timeout-secs",
    "--worker-startup-delay",
    "--worker-startup-check-interval",
    "--job-queue-capacity",
    "--job-queue-concurrency",
    "--load-monitor-interval",
    "--disable-load-monitoring",
    "--multimodal-tensor-transport",
    "--multimodal-shm-min-bytes",
    "--multimodal-max-inflight-bytes",
    "--mm-per-request-image-limit",
    "--mm-processing",
    "--mm-pixel-cache-mb",
    "--mm-pixel-rdma",
    "--mm-allowed-media-domains",
    "--mm-allow-private-media-hosts",
    "--rdma-listen-ip",
    "--rdma-slot-ttl-s",
    "--log-mm-timing",
    "--log-dir",
    "--log-level",
    "--log-json",
    "--service-discovery",
    "--discovery-provider",
    "--discovery-file",
    "--discovery-check-interval-secs",
    "--selector",
    "--service-discovery-port",
    "--service-discovery-namespace",
    "--kv-connector-annotation",
    "--kv-engine-id-annotation",
    "--encode-selector",
    "--prefill-selector",
    "--decode-selector",
    "--router-selector",
    "--model-id-from",
    "--model-alias",
    "--prometheus-port",
    "--prometheus-host",
    "--prometheus-duration-buckets",
    "--jemalloc-prof-dir",
    "--request-id-headers",
    "--storage-context-headers",
    "--request-timeout-secs",
    "--shutdown-grace-period-secs",
    "--header-read-timeout-secs",
    "--idle-connection-timeout-secs",
    "--trust-tenant-header",
    "--tenant-header-name",
    "--cors-allowed-origins",
    "--max-concurrent-requests",
    "--queue-size",
    "--queue-timeout-secs",
    "--rate-limit-tokens-per-second",
    "--max-background-responses",
    "--priority-scheduler-enabled",
    "--priority-scheduler-default-max-class",
    "--priority-scheduler-config",
    "--priority-scheduler-tenant-metric-top-n",
    "--tenant-rate-limit-enabled",
    "--tenant-rate-limit-config",
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
    "--remove-unhealthy-workers",
    "--model-path",
    "--tokenizer-path",
    "--chat-template",
    "--disable-tokenizer-autoload",
    "--parser",
    "--tokenizer-cache-enable-l0",
    "--tokenizer-cache-l0-max-entries",
    "--tokenizer-cache-enable-l1",
    "--tokenizer-cache-l0-max-memory",
    "--tokenizer-cache-l1-max-memory",
    "--reasoning-parser",
    "--tool-call-parser",
    "--mcp-config-path",
    "--backend",
    "--zmq-engine-count",
    "--enable-wasm",
    "--storage-hook-wasm-path",
    "--history-backend",
    "--history-memory-max-responses",
    "--history-memory-max-items",
    "--history-memory-retention-secs",
    "--oracle-wallet-path",
    "--oracle-tns-alias",
    "--oracle-connect-descriptor",
    "--oracle-username",
    "--oracle-password",
    "--oracle-external-auth",
    "--oracle-pool-min",
    "--oracle-pool-max",
    "--oracle-pool-timeout-secs",
    "--postgres-db-url",
    "--postgres-pool-max",
    "--postgres-op-timeout-secs",
    "--redis-url",
    "--redis-pool-max",
    "--redis-retention-days",
    "--redis-op-timeout-secs",
    "--schema-config",
    "--client-cert-path",
    "--client-key-path",
    "--ca-cert-paths",
    "--tls-cert-path",
    "--tls-key-path",
    "--enable-trace",
    "--otlp-traces-endpoint",
    "--api-key",
    "--tenant-api-key",
    "--control-plane-api-keys",
    "--control-plane-audit-enabled",
    "--jwt-issuer",
    "--jwt-audience",
    "--jwt-jwks-uri",
    "--jwt-role-mapping",
    "--enable-mesh",
    "--mesh-server-name",
    "--mesh-host",
    "--mesh-advertise-host",
    "--mesh-port",
    "--mesh-peer-urls",
    "--mesh-tls-ca-cert",
    "--mesh-tls-cert",
    "--mesh-tls-key",
    "--no-remove-unhealthy-workers",
];

#[test]
fn every_smg_flag_is_parsed_or_answered_never_both() {
    assert_eq!(SMG_1_13_0.len(), 213);
    let own = own_flags();
    for name in SMG_1_13_0 {
        let answered = find(name).is_some();
        assert!(
            own.contains(*name) != answered,
            "{name}: parsed {}, answered {answered}",
            own.contains(*name)
        );
    }
    for f in SMG_FLAGS {
        assert!(SMG_1_13_0.contains(&f.name), "{} is not smg's", f.name);
        assert!(
            !PEER_FLAGS.iter().any(|p| p.name == f.name),
            "{} is sglang-router's too: answer it there",
            f.name
        );
    }
}

#[test]
fn an_smg_launch_line_starts_with_notes_for_what_is_done_elsewhere() {
    // The shape of an smg deployment's line: smg's own flags at their
    // defaults or done another way here, beside sglang-router's.
    let line = "--worker-urls http://10.0.0.1:8000 --policy cache_aware \
                --disable-tokenizer-autoload --upstream-pool-idle-timeout-secs 3 \
                --mesh-port 39527 --log-level info --remove-unhealthy-workers";
    let args = Args::try_parse_args(argv(line)).unwrap();
    assert_eq!(args.worker_urls, ["http://10.0.0.1:8000"]);
    let notes = &args.peer_notes;
    assert_eq!(notes.len(), 4, "{notes:?}");
    assert!(
        notes[0].starts_with("--disable-tokenizer-autoload (smg's)"),
        "{notes:?}"
    );
    assert!(notes[2].contains("smg's default value"), "{notes:?}");
}

#[test]
fn a_refused_smg_flag_is_named_with_its_row() {
    for (line, flag) in [
        ("--enable-mesh --mesh-peer-urls a:1", "--enable-mesh"),
        ("--mm-processing router", "--mm-processing"),
        ("--worker-warmup-secs 5", "--worker-warmup-secs"),
    ] {
        let e = Args::try_parse_args(argv(&format!("--worker-urls http://a:1 {line}")))
            .expect_err(line)
            .to_string();
        assert!(e.contains(&format!("{flag} is an smg flag")), "{e}");
        assert!(e.contains("\"smg flags\", row"), "{e}");
    }
}

#[test]
fn the_smg_table_gives_every_flag_the_same_answer() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/flags.md")).unwrap();
    let section = doc
        .split("## smg flags")
        .nth(1)
        .expect("a docs/flags.md section \"smg flags\"");
    let own = own_flags();
    let sglang_router: BTreeSet<&str> = doc
        .split("## sglang-router flags")
        .nth(1)
        .and_then(|s| s.split("## smg flags").next())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .collect();
    for name in SMG_1_13_0 {
        let row = section
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}`")));
        if sglang_router.contains(name) {
            assert!(
                row.is_none(),
                "{name} is answered in the sglang-router table"
            );
            continue;
        }
        let row = row.unwrap_or_else(|| panic!("no docs/flags.md smg row for {name}"));
        let label = match SMG_FLAGS.iter().find(|f| f.name == *name) {
            Some(f) => {
                assert!(
                    row.contains(f.answer.reason()),
                    "{name}: docs/flags.md says why: {row}"
                );
                f.answer.label()
            }
            None if OWN_BUT_DIFFERENT.iter().any(|(f, _)| f == name) => {
                let how = OWN_BUT_DIFFERENT
                    .iter()
                    .find(|(f, _)| f == name)
                    .map_or("", |(_, h)| h);
                assert!(own.contains(*name), "{name} is parsed here");
                assert!(row.contains(how), "{name}: docs/flags.md says how: {row}");
                "supported differently"
            }
            None if LEAST_LOAD_ENGINE_FLAGS.contains(name) => {
                assert!(own.contains(*name), "{name} is parsed here");
                assert!(
                    row.contains(LEAST_LOAD_ENGINE_NOTE),
                    "{name}: docs/flags.md says how: {row}"
                );
                "supported differently"
            }
            None => {
                assert!(own.contains(*name), "{name} is parsed here");
                "supported"
            }
        };
        let cell = row.split('|').nth(2).unwrap_or_default().trim();
        assert_eq!(cell, label, "docs/flags.md row of {name}: {row}");
    }
    // And no row for a flag smg does not have.
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let name = line
            .trim_start_matches("| `")
            .split('`')
            .next()
            .unwrap_or_default();
        assert!(SMG_1_13_0.contains(&name), "{name} is not smg's");
    }
}
