use serde_json::value::RawValue;
use sglang_envoy_body::{RequestBody, Route};

use crate::pd::RidSource;
use crate::workers::Worker;

/// The top-level fields (key, JSON text) written into the two halves of a
/// PD request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PdFields {
    /// For the prefill worker's body.
    pub prefill: Vec<(&'static str, String)>,
    /// For the decode worker's body.
    pub decode: Vec<(&'static str, String)>,
}

/// How many requests one body stands for, when it is a batch: `/generate`
/// with a list `text` or a list of token lists in `input_ids`; a completion
/// with a list `prompt`; a chat completion with `n` > 1 (SGLang runs the
/// samples as a batch, each needing its own bootstrap room).
pub fn batch_size(route: Route, body: &RequestBody<'_>) -> Option<usize> {
    let n = match route {
        Route::Generate => array_len(body.get("text"), |_| true)
            .or_else(|| array_len(body.get("input_ids"), |item| item.starts_with('['))),
        Route::Completions => array_len(body.get("prompt"), |item| {
            item.starts_with('"') || item.starts_with('[')
        }),
        Route::ChatCompletions => body
            .get("n")
            .and_then(|v| v.get().parse::<usize>().ok())
            .filter(|n| *n > 1),
        Route::Embeddings | Route::Rerank => None,
    };
    n.filter(|n| *n > 0)
}

/// The length of a JSON array whose first item passes `is_batch_item` (so a
/// flat token list `[1, 2, 3]` is one prompt, not three).
fn array_len(value: Option<&RawValue>, is_batch_item: impl Fn(&str) -> bool) -> Option<usize> {
    let items: Vec<&RawValue> = serde_json::from_str(value?.get()).ok()?;
    let first = items.first()?.get().trim_start();
    is_batch_item(first).then_some(items.len())
}

/// True when a `/generate` body asks for logprobs, whose input part the
/// prefill worker computes and the router merges into the decode answer.
pub fn wants_input_logprobs(route: Route, body: &RequestBody<'_>) -> bool {
    route == Route::Generate
        && body
            .get("return_logprob")
            .is_some_and(|v| v.get().contains("true"))
}

/// The fields of one PD request, as sglang-router writes them: the same
/// `rid` (unless the client sent one), `bootstrap_host`, `bootstrap_port`
/// (null for a prefill registered with `none`) and random `bootstrap_room`
/// in both halves, arrays of the batch size for a batch; the decode half
/// always carries `data_parallel_rank` (the prefill's rank) and
/// `data_parallel_rank_decode` (null when not DP-aware), the prefill half
/// `data_parallel_rank` only when it has a rank.
pub fn pd_fields(
    route: Route,
    body: &RequestBody<'_>,
    prefill: &Worker,
    decode: &Worker,
    rids: &RidSource,
) -> PdFields {
    let batch = batch_size(route, body);
    let host = json_string(&prefill.host);
    let port = prefill
        .spec
        .bootstrap_port
        .map_or_else(|| "null".to_string(), |p| p.to_string());
    let mut common: Vec<(&'static str, String)> = Vec::with_capacity(4);
    if body.get("rid").is_none() {
        let rid = match batch {
            // SGLang wants one id per item of a native batch.
            Some(n) if route == Route::Generate => {
                json_array((0..n).map(|_| json_string(&rids.next(route))))
            }
            _ => json_string(&rids.next(route)),
        };
        common.push(("rid", rid));
    }
    match batch {
        Some(n) => {
            common.push(("bootstrap_host", json_array((0..n).map(|_| host.clone()))));
            common.push(("bootstrap_port", json_array((0..n).map(|_| port.clone()))));
            common.push((
                "bootstrap_room",
                json_array((0..n).map(|_| room().to_string())),
            ));
        }
        None => {
            common.push(("bootstrap_host", host));
            common.push(("bootstrap_port", port));
            common.push(("bootstrap_room", room().to_string()));
        }
    }
    let mut fields = PdFields {
        prefill: common.clone(),
        decode: common,
    };
    if let Some(rank) = prefill.dp_rank {
        fields
            .prefill
            .push(("data_parallel_rank", rank.to_string()));
    }
    fields
        .decode
        .push(("data_parallel_rank", rank_json(prefill.dp_rank)));
    fields
        .decode
        .push(("data_parallel_rank_decode", rank_json(decode.dp_rank)));
    fields
}

/// Regular mode: the rank of a DP-aware unit, nothing otherwise.
pub fn dp_fields(worker: &Worker) -> Vec<(&'static str, String)> {
    worker
        .dp_rank
        .map(|rank| vec![("data_parallel_rank", rank.to_string())])
        .unwrap_or_default()
}

/// A random room id in [0, 2^63 - 1], as sglang-router draws it.
fn room() -> u64 {
    rand::random::<u64>() & (i64::MAX as u64)
}

fn rank_json(rank: Option<u32>) -> String {
    rank.map_or_else(|| "null".to_string(), |r| r.to_string())
}

fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn json_array(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    format!("[{}]", items.join(","))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::Value;

    use super::*;
    use crate::workers::{Role, WorkerAddress, WorkerSpec};

    fn worker(role: Role, port: Option<u16>, rank: Option<u32>) -> Worker {
        Worker::new(
            WorkerAddress {
                url: "http://prefill.example:30001".into(),
                host: "prefill.example".into(),
                endpoint: "10.0.0.1:30001".parse().unwrap(),
            },
            WorkerSpec {
                role,
                bootstrap_port: port,
            },
            rank,
            Arc::default(),
            0,
        )
    }

    fn fields_of(route: Route, body: &str, p: &Worker, d: &Worker) -> (Value, Value) {
        let parsed = RequestBody::parse(body.as_bytes()).unwrap();
        let f = pd_fields(route, &parsed, p, d, &RidSource::with_suffix("h"));
        let to_json = |v: &[(&str, String)]| {
            let v: Vec<(&str, &str)> = v.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let merged = parsed.with_fields(&v).unwrap();
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
