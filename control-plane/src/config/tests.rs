//! Flags parse as sglang-router's do, and bad combinations are refused.

use super::*;
use sglang_envoy_core::admission::class::Class;

#[test]
fn defaults_match_sglang_router() {
    let a = Args::parse_from(["cp"]);
    assert_eq!(a.policy, PolicyKind::CacheAware);
    assert_eq!(a.cache_threshold, 0.3);
    assert_eq!(a.balance_abs_threshold, 64);
    assert_eq!(a.balance_rel_threshold, 1.5);
    assert_eq!(a.eviction_interval_secs, 60);
    assert_eq!(a.max_tree_size, 67_108_864);
    assert_eq!(a.health_check_interval_secs, 60);
    assert_eq!(a.health_failure_threshold, 3);
    assert_eq!(a.wire_profile.forced(), None, "auto by default");
    assert_eq!(a.max_idle_secs, 14400);
    assert_eq!(a.worker_startup_timeout_secs, 1800);
    assert_eq!(a.dns_refresh_secs, 10);
    assert_eq!(a.worker_startup_check_interval, 30);
    assert_eq!(a.assignment_mode, AssignmentMode::Random);
    assert!(a.validate().is_ok());
    // `seeds`: the legacy profile's first name, still accepted.
    for name in ["legacy", "seeds"] {
        let legacy = Args::parse_from(["cp", "--wire-profile", name]);
        assert_eq!(
            legacy.wire_profile.forced(),
            Some(sglang_envoy_body::WireProfile::Legacy)
        );
    }
    assert!(Args::try_parse_from(["cp", "--wire-profile", "latest"]).is_err());
}

#[test]
fn worker_urls_take_several_values() {
    let a = Args::parse_from([
        "cp",
        "--worker-urls",
        "http://a:1",
        "http://b:2",
        "--policy",
        "round_robin",
    ]);
    assert_eq!(a.worker_urls, ["http://a:1", "http://b:2"]);
    assert_eq!(a.policy, PolicyKind::RoundRobin);
}

#[test]
fn pd_flags_as_sglang_router_takes_them() {
    let a = Args::try_parse_args([
        "cp",
        "--pd-disaggregation",
        "--prefill",
        "http://p1:30001",
        "9001",
        "--prefill",
        "http://p2:30001",
        "none",
        "--prefill",
        "http://p3:30001",
        "--decode",
        "http://d1:30002",
        "--decode",
        "http://d2:30002",
        "--policy",
        "random",
        "--decode-policy",
        "round_robin",
    ])
    .unwrap();
    assert!(a.validate().is_ok(), "{:?}", a.validate());
    assert_eq!(
        a.prefill_workers().unwrap(),
        [
            ("http://p1:30001".to_string(), Some(9001)),
            ("http://p2:30001".to_string(), None),
            ("http://p3:30001".to_string(), None),
        ]
    );
    assert_eq!(a.decode, ["http://d1:30002", "http://d2:30002"]);
    assert_eq!(a.prefill_policy(), PolicyKind::Random);
    assert_eq!(a.decode_policy(), PolicyKind::RoundRobin);
    let bad = Args::try_parse_args([
        "cp",
        "--pd-disaggregation",
        "--prefill",
        "http://p1:1",
        "port",
    ])
    .unwrap();
    assert!(bad.validate().is_err());
    let no_pd = Args::parse_from(["cp", "--decode", "http://d:1"]);
    assert!(no_pd.validate().is_err());
}

#[test]
fn tls_flags_as_sglang_router_takes_them() {
    let a = Args::try_parse_args([
        "cp",
        "--client-cert-path",
        "c.pem",
        "--client-key-path",
        "k.pem",
        "--ca-cert-paths",
        "ca1.pem",
        "ca2.pem",
        "--worker-urls",
        "https://w:1",
    ])
    .unwrap();
    assert!(a.validate().is_ok());
    let tls = a.worker_tls();
    assert_eq!(tls.client_cert, Some(PathBuf::from("c.pem")));
    assert_eq!(tls.client_key, Some(PathBuf::from("k.pem")));
    assert_eq!(
        tls.ca_certs,
        [PathBuf::from("ca1.pem"), PathBuf::from("ca2.pem")]
    );
    assert_eq!(a.worker_urls, ["https://w:1"]);
    let repeated = Args::parse_from(["cp", "--ca-cert-paths", "a", "--ca-cert-paths", "b"]);
    assert_eq!(repeated.worker_tls().ca_certs.len(), 2);
    for half in [
        ["cp", "--client-cert-path", "c.pem"],
        ["cp", "--client-key-path", "k.pem"],
    ] {
        let err = Args::parse_from(half).validate().unwrap_err();
        assert_eq!(
            err,
            "Both --client-cert-path and --client-key-path must be specified together"
        );
    }
}

#[test]
fn manual_policy_flags_as_sglang_router_takes_them() {
    let a = Args::parse_from([
        "cp",
        "--policy",
        "manual",
        "--assignment-mode",
        "min_group",
        "--max-idle-secs",
        "60",
    ]);
    assert_eq!(a.policy, PolicyKind::Manual);
    assert_eq!(a.assignment_mode, AssignmentMode::MinGroup);
    assert_eq!(a.max_idle_secs, 60);
    let pd = Args::parse_from([
        "cp",
        "--prefill-policy",
        "manual",
        "--decode-policy",
        "manual",
    ]);
    assert_eq!(pd.prefill_policy, Some(PolicyKind::Manual));
    assert!(Args::try_parse_args(["cp", "--assignment-mode", "bucket"]).is_err());
}

#[test]
fn bad_threshold_is_rejected() {
    let a = Args::parse_from(["cp", "--cache-threshold", "1.5"]);
    assert!(a.validate().is_err());
}

#[test]
fn secure_serving_takes_the_endpoint_pickers_spellings() {
    assert!(
        !Args::parse_from(["cp"]).secure_serving,
        "plaintext by default"
    );
    assert!(Args::parse_from(["cp", "--secure-serving"]).secure_serving);
    assert!(Args::parse_from(["cp", "--secure-serving=true"]).secure_serving);
    assert!(!Args::parse_from(["cp", "--secure-serving=false"]).secure_serving);
    let lone_cert = Args::parse_from(["cp", "--cert-path", "/certs"]);
    assert!(lone_cert
        .validate()
        .unwrap_err()
        .contains("--secure-serving"));
    let both = Args::parse_from(["cp", "--secure-serving", "--cert-path", "/certs"]);
    assert!(both.validate().is_ok());
}

#[test]
fn a_pool_is_served_alone() {
    let a = Args::parse_from(["cp", "--pool-name", "p"]);
    assert_eq!(a.pool_namespace, "default");
    assert_eq!(a.pool_group, "inference.networking.k8s.io");
    assert!(a.validate().is_ok());
    for other in ["--service-discovery", "--pd-disaggregation"] {
        let mixed = Args::parse_from(["cp", "--pool-name", "p", other]);
        assert!(
            mixed.validate().unwrap_err().contains("--pool-name"),
            "{other}"
        );
    }
}

#[test]
fn a_fleet_store_is_refused_beside_kubernetes_discovery() {
    let store = ["cp", "--fleet-store-url", "redis://127.0.0.1:6379"];
    let a = Args::parse_from(store);
    assert_eq!(a.fleet_store.fleet_store_key_prefix, "sglang-envoy");
    assert!(a.validate().is_ok());
    for other in [&["--service-discovery"][..], &["--pool-name", "p"]] {
        let mixed = Args::parse_from(store.iter().chain(other));
        assert!(
            mixed.validate().unwrap_err().contains("--fleet-store-url"),
            "{other:?}"
        );
    }
}

#[test]
fn duration_buckets_must_be_positive_and_ascending() {
    let ok = Args::parse_from(["cp", "--prometheus-duration-buckets", "0.01", "0.5", "30"]);
    assert_eq!(ok.prometheus_duration_buckets, [0.01, 0.5, 30.0]);
    assert!(ok.validate().is_ok());
    for bad in [
        ["0.5", "0.5"],
        ["1", "0.5"],
        ["0", "1"],
        ["1", "NaN"],
        ["1", "inf"],
    ] {
        let a = Args::parse_from(["cp", "--prometheus-duration-buckets", bad[0], bad[1]]);
        let e = a.validate().unwrap_err();
        assert!(e.contains("--prometheus-duration-buckets"), "{bad:?}: {e}");
    }
}

#[test]
fn bucket_is_a_prefill_policy_of_pd_mode_only() {
    let pd = |extra: &[&str]| {
        let mut v = vec!["cp", "--pd-disaggregation"];
        v.extend_from_slice(extra);
        Args::parse_from(v).validate()
    };
    assert!(pd(&["--prefill-policy", "bucket"]).is_ok());
    assert!(pd(&["--policy", "bucket"])
        .unwrap_err()
        .contains("prefill policy"));
    assert!(pd(&["--decode-policy", "bucket"])
        .unwrap_err()
        .contains("prefill policy"));
    let regular = Args::parse_from(["cp", "--prefill-policy", "bucket"]).validate();
    assert!(regular.unwrap_err().contains("--pd-disaggregation"));
    assert!(pd(&[
        "--prefill-policy",
        "bucket",
        "--bucket-adjust-interval-secs",
        "0"
    ])
    .is_err());
}

#[test]
fn smg_policies_parse_with_smgs_flags_and_defaults() {
    for (name, kind) in [
        ("least_load", PolicyKind::LeastLoad),
        ("prefix_hash", PolicyKind::PrefixHash),
        ("consistent_hashing", PolicyKind::ConsistentHashing),
    ] {
        let a = Args::try_parse_args(["cp", "--policy", name]).unwrap();
        assert_eq!(a.policy, kind);
        assert!(a.validate().is_ok(), "{name}: {:?}", a.validate());
        let pd = Args::try_parse_args([
            "cp",
            "--pd-disaggregation",
            "--prefill-policy",
            name,
            "--decode-policy",
            name,
        ])
        .unwrap();
        assert_eq!((pd.prefill_policy(), pd.decode_policy()), (kind, kind));
        assert!(pd.validate().is_ok(), "PD {name}: {:?}", pd.validate());
    }
    // `smg launch --help` of smg 1.13.0.
    let d = Args::parse_from(["cp"]);
    assert_eq!(d.smg_policies.prefix_token_count, 256);
    assert_eq!(d.smg_policies.prefix_hash_load_factor, 1.25);
    assert_eq!(d.smg_policies.prefix_hash_balance_abs_threshold, 10);
    assert_eq!(d.smg_policies.least_load_kv_pressure_weight, 0.15);
    assert_eq!(d.smg_policies.least_load_default_throughput, 2000.0);
    assert_eq!(d.smg_policies.least_load_mean_prefill_tokens, 1024);
    assert_eq!(d.smg_policies.least_load_max_waiting_requests, 0);
    assert!(Args::try_parse_args(["cp", "--policy", "least-loaded"]).is_err());
}

#[test]
fn smg_policy_flags_are_read_and_checked_as_smg_checks_them() {
    let a = Args::try_parse_args([
        "cp",
        "--policy",
        "prefix_hash",
        "--prefix-token-count",
        "64",
        "--prefix-hash-load-factor",
        "2",
        "--prefix-hash-balance-abs-threshold",
        "3",
        "--least-load-kv-pressure-weight",
        "0",
        "--least-load-default-throughput",
        "500",
        "--least-load-mean-prefill-tokens",
        "8",
        "--least-load-max-waiting-requests",
        "4",
    ])
    .unwrap();
    assert!(a.validate().is_ok(), "{:?}", a.validate());
    assert_eq!(a.smg_policies.prefix_token_count, 64);
    assert_eq!(a.smg_policies.prefix_hash_load_factor, 2.0);
    assert_eq!(a.smg_policies.prefix_hash_balance_abs_threshold, 3);
    assert_eq!(a.smg_policies.least_load_kv_pressure_weight, 0.0);
    assert_eq!(a.smg_policies.least_load_default_throughput, 500.0);
    assert_eq!(a.smg_policies.least_load_mean_prefill_tokens, 8);
    assert_eq!(a.smg_policies.least_load_max_waiting_requests, 4);
    // The four least_load flags weigh engine reports: each is noted.
    assert_eq!(
        a.peer_notes
            .iter()
            .filter(|n| n.contains(LEAST_LOAD_ENGINE_NOTE))
            .count(),
        4,
        "{:?}",
        a.peer_notes
    );
    assert!(Args::try_parse_args(["cp", "--policy", "least_load"])
        .unwrap()
        .peer_notes
        .is_empty());

    // The values smg 1.13.0 refuses (its "Must be ..." errors).
    for (flag, value) in [
        ("--prefix-token-count", "0"),
        ("--prefix-hash-load-factor", "0.5"),
        ("--prefix-hash-load-factor", "NaN"),
        ("--prefix-hash-load-factor", "inf"),
        ("--least-load-kv-pressure-weight", "-1"),
        ("--least-load-kv-pressure-weight", "inf"),
        ("--least-load-default-throughput", "0"),
        ("--least-load-mean-prefill-tokens", "0"),
    ] {
        let a = Args::try_parse_args(["cp", &format!("{flag}={value}")]).unwrap();
        let e = a.validate().unwrap_err();
        assert!(e.contains(flag), "{flag} {value}: {e}");
    }
    for (flag, value) in [
        ("--prefix-hash-balance-abs-threshold", "-1"),
        ("--least-load-max-waiting-requests", "-1"),
    ] {
        assert!(
            Args::try_parse_args(["cp", &format!("{flag}={value}")]).is_err(),
            "{flag} {value}"
        );
    }
}

#[test]
fn tenant_flags_take_smg_s_names_and_defaults() {
    let a = Args::parse_from(["cp"]);
    assert!(!a.tenants.trust_tenant_header);
    assert_eq!(a.tenants.tenant_header_name, "x-smg-tenant-id");
    assert_eq!(a.trusted_tenant_header(), None, "not trusted by default");
    assert_eq!(
        a.tenants.priority_scheduler_default_max_class,
        Class::Default
    );
    assert_eq!(a.tenants.priority_scheduler_tenant_metric_top_n, 32);
    assert!(
        matches!(a.admission(), Ok(None)),
        "nothing limited by default"
    );
    let trusted = Args::parse_from([
        "cp",
        "--trust-tenant-header",
        "--tenant-header-name",
        "X-Team",
    ]);
    assert_eq!(trusted.trusted_tenant_header().as_deref(), Some("x-team"));
    assert!(
        Args::try_parse_from(["cp", "--priority-scheduler-default-max-class", "urgent"]).is_err()
    );
    // smg refuses the rate limit without its file, and a file it cannot read.
    let no_file = Args::parse_from(["cp", "--tenant-rate-limit-enabled"]);
    assert!(no_file.admission().is_err());
    let missing = Args::parse_from([
        "cp",
        "--tenant-rate-limit-enabled",
        "--tenant-rate-limit-config",
        "/nonexistent/rates.yaml",
    ]);
    assert!(missing.admission().is_err());
}

#[test]
fn a_rate_file_alone_turns_the_gate_on_and_bad_ones_stop_the_start() {
    let dir = std::env::temp_dir();
    let path = |name: &str| dir.join(format!("cp-tenants-{}-{name}.yaml", std::process::id()));
    let good = path("good");
    std::fs::write(
        &good,
        "default_policy: {tokens_per_minute: 10, requests_per_minute: 5}\n\
         tenants:\n- {tenant_key: 'header:a', tokens_per_minute: 10, requests_per_minute: 9}\n",
    )
    .unwrap();
    let args = |file: &std::path::Path| {
        Args::parse_from([
            "cp".into(),
            "--tenant-rate-limit-enabled".into(),
            "--tenant-rate-limit-config".into(),
            file.as_os_str().to_owned(),
        ])
    };
    let options = args(&good).admission().unwrap().expect("a gate");
    assert_eq!(
        options.limit,
        usize::MAX,
        "no concurrency limit was asked for"
    );
    assert!(options.tenants.rates.is_some());
    let bad = path("bad");
    std::fs::write(
        &bad,
        "default_policy: {tokens_per_minute: 10, requests_per_minute: 5}\n\
         tenants:\n- {tenant_key: 'team-a', tokens_per_minute: 10, requests_per_minute: 9}\n",
    )
    .unwrap();
    assert!(
        args(&bad).admission().is_err(),
        "not a canonical tenant key"
    );
    let _ = std::fs::remove_file(good);
    let _ = std::fs::remove_file(bad);
}
