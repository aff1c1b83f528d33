use sglang_envoy_body::pd::{self, Bootstrap, Unit};
use sglang_envoy_body::{RequestBody, Route, WireProfile};

use crate::pd::RidSource;
use crate::workers::Worker;

pub use sglang_envoy_body::pd::{as_pairs, batch_size, wants_input_logprobs, PdFields};

/// The profile of a worker: `forced` (`--wire-profile seeds|upstream`),
/// else the one its reported `version` calls for (see
/// [`WireProfile::for_version`]), else upstream: what SGLang has read since
/// 0.5.10, and, with its rooms aligned to the prefill's rank, what older
/// releases still pair up on (they ignore the new fields and fall back on
/// `bootstrap_room % dp_size` on both sides).
pub fn wire_profile(forced: Option<WireProfile>, version: Option<&str>) -> WireProfile {
    forced
        .or_else(|| version.and_then(WireProfile::for_version))
        .unwrap_or_default()
}

/// `profile` as the workers snapshot's enum (for the filter's fallback).
pub fn wire_code(profile: WireProfile) -> i32 {
    let code = match profile {
        WireProfile::Legacy => sglang_envoy_proto::WireProfile::Legacy,
        WireProfile::Upstream => sglang_envoy_proto::WireProfile::Upstream,
    };
    code as i32
}

/// `worker` as the field builder sees it.
pub fn unit(worker: &Worker) -> Unit {
    Unit {
        profile: worker.facts.wire,
        rank: worker.dp_rank,
        dp_size: worker.facts.dp_size,
    }
}

/// The fields of one PD request between `prefill` and `decode` (see
/// [`sglang_envoy_body::pd::pd_fields`]): rids from `rids`, random rooms.
pub fn pd_fields(
    route: Route,
    body: &RequestBody<'_>,
    prefill: &Worker,
    decode: &Worker,
    rids: &RidSource,
) -> PdFields {
    let bootstrap = Bootstrap {
        host: &prefill.host,
        port: prefill.spec.bootstrap_port(),
        prefill: unit(prefill),
        decode: unit(decode),
    };
    pd::pd_fields(route, body, &bootstrap, || rids.next(route), rand::random)
}

/// Regular mode: the rank of a DP-aware unit in its server's profile,
/// nothing otherwise.
pub fn dp_fields(worker: &Worker) -> Vec<(&'static str, String)> {
    pd::dp_rank_fields(&unit(worker))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::Value;

    use super::*;
    use crate::workers::{Role, ServerFacts, WorkerAddress, WorkerSpec};

    fn worker(role: Role, port: Option<u16>, rank: Option<u32>) -> Worker {
        profiled(role, port, rank, WireProfile::Legacy)
    }

    fn profiled(role: Role, port: Option<u16>, rank: Option<u32>, wire: WireProfile) -> Worker {
        let mut w = Worker::new(
            WorkerAddress {
                url: "http://prefill.example:30001".into(),
                host: "prefill.example".into(),
                endpoint: "10.0.0.1:30001".parse().unwrap(),
                tls: false,
            },
            WorkerSpec::of(role, port),
            rank,
            Arc::default(),
            0,
        );
        w.facts = ServerFacts {
            dp_size: rank.map(|_| 4),
            wire,
            model: None,
        };
        w
    }

    fn fields_of(route: Route, body: &str, p: &Worker, d: &Worker) -> (Value, Value) {
        let parsed = RequestBody::parse(body.as_bytes()).unwrap();
        let f = pd_fields(route, &parsed, p, d, &RidSource::with_suffix("h"));
        let to_json = |v: &[(&'static str, String)]| {
            let merged = parsed.with_fields(&as_pairs(v)).unwrap();
            serde_json::from_slice::<Value>(&merged).unwrap()
        };
        (to_json(&f.prefill), to_json(&f.decode))
    }

    #[test]
    fn both_halves_share_bootstrap_and_rid_and_decode_has_null_ranks() {
        let p = worker(Role::Prefill, Some(9001), None);
        let d = worker(Role::Decode, None, None);
        let (pb, db) = fields_of(
            Route::ChatCompletions,
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
            &p,
            &d,
        );
        for k in ["rid", "bootstrap_host", "bootstrap_port", "bootstrap_room"] {
            assert_eq!(pb[k], db[k], "{k}");
        }
        assert_eq!(pb["bootstrap_host"], "prefill.example");
        assert_eq!(pb["bootstrap_port"], 9001);
        let room = pb["bootstrap_room"].as_u64().unwrap();
        assert!(room <= i64::MAX as u64);
        assert!(pb["rid"].as_str().unwrap().starts_with("chatcmpl-"));
        assert!(pb.get("data_parallel_rank").is_none());
        assert!(db["data_parallel_rank"].is_null());
        assert!(db["data_parallel_rank_decode"].is_null());
        assert!(db.as_object().unwrap().contains_key("data_parallel_rank"));
    }

    #[test]
    fn none_port_is_null_and_client_rid_is_kept() {
        let p = worker(Role::Prefill, None, None);
        let d = worker(Role::Decode, None, None);
        let (pb, db) = fields_of(Route::Generate, r#"{"text":"x","rid":"mine"}"#, &p, &d);
        assert!(pb["bootstrap_port"].is_null());
        assert_eq!(pb["rid"], "mine");
        assert_eq!(db["rid"], "mine");
    }

    #[test]
    fn dp_ranks_go_to_the_right_halves() {
        let p = worker(Role::Prefill, None, Some(3));
        let d = worker(Role::Decode, None, Some(1));
        let (pb, db) = fields_of(Route::Generate, r#"{"text":"x"}"#, &p, &d);
        assert_eq!(pb["data_parallel_rank"], 3);
        assert!(pb.get("data_parallel_rank_decode").is_none());
        assert_eq!(db["data_parallel_rank"], 3);
        assert_eq!(db["data_parallel_rank_decode"], 1);
    }

    #[test]
    fn upstream_workers_get_routed_and_prefill_ranks_and_an_aligned_room() {
        let p = profiled(Role::Prefill, None, Some(3), WireProfile::Upstream);
        let d = profiled(Role::Decode, None, Some(1), WireProfile::Upstream);
        let (pb, db) = fields_of(Route::Generate, r#"{"text":"x"}"#, &p, &d);
        assert_eq!(pb["routed_dp_rank"], 3);
        assert_eq!(db["routed_dp_rank"], 1);
        assert_eq!(db["disagg_prefill_dp_rank"], 3);
        assert_eq!(pb["bootstrap_room"].as_u64().unwrap() % 4, 3);
        assert!(db.get("data_parallel_rank").is_none());
        assert_eq!(dp_fields(&d), [("routed_dp_rank", "1".to_string())]);
        assert_eq!(
            dp_fields(&worker(Role::Regular, None, Some(2))),
            [("data_parallel_rank", "2".to_string())]
        );
    }

    #[test]
    fn profile_is_forced_else_read_from_the_version_else_upstream() {
        let up = WireProfile::Upstream;
        let legacy = WireProfile::Legacy;
        assert_eq!(wire_profile(Some(legacy), Some("0.5.23")), legacy);
        assert_eq!(wire_profile(Some(up), Some("0.5.4")), up);
        assert_eq!(wire_profile(None, Some("0.5.9")), legacy);
        assert_eq!(wire_profile(None, Some("0.5.10")), up);
        assert_eq!(wire_profile(None, Some("custom-build")), up);
        assert_eq!(wire_profile(None, None), up);
    }

    #[test]
    fn batches_get_arrays_of_their_size_with_distinct_rooms() {
        let p = worker(Role::Prefill, Some(8998), None);
        let d = worker(Role::Decode, None, None);
        let (pb, db) = fields_of(Route::Generate, r#"{"text":["a","b","c"]}"#, &p, &d);
        let rooms = pb["bootstrap_room"].as_array().unwrap();
        assert_eq!(rooms.len(), 3);
        assert_ne!(rooms[0], rooms[1]);
        assert_eq!(pb["bootstrap_room"], db["bootstrap_room"]);
        assert_eq!(pb["bootstrap_host"].as_array().unwrap().len(), 3);
        assert_eq!(pb["bootstrap_port"], serde_json::json!([8998, 8998, 8998]));
        assert_eq!(pb["rid"].as_array().unwrap().len(), 3);
        let (pb, _) = fields_of(Route::Generate, r#"{"input_ids":[[1,2],[3]]}"#, &p, &d);
        assert_eq!(pb["bootstrap_room"].as_array().unwrap().len(), 2);
        let (pb, _) = fields_of(Route::Generate, r#"{"input_ids":[1,2,3]}"#, &p, &d);
        assert!(
            pb["bootstrap_room"].is_u64(),
            "a flat token list is one prompt"
        );
        let (pb, _) = fields_of(Route::Completions, r#"{"prompt":["a","b"]}"#, &p, &d);
        assert_eq!(pb["bootstrap_room"].as_array().unwrap().len(), 2);
        assert!(pb["rid"].is_string());
        let (pb, _) = fields_of(Route::ChatCompletions, r#"{"messages":[],"n":4}"#, &p, &d);
        assert_eq!(pb["bootstrap_room"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn logprob_merge_only_for_generate_with_return_logprob() {
        let yes = RequestBody::parse(br#"{"text":"x","return_logprob":true}"#).unwrap();
        let no = RequestBody::parse(br#"{"text":"x","return_logprob":false}"#).unwrap();
        assert!(wants_input_logprobs(Route::Generate, &yes));
        assert!(!wants_input_logprobs(Route::Generate, &no));
        assert!(!wants_input_logprobs(Route::ChatCompletions, &yes));
    }
}
