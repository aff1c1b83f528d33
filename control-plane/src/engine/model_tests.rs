//! The engine routes by the request's model: only to the workers serving
//! it when the fleet serves several, 404 `model_not_found` for one none
//! serves, and any worker in a one-model fleet.

use std::collections::HashSet;

use sglang_envoy_lifecycle::{Answer, LocalReply, Mode, Question, Unrouted};

use super::*;
use crate::policy::RoundRobin;
use crate::workers::ServerFacts;

/// An engine in `mode` with round robin over healthy loopback servers,
/// each `(port, spec, model)`.
fn engine_serving(mode: Mode, servers: &[(u16, WorkerSpec, Option<&str>)]) -> Engine {
    let registry = Arc::new(Registry::default());
    for (port, spec, model) in servers {
        let address = WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], *port)));
        let facts = ServerFacts {
            model: model.map(Into::into),
            ..ServerFacts::default()
        };
        for unit in registry.add(address, *spec, facts).unwrap() {
            registry.set_healthy(&unit, true);
        }
    }
    Engine::new(
        registry,
        Policies::same(Arc::new(RoundRobin::default())),
        Arc::new(crate::metrics::Metrics::default()),
        EngineOptions {
            mode,
            ..Default::default()
        },
    )
}

fn question(model: &str, ticket: u64) -> Question {
    Question {
        path: "/v1/chat/completions".into(),
        method: "POST".into(),
        model: model.into(),
        body: format!(r#"{{"model":"{model}","messages":[]}}"#).into_bytes(),
        ticket,
        ..Default::default()
    }
}

/// The ports of the workers `n` questions for `model` were routed to.
fn ports_for(e: &Engine, model: &str, n: u64) -> HashSet<String> {
    (1..=n)
        .map(|t| {
            let routed = e.route(&question(model, t)).unwrap();
            routed.worker.rsplit(':').next().unwrap().to_string()
        })
        .collect()
}

fn rejection(a: Answer) -> LocalReply {
    match a {
        Err(Unrouted::Rejected(reply)) => reply,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

const R: WorkerSpec = WorkerSpec::REGULAR;

#[test]
fn each_model_goes_to_its_own_workers() {
    let e = engine_serving(
        Mode::Regular,
        &[(1, R, Some("a")), (2, R, Some("b")), (3, R, Some("a"))],
    );
    assert_eq!(
        ports_for(&e, "a", 6),
        HashSet::from(["1".into(), "3".into()])
    );
    assert_eq!(ports_for(&e, "b", 4), HashSet::from(["2".into()]));
    // No model (or smg's wildcard): any worker, round robin over all three.
    assert_eq!(ports_for(&e, "", 6).len(), 3);
    assert_eq!(ports_for(&e, "unknown", 6).len(), 3);
}

#[test]
fn the_plan_holds_only_the_models_workers() {
    let e = engine_serving(
        Mode::Regular,
        &[(1, R, Some("a")), (2, R, Some("b")), (3, R, Some("a"))],
    );
    let routed = e.route(&question("a", 1)).unwrap();
    // Envoy's retries must not carry a request to another model's worker.
    assert_eq!(routed.endpoints.len(), 2, "{:?}", routed.endpoints);
    assert!(!routed.endpoints.contains(&"127.0.0.1:2".to_string()));
}

#[test]
fn a_model_nobody_serves_is_smgs_404() {
    let e = engine_serving(Mode::Regular, &[(1, R, Some("a")), (2, R, Some("b"))]);
    let reply = rejection(e.route(&question("c", 1)));
    assert_eq!(reply.status, 404);
    let json: serde_json::Value = serde_json::from_str(&reply.json()).unwrap();
    assert_eq!(json["error"]["code"], "model_not_found");
    assert_eq!(json["error"]["type"], "invalid_request_error");
    assert_eq!(
        json["error"]["message"],
        "No worker available for model 'c'"
    );
    assert_eq!(e.in_flight(), 0, "nothing counted for a refused request");
}

#[test]
fn a_served_model_without_healthy_workers_is_503() {
    let e = engine_serving(Mode::Regular, &[(1, R, Some("a")), (2, R, Some("b"))]);
    let b = e.registry().get("http://127.0.0.1:2").unwrap();
    e.registry().set_healthy(&b, false);
    assert_eq!(rejection(e.route(&question("b", 1))).status, 503);
    assert_eq!(ports_for(&e, "a", 2), HashSet::from(["1".into()]));
}

#[test]
fn a_one_model_fleet_takes_any_name_as_sglang_router_does() {
    let e = engine_serving(
        Mode::Regular,
        &[(1, R, Some("sim-model")), (2, R, Some("sim-model"))],
    );
    assert_eq!(ports_for(&e, "m", 4).len(), 2);
}

#[test]
fn pd_narrows_prefill_and_decode_alike() {
    let p = |port| WorkerSpec::Prefill {
        bootstrap_port: Some(port),
    };
    let d = WorkerSpec::Decode;
    let e = engine_serving(
        Mode::Pd,
        &[
            (1, p(9001), Some("a")),
            (2, d, Some("a")),
            (3, p(9003), Some("b")),
            (4, d, Some("b")),
            (5, p(9005), Some("c")),
        ],
    );
    // Decodes: only b's; the prefill, b's too (its bootstrap port tells).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for t in 1..=4 {
            let routed = e.route(&question("b", t)).unwrap();
            assert_eq!(routed.endpoints, vec!["127.0.0.1:4".to_string()]);
            let port = routed.inject.iter().find(|(k, _)| k == "bootstrap_port");
            assert_eq!(port.map(|(_, v)| v.as_str()), Some("9003"));
        }
        // "c" has a prefill worker but no decode worker; "z" has neither.
        assert_eq!(rejection(e.route(&question("c", 10))).status, 404);
        assert_eq!(rejection(e.route(&question("z", 11))).status, 404);
    });
}

fn get(path: &str) -> Question {
    Question {
        path: path.into(),
        method: "GET".into(),
        ..Default::default()
    }
}

#[test]
fn v1_models_lists_several_models_from_the_registry() {
    let e = engine_serving(
        Mode::Regular,
        &[(1, R, Some("a")), (2, R, Some("b")), (3, R, Some("a"))],
    );
    let reply = rejection(e.route(&get("/v1/models")));
    assert_eq!(reply.status, 200);
    let v: serde_json::Value = serde_json::from_str(&reply.json()).unwrap();
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(v["data"][0]["owned_by"], "self_hosted");
}

#[test]
fn v1_models_of_one_model_goes_to_a_worker() {
    let e = engine_serving(Mode::Regular, &[(1, R, Some("a")), (2, R, Some("a"))]);
    assert!(e.route(&get("/v1/models")).is_ok());
}
