//! Property test over the control plane's request handling: whatever a
//! filter (or a client through it) sends — any path, method, body bytes and
//! routing text, in regular and PD mode, with or without DP ranks — the
//! engine answers with a decision or a client-error/unavailable rejection,
//! never panics, and once every request is reported finished all loads and
//! queued work are back to zero.
//!
//! `PROPTEST_CASES` raises the number of cases for a long run.

use std::sync::Arc;

use proptest::prelude::*;
use sglang_envoy_control_plane::admission::AdmissionOptions;
use sglang_envoy_control_plane::engine::{Engine, EngineOptions, Policies};
use sglang_envoy_control_plane::metrics::Metrics;
use sglang_envoy_control_plane::policy::{
    CacheAware, CacheAwareConfig, CostAware, CostAwareConfig, Policy,
};
use sglang_envoy_control_plane::workers::{Registry, WorkerAddress, WorkerSpec};
use sglang_envoy_lifecycle::{Mode, Question, Unrouted};
use sglang_envoy_proto::Completion;

fn engine(pd: bool, dp: Option<u32>, cost: bool, limit: Option<usize>) -> Engine {
    let registry = Arc::new(Registry::default());
    let specs: Vec<WorkerSpec> = if pd {
        vec![
            WorkerSpec::Prefill {
                bootstrap_port: Some(9),
            },
            WorkerSpec::Decode,
        ]
    } else {
        vec![WorkerSpec::REGULAR, WorkerSpec::REGULAR]
    };
    for (i, spec) in specs.into_iter().enumerate() {
        // Closed loopback ports: PD prefills fail fast, nothing leaves the host.
        let port = 9 + i as u16;
        let units = registry
            .add(
                WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
                spec,
                dp,
            )
            .unwrap();
        registry.set_healthy(&units[0], true);
    }
    let policy: Arc<dyn Policy> = if cost {
        // The shipped weights, with a small tree so that eviction runs.
        Arc::new(CostAware::new(CostAwareConfig {
            max_tree_size: 1 << 16,
            ..CostAwareConfig::default()
        }))
    } else {
        Arc::new(CacheAware::new(CacheAwareConfig {
            cache_threshold: 0.3,
            balance_abs_threshold: 4,
            balance_rel_threshold: 1.5,
            max_tree_size: 1 << 16,
        }))
    };
    Engine::new(
        registry,
        Policies::same(policy),
        Arc::new(Metrics::default()),
        EngineOptions {
            mode: if pd { Mode::Pd } else { Mode::Regular },
            admission: limit.map(|limit| AdmissionOptions {
                limit,
                queue_size: 2,
                queue_timeout: std::time::Duration::from_millis(1),
                tenants: Default::default(),
            }),
            ..Default::default()
        },
    )
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/generate".to_string()),
        Just("/v1/chat/completions".to_string()),
        Just("/v1/completions?x=1".to_string()),
        Just("/v1/embeddings".to_string()),
        Just("/v1/models".to_string()),
        Just("/get_server_info".to_string()),
        "/[a-z_/@:%.?=]{0,24}",
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        Just(br#"{"text":"hello"}"#.to_vec()),
        Just(br#"{"text":["a","b"],"rid":"x"}"#.to_vec()),
        Just(br#"{"messages":[],"n":3,"stream":true}"#.to_vec()),
        Just(br#"{"prompt":["a",["b"]],"return_logprob":true}"#.to_vec()),
        Just(br#"{"input_ids":[[1,2],[3]],"bootstrap_room":5}"#.to_vec()),
        "\\{\"[a-z]{1,6}\":(\\[|\\{|\"|[0-9]){0,3}[^}]{0,12}\\}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #[test]
    fn any_request_gets_an_answer_and_loads_return_to_zero(
        pd in any::<bool>(),
        dp in prop_oneof![Just(None), (1u32..4).prop_map(Some)],
        cost in any::<bool>(),
        limit in prop_oneof![Just(None), (1usize..3).prop_map(Some)],
        requests in proptest::collection::vec(
            (path(), prop_oneof![Just("POST"), Just("GET"), Just("PUT")], body(),
             proptest::collection::vec(any::<u8>(), 0..48)),
            1..12,
        ),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let e = engine(pd, dp, cost, limit);
            for (i, (path, method, body, text)) in requests.into_iter().enumerate() {
                let ticket = i as u64 + 1;
                let r = e.route(&Question {
                    path,
                    method: method.to_string(),
                    routing_text: text,
                    body_bytes: body.len() as u64,
                    body,
                    ticket,
                    ..Default::default()
                });
                match r {
                    Ok(d) => {
                        prop_assert!(!d.endpoints.is_empty());
                        if d.prefill.is_some() {
                            let outcome = e.await_prefill(ticket).await;
                            prop_assert!(!outcome.ok, "closed port cannot prefill");
                        }
                    }
                    Err(Unrouted::Rejected(rej)) => {
                        prop_assert!(
                            [400, 404, 503].contains(&rej.status),
                            "unexpected status {}", rej.status
                        );
                    }
                    Err(Unrouted::NeedBody) => prop_assert!(pd),
                    Err(Unrouted::Queued { .. }) => {
                        prop_assert!(limit.is_some());
                        // The filter waits, and then asks again or gives up.
                        let outcome = e.await_admission(ticket).await;
                        prop_assert!(outcome.admitted || outcome.rejection.is_some());
                    }
                }
                e.report(&Completion { ticket, http_status: 200, ..Default::default() });
            }
            for w in e.registry().all().iter() {
                prop_assert_eq!(w.load(), 0, "{} still loaded", w.url);
                prop_assert_eq!(w.pending_work(), 0, "{} still has work", w.url);
            }
            prop_assert_eq!(e.in_flight(), 0);
            if limit.is_some() {
                prop_assert_eq!(e.admission_counts(), Some((0, 0)), "admission slots leaked");
            }
            Ok(())
        })?;
    }
}
