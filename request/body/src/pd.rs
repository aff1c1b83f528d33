//! The fields of a prefill/decode-disaggregated request, and the DP rank of
//! a regular one, in the dialect ([`WireProfile`]) of the worker they go
//! to. The one place that decides them: the control plane (both front doors)
//! builds them with it, and so does the filter while the control plane is
//! down.

use serde_json::value::RawValue;

use crate::wire::WireProfile;
use crate::{RequestBody, Route};

/// One worker of a request, as far as its fields depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unit {
    /// The dialect it speaks.
    pub profile: WireProfile,
    /// The DP rank the router chose on it (DP-aware only).
    pub rank: Option<u32>,
    /// Its number of DP ranks, when known (DP-aware only).
    pub dp_size: Option<u32>,
}

/// Where the decode worker fetches the KV cache from, and the two workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bootstrap<'a> {
    /// The prefill worker's host as registered.
    pub host: &'a str,
    /// Its bootstrap port; `None` is sent as null (decode uses its default).
    pub port: Option<u16>,
    /// The prefill worker.
    pub prefill: Unit,
    /// The decode worker.
    pub decode: Unit,
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
/// of the batch size for a batch; then the DP ranks, each half in its
/// worker's profile:
///
/// | half | [`WireProfile::Legacy`] | [`WireProfile::Upstream`] |
/// | --- | --- | --- |
/// | prefill | `data_parallel_rank` = its rank, if any | `routed_dp_rank` = its rank, if any |
/// | decode | `data_parallel_rank` = the prefill's rank and `data_parallel_rank_decode` = its own, both always present (null without ranks) | `routed_dp_rank` = its own rank and `disagg_prefill_dp_rank` = the prefill's, each if any |
///
/// An upstream prefill with a rank gets rooms with `room % dp_size` equal
/// to that rank: SGLang's prefill follows the room by default and, since
/// 0.5.23, fails a request whose explicit rank contradicts it
/// ("follow_bootstrap_room conflict"); a decode that is not told the
/// prefill's rank looks for the KV there too.
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
    let prefill = bootstrap.prefill;
    let mut room = || room_for(new_room(), &prefill).to_string();
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
    fields.prefill.extend(dp_rank_fields(&prefill));
    let decode = bootstrap.decode;
    match decode.profile {
        WireProfile::Legacy => {
            fields
                .decode
                .push(("data_parallel_rank", rank_json(prefill.rank)));
            fields
                .decode
                .push(("data_parallel_rank_decode", rank_json(decode.rank)));
        }
        WireProfile::Upstream => {
            if let Some(rank) = decode.rank {
                fields.decode.push(("routed_dp_rank", rank.to_string()));
            }
            if let Some(rank) = prefill.rank {
                fields
                    .decode
                    .push(("disagg_prefill_dp_rank", rank.to_string()));
            }
        }
    }
    fields
}

/// The rank field of a request to `unit` alone (regular mode, or a PD
/// prefill half): `data_parallel_rank` (legacy) or `routed_dp_rank`
/// (upstream; SGLang 0.5.10+ still reads the old name, with a deprecation
/// warning per request); nothing without a rank.
pub fn dp_rank_fields(unit: &Unit) -> Vec<(&'static str, String)> {
    let key = match unit.profile {
        WireProfile::Legacy => "data_parallel_rank",
        WireProfile::Upstream => "routed_dp_rank",
    };
    unit.rank
        .map(|rank| vec![(key, rank.to_string())])
        .unwrap_or_default()
}

/// A room from the random `raw`: masked into [0, 2^63-1] (SGLang's range),
/// and for an upstream prefill with a rank `r` of `n`, replaced by the
/// number of its block of `n` (`room - room % n ..`) with `room % n == r`
/// (of the block below, should that leave the range): still random in all
/// but its last digits in base `n`.
fn room_for(raw: u64, prefill: &Unit) -> u64 {
    const MAX: u64 = i64::MAX as u64;
    let room = raw & MAX;
    let (WireProfile::Upstream, Some(rank), Some(n)) =
        (prefill.profile, prefill.rank, prefill.dp_size)
    else {
        return room;
    };
    let (rank, n) = (u64::from(rank), u64::from(n));
    if n < 2 || rank >= n {
        return room;
    }
    let aligned = room - room % n + rank;
    if aligned > MAX {
        aligned - n
    } else {
        aligned
    }
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

    fn unit(profile: WireProfile, rank: Option<u32>, dp_size: Option<u32>) -> Unit {
        Unit {
            profile,
            rank,
            dp_size,
        }
    }

    /// The two halves of `body` (a `/generate` body) as JSON, with rooms
    /// from `rooms` in turn.
    fn halves(
        body: &str,
        prefill: Unit,
        decode: Unit,
        rooms: &[u64],
    ) -> (serde_json::Value, serde_json::Value) {
        let parsed = RequestBody::parse(body.as_bytes()).unwrap();
        let b = Bootstrap {
            host: "p.example",
            port: Some(8998),
            prefill,
            decode,
        };
        let mut next = rooms.iter().copied().cycle();
        let f = pd_fields(
            Route::Generate,
            &parsed,
            &b,
            || "r".into(),
            || next.next().unwrap_or(0),
        );
        let json = |fields: &[(&'static str, String)]| -> serde_json::Value {
            serde_json::from_slice(&parsed.with_fields(&as_pairs(fields)).unwrap()).unwrap()
        };
        (json(&f.prefill), json(&f.decode))
    }

    #[test]
    fn rooms_are_masked_into_the_signed_range() {
        let none = Unit::default();
        for profile in [WireProfile::Legacy, WireProfile::Upstream] {
            let (p, d) = halves(
                r#"{"text":"x"}"#,
                unit(profile, None, None),
                none,
                &[u64::MAX],
            );
            assert_eq!(p["bootstrap_room"], i64::MAX, "{profile}");
            assert_eq!(d["bootstrap_room"], i64::MAX, "{profile}");
        }
    }

    #[test]
    fn legacy_profile_writes_the_legacy_fields() {
        let legacy = |rank| unit(WireProfile::Legacy, rank, rank.map(|_| 4));
        // DP-aware: the prefill's rank in both halves, the decode's own too.
        let (p, d) = halves(r#"{"text":"x"}"#, legacy(Some(3)), legacy(Some(1)), &[10]);
        assert_eq!(p["data_parallel_rank"], 3);
        assert!(p.get("data_parallel_rank_decode").is_none());
        assert!(p.get("routed_dp_rank").is_none());
        assert_eq!(d["data_parallel_rank"], 3);
        assert_eq!(d["data_parallel_rank_decode"], 1);
        assert!(d.get("routed_dp_rank").is_none() && d.get("disagg_prefill_dp_rank").is_none());
        assert_eq!(p["bootstrap_room"], 10, "random room, not aligned");
        // Without ranks: the decode half still carries both, as null.
        let (p, d) = halves(r#"{"text":"x"}"#, legacy(None), legacy(None), &[10]);
        assert!(p.get("data_parallel_rank").is_none());
        let d = d.as_object().unwrap();
        assert!(d["data_parallel_rank"].is_null() && d["data_parallel_rank_decode"].is_null());
    }

    #[test]
    fn upstream_profile_writes_routed_and_prefill_ranks_and_aligns_rooms() {
        let up = |rank, n| unit(WireProfile::Upstream, rank, n);
        let (p, d) = halves(
            r#"{"text":"x"}"#,
            up(Some(3), Some(4)),
            up(Some(1), Some(2)),
            &[10],
        );
        assert_eq!(p["routed_dp_rank"], 3);
        assert!(p.get("data_parallel_rank").is_none());
        assert!(p.get("disagg_prefill_dp_rank").is_none());
        assert_eq!(d["routed_dp_rank"], 1, "the decode runs on its own rank");
        assert_eq!(
            d["disagg_prefill_dp_rank"], 3,
            "and finds the KV on the prefill's"
        );
        assert!(
            d.get("data_parallel_rank").is_none() && d.get("data_parallel_rank_decode").is_none()
        );
        // 10 -> 11: the room of 10's block of 4 with room % 4 == 3.
        assert_eq!(p["bootstrap_room"], 11);
        assert_eq!(p["bootstrap_room"], d["bootstrap_room"]);
        // Without ranks: no rank field at all, rooms as drawn.
        let (p, d) = halves(r#"{"text":"x"}"#, up(None, None), up(None, None), &[10]);
        for key in [
            "routed_dp_rank",
            "disagg_prefill_dp_rank",
            "data_parallel_rank",
            "data_parallel_rank_decode",
        ] {
            assert!(p.get(key).is_none() && d.get(key).is_none(), "{key}");
        }
        assert_eq!(p["bootstrap_room"], 10);
    }

    #[test]
    fn aligned_rooms_stay_random_in_range_and_match_the_rank_for_every_batch_item() {
        let prefill = unit(WireProfile::Upstream, Some(2), Some(3));
        let raws = [
            0,
            1,
            2,
            5,
            u64::MAX,
            i64::MAX as u64,
            i64::MAX as u64 - 1,
            1 << 40,
        ];
        let (p, _) = halves(
            r#"{"text":["a","b","c","d","e","f","g","h"]}"#,
            prefill,
            Unit::default(),
            &raws,
        );
        let rooms = p["bootstrap_room"].as_array().unwrap();
        assert_eq!(rooms.len(), raws.len());
        for (room, raw) in rooms.iter().zip(raws) {
            let room = room.as_u64().unwrap();
            assert!(room <= i64::MAX as u64, "{room}");
            assert_eq!(room % 3, 2, "{raw} -> {room}");
            assert!(
                (raw & i64::MAX as u64).abs_diff(room) < 3,
                "{raw} -> {room}"
            );
        }
        // A rank the size does not allow, or one rank: the room as drawn.
        for bad in [
            unit(WireProfile::Upstream, Some(3), Some(3)),
            unit(WireProfile::Upstream, Some(0), Some(1)),
        ] {
            let (p, _) = halves(r#"{"text":"x"}"#, bad, Unit::default(), &[7]);
            assert_eq!(p["bootstrap_room"], 7);
        }
    }

    #[test]
    fn each_half_follows_its_own_workers_profile() {
        let (p, d) = halves(
            r#"{"text":"x"}"#,
            unit(WireProfile::Legacy, Some(1), Some(2)),
            unit(WireProfile::Upstream, Some(0), Some(2)),
            &[4],
        );
        assert_eq!(p["data_parallel_rank"], 1);
        assert_eq!(
            p["bootstrap_room"], 4,
            "a legacy prefill's room is not aligned"
        );
        assert_eq!(d["routed_dp_rank"], 0);
        assert_eq!(d["disagg_prefill_dp_rank"], 1);
    }

    #[test]
    fn regular_rank_field_per_profile() {
        assert_eq!(
            dp_rank_fields(&unit(WireProfile::Legacy, Some(2), Some(4))),
            [("data_parallel_rank", "2".to_string())]
        );
        assert_eq!(
            dp_rank_fields(&unit(WireProfile::Upstream, Some(2), Some(4))),
            [("routed_dp_rank", "2".to_string())]
        );
        assert!(dp_rank_fields(&Unit::default()).is_empty());
    }
}
