//! The fields of a prefill/decode-disaggregated request, as sglang-router
//! writes them. Shared by the control plane (which normally builds them) and
//! the filter (which builds them itself while the control plane is down).

use serde_json::value::RawValue;

use crate::{RequestBody, Route};

/// Where the decode worker fetches the KV cache from, and the DP ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bootstrap<'a> {
    /// The prefill worker's host as registered.
    pub host: &'a str,
    /// Its bootstrap port; `None` is sent as null (decode uses its default).
    pub port: Option<u16>,
    /// The prefill's DP rank (DP-aware only).
    pub prefill_rank: Option<u32>,
    /// The decode's DP rank (DP-aware only).
    pub decode_rank: Option<u32>,
}

/// The top-level fields (key, JSON text) for the two halves of a PD request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PdFields {
    /// For the prefill worker's body.
    pub prefill: Vec<(&'static str, String)>,
    /// For the decode worker's body.
    pub decode: Vec<(&'static str, String)>,
}

/// The status the client gets when the prefill half fails with `status`:
/// the prefill's own when it is an HTTP error, else 502 (it gave no usable
/// answer).
pub fn prefill_error_status(status: u32) -> u16 {
    u16::try_from(status)
        .ok()
        .filter(|s| (400..600).contains(s))
        .unwrap_or(502)
}

/// Largest chat `n` given one bootstrap room per sample.
pub const MAX_CHAT_SAMPLES: usize = 1024;

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
        // Past MAX_CHAT_SAMPLES, no batch fields: the worker refuses such
        // an `n` itself, and the router must not build millions of rooms
        // because a client wrote a large number.
        Route::ChatCompletions => body
            .get("n")
            .and_then(|v| v.get().parse::<usize>().ok())
            .filter(|n| (2..=MAX_CHAT_SAMPLES).contains(n)),
        Route::Embeddings | Route::Rerank | Route::Classify | Route::Responses => None,
    };
    n.filter(|n| *n > 0)
}

/// The length of a JSON array whose first item passes `is_batch_item` (so a
/// flat token list `[1, 2, 3]` is one prompt, not three). Counted in one
/// pass without collecting the items: a list of millions of tokens costs no
/// memory here.
fn array_len(value: Option<&RawValue>, is_batch_item: impl Fn(&str) -> bool) -> Option<usize> {
    struct Counter<F>(F);
    impl<'de, F: Fn(&str) -> bool> serde::de::Visitor<'de> for Counter<F> {
        type Value = Option<usize>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let Some(first) = seq.next_element::<&RawValue>()? else {
                return Ok(None);
            };
            if !(self.0)(first.get().trim_start()) {
                return Ok(None);
            }
            let mut n = 1;
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                n += 1;
            }
            Ok(Some(n))
        }
    }
    let mut de = serde_json::Deserializer::from_str(value?.get());
    serde::Deserializer::deserialize_seq(&mut de, Counter(is_batch_item))
        .ok()
        .flatten()
}

/// True when a `/generate` body asks for logprobs, whose input part the
/// prefill worker computes and the router merges into the decode answer.
pub fn wants_input_logprobs(route: Route, body: &RequestBody<'_>) -> bool {
    route == Route::Generate
        && body
            .get("return_logprob")
            .is_some_and(|v| v.get().contains("true"))
}

/// The fields of one PD request: the same `rid` (from `new_rid`, unless
/// the client sent one), `bootstrap_host`, `bootstrap_port` and
/// `bootstrap_room` (from `new_room`, in [0, 2^63-1]) in both halves, arrays
/// of the batch size for a batch; the decode half always carries
/// `data_parallel_rank` (the prefill's rank) and `data_parallel_rank_decode`
/// (null when not DP-aware), the prefill half `data_parallel_rank` only when
/// it has a rank.
pub fn pd_fields(
    route: Route,
    body: &RequestBody<'_>,
    bootstrap: &Bootstrap<'_>,
    mut new_rid: impl FnMut() -> String,
    mut new_room: impl FnMut() -> u64,
) -> PdFields {
    let batch = batch_size(route, body);
    let host = json_string(bootstrap.host);
    let port = bootstrap
        .port
        .map_or_else(|| "null".to_string(), |p| p.to_string());
    let mut room = || (new_room() & (i64::MAX as u64)).to_string();
    let mut common: Vec<(&'static str, String)> = Vec::with_capacity(4);
    if body.get("rid").is_none() {
        let rid = match batch {
            // SGLang wants one id per item of a native batch.
            Some(n) if route == Route::Generate => {
                json_array((0..n).map(|_| json_string(&new_rid())))
            }
            _ => json_string(&new_rid()),
        };
        common.push(("rid", rid));
    }
    match batch {
        Some(n) => {
            common.push(("bootstrap_host", json_array((0..n).map(|_| host.clone()))));
            common.push(("bootstrap_port", json_array((0..n).map(|_| port.clone()))));
            common.push(("bootstrap_room", json_array((0..n).map(|_| room()))));
        }
        None => {
            common.push(("bootstrap_host", host));
            common.push(("bootstrap_port", port));
            common.push(("bootstrap_room", room()));
        }
    }
    let mut fields = PdFields {
        prefill: common.clone(),
        decode: common,
    };
    if let Some(rank) = bootstrap.prefill_rank {
        fields
            .prefill
            .push(("data_parallel_rank", rank.to_string()));
    }
    fields
        .decode
        .push(("data_parallel_rank", rank_json(bootstrap.prefill_rank)));
    fields.decode.push((
        "data_parallel_rank_decode",
        rank_json(bootstrap.decode_rank),
    ));
    fields
}

/// `fields` as the `(&str, &str)` pairs [`RequestBody::with_fields`] takes.
pub fn as_pairs<'a>(fields: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    fields.iter().map(|(k, v)| (*k, v.as_str())).collect()
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
    use super::*;

    #[test]
    fn prefill_errors_keep_http_error_statuses_only() {
        for (from, to) in [(503, 503), (400, 400), (200, 502), (0, 502), (70_000, 502)] {
            assert_eq!(prefill_error_status(from), to, "{from}");
        }
    }

    #[test]
    fn batch_sizes() {
        let size =
            |route, raw: &str| batch_size(route, &RequestBody::parse(raw.as_bytes()).unwrap());
        assert_eq!(size(Route::Generate, r#"{"text":["a","b","c"]}"#), Some(3));
        assert_eq!(size(Route::Generate, r#"{"input_ids":[1,2,3]}"#), None);
        assert_eq!(size(Route::Generate, r#"{"input_ids":[[1],[2]]}"#), Some(2));
        assert_eq!(size(Route::Generate, r#"{"text":[]}"#), None);
        assert_eq!(
            size(Route::Completions, r#"{"prompt":[[1,2],[3]]}"#),
            Some(2)
        );
        assert_eq!(size(Route::Completions, r#"{"prompt":[1,2]}"#), None);
        assert_eq!(size(Route::ChatCompletions, r#"{"n":3}"#), Some(3));
        assert_eq!(size(Route::ChatCompletions, r#"{"n":1}"#), None);
        assert_eq!(size(Route::ChatCompletions, r#"{"n":1000000000}"#), None);
        let many = format!(r#"{{"text":[{}]}}"#, vec!["\"x\""; 100_000].join(","));
        assert_eq!(size(Route::Generate, &many), Some(100_000));
    }

    #[test]
    fn rooms_are_masked_into_the_signed_range() {
        let body = RequestBody::parse(br#"{"text":"x"}"#).unwrap();
        let b = Bootstrap {
            host: "h",
            port: None,
            prefill_rank: None,
            decode_rank: None,
        };
        let f = pd_fields(Route::Generate, &body, &b, || "r".into(), || u64::MAX);
        let room = f
            .prefill
            .iter()
            .find(|(k, _)| *k == "bootstrap_room")
            .unwrap();
        assert_eq!(room.1, i64::MAX.to_string());
    }
}
