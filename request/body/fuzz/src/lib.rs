//! Properties of `sglang-envoy-body` checked by the fuzz targets. Each check
//! panics (so libFuzzer records a crash) when a property fails.
//!
//! The oracle is serde_json's own tree parser plus an independent reader of
//! the top-level entries (`entries`), never the crate's code under test.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use sglang_envoy_body::{
    is_info_path, openai_error_json, BodyError, RequestBody, Route, MAX_DEPTH, MAX_FIELDS,
};

/// Every route the filter reads a body for.
pub const ROUTES: [Route; 7] = Route::ALL;

/// Top-level keys some route's routing text reads.
const TEXT_KEYS: [&str; 8] = [
    "messages",
    "prompt",
    "text",
    "input_ids",
    "input",
    "query",
    "documents",
    "instructions",
];

/// The top-level (key, raw value) pairs of a JSON object, in order,
/// duplicates kept; `None` when `raw` is not one JSON object.
pub fn entries(raw: &[u8]) -> Option<Vec<(String, String)>> {
    struct Entries(Vec<(String, String)>);
    impl<'de> Deserialize<'de> for Entries {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Entries;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                    let mut out = Vec::new();
                    while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                        out.push((k, v.get().to_string()));
                    }
                    Ok(Entries(out))
                }
            }
            d.deserialize_map(V)
        }
    }
    serde_json::from_slice::<Entries>(raw).ok().map(|e| e.0)
}

/// How many top-level entries the JSON object at the start of `raw` has,
/// for any number of them.
fn entries_unbounded(raw: &[u8]) -> Option<usize> {
    struct Count(usize);
    impl<'de> Deserialize<'de> for Count {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Count;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Count, A::Error> {
                    let mut n = 0;
                    while map
                        .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                        .is_some()
                    {
                        n += 1;
                    }
                    Ok(Count(n))
                }
            }
            d.deserialize_map(V)
        }
    }
    // Whatever follows the object does not matter for the count.
    let mut de = serde_json::Deserializer::from_slice(raw);
    Count::deserialize(&mut de).ok().map(|c| c.0)
}

/// serde_json's verdict on `raw` as a whole: `Some(true)` a JSON object,
/// `Some(false)` not one (invalid or another type), `None` when the tree
/// parser hits one of its own limits (the raw-value scanner has none, so
/// there is nothing to compare against).
///
/// JSON's grammar allows any `\uXXXX` escape, unpaired UTF-16 surrogates too
/// (Python's `json`, which SGLang uses, accepts them), but serde_json's tree
/// parser rejects those. So surrogate escapes are neutralised first: the
/// hex digits become `0041`, which keeps the structure and the validity of
/// everything else.
fn tree_is_object(raw: &[u8]) -> Option<bool> {
    let raw = neutralise_surrogates(raw);
    match serde_json::from_slice::<Value>(&raw) {
        Ok(v) => Some(v.is_object()),
        // Limits of the tree parser, not of JSON: nesting depth, and numbers
        // beyond f64 (JSON has no range; Python reads 1e999 as inf).
        Err(e)
            if e.to_string().contains("recursion limit")
                || e.to_string().contains("number out of range") =>
        {
            None
        }
        Err(_) => Some(false),
    }
}

/// `raw` with the four hex digits of every `\uD800`..`\uDFFF` replaced by
/// `0041` (same length; hex digits stay hex digits, literal characters stay
/// literal characters).
fn neutralise_surrogates(raw: &[u8]) -> Vec<u8> {
    let mut out = raw.to_vec();
    let mut i = 0;
    while i + 6 <= out.len() {
        let w = &out[i..i + 6];
        if w[0] == b'\\'
            && w[1] == b'u'
            && matches!(w[2], b'd' | b'D')
            && matches!(w[3], b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F')
            && w[4].is_ascii_hexdigit()
            && w[5].is_ascii_hexdigit()
        {
            out[i + 2..i + 6].copy_from_slice(b"0041");
            i += 6;
        } else {
            i += 1;
        }
    }
    out
}

/// True when `raw` is a JSON object but for unpaired surrogate escapes,
/// and one of them stands in a top-level key (between the end of the
/// previous value and the start of the key's value).
fn surrogate_in_top_level_key(raw: &[u8]) -> bool {
    let neutral = neutralise_surrogates(raw);
    if neutral == raw {
        return false;
    }
    let Some(spans) = value_spans(&neutral) else {
        return false;
    };
    let mut from = 0;
    spans.iter().any(|&(start, end)| {
        let key = from..start;
        from = end;
        raw[key.clone()] != neutral[key]
    })
}

/// The byte span of every top-level value of a JSON object, in order.
fn value_spans(raw: &[u8]) -> Option<Vec<(usize, usize)>> {
    struct Spans<'a>(Vec<&'a RawValue>);
    impl<'de> Deserialize<'de> for Spans<'de> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Spans<'de>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Spans<'de>, A::Error> {
                    let mut out = Vec::new();
                    while map.next_key::<serde::de::IgnoredAny>()?.is_some() {
                        out.push(map.next_value::<&'de RawValue>()?);
                    }
                    Ok(Spans(out))
                }
            }
            d.deserialize_map(V)
        }
    }
    let Spans(values) = serde_json::from_slice::<Spans>(raw).ok()?;
    let base = raw.as_ptr() as usize;
    Some(
        values
            .iter()
            .map(|v| {
                let start = v.get().as_ptr() as usize - base;
                (start, start + v.get().len())
            })
            .collect(),
    )
}

/// JSON whitespace, which serde_json skips around a value.
fn trim_json_ws(s: &str) -> &str {
    s.trim_matches([' ', '\t', '\n', '\r'])
}

/// Arbitrary bytes as a request body: parsing never panics, accepts exactly
/// the JSON objects, and what it reports agrees with serde_json.
pub fn check_parse(data: &[u8]) {
    let parsed = RequestBody::parse(data);
    match &parsed {
        Err(BodyError::InvalidInjection(_)) => panic!("parse returned an injection error"),
        // serde_json's tree stops one level short of the body limit, so a
        // body refused as too deep is one the tree cannot hold either.
        Err(BodyError::TooDeep(max)) => {
            assert_eq!(*max, MAX_DEPTH);
            assert_eq!(
                tree_is_object(data),
                None,
                "refused as too deep: {parsed:?}"
            );
            return;
        }
        Err(BodyError::TooManyFields(max)) => {
            assert_eq!(*max, MAX_FIELDS);
            let n = entries_unbounded(data).expect("too many fields of an object");
            assert!(n > MAX_FIELDS, "refused {n} fields");
            return;
        }
        _ => {}
    }
    // Known divergence: an unpaired surrogate escape inside a top-level
    // *key* is rejected (keys are decoded to match them; values are kept
    // raw and accepted). No SGLang field name contains one. Only that case
    // is exempt: a surrogate in a value must still be accepted.
    let surrogate_key = parsed.is_err() && surrogate_in_top_level_key(data);
    if let Some(is_object) = tree_is_object(data).filter(|_| !surrogate_key) {
        assert_eq!(
            parsed.is_ok(),
            is_object,
            "parse disagrees with serde_json: {parsed:?}"
        );
    }
    let Ok(body) = parsed else {
        return;
    };
    let list = entries(data).expect("a parsed body has top-level entries");
    // `get` is the last duplicate's value, byte for byte.
    for (k, _) in &list {
        let last = list
            .iter()
            .rev()
            .find(|(k2, _)| k2 == k)
            .map(|e| e.1.as_str());
        assert_eq!(body.get(k).map(|v| v.get()), last, "get({k:?})");
    }
    let stream = list
        .iter()
        .rev()
        .find(|(k, _)| k == "stream")
        .map(|e| e.1.as_str());
    assert_eq!(body.is_stream(), stream == Some("true"));
    // No injection: the output is the input, every byte.
    assert_eq!(body.with_fields(&[]).expect("no fields").as_slice(), data);
    for route in ROUTES {
        let text = body.routing_text(route);
        // Text never costs much more memory than the body it comes from.
        assert!(
            text.len() <= 2 * data.len(),
            "routing text of {} bytes",
            text.len()
        );
        if route == Route::Completions {
            if let Some(Value::String(s)) = body
                .get("prompt")
                .and_then(|v| serde_json::from_str::<Value>(v.get()).ok())
            {
                assert_eq!(text, s, "a string prompt is the routing text");
            }
        }
    }
}

/// Paths and error bodies: never a panic, and error bodies are the OpenAI
/// shape with the values given.
pub fn check_text(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let route = Route::from_path(s);
    let bare = s.split_once('?').map_or(s, |(p, _)| p);
    assert_eq!(route, Route::from_path(bare), "the query is ignored");
    if let Some(r) = route {
        assert!(!r.rid_prefix().is_empty());
        assert!(!is_info_path(s));
    }
    let status = data
        .iter()
        .fold(0u16, |a, &b| a.wrapping_mul(31).wrapping_add(u16::from(b)));
    let json = openai_error_json(status, s, s);
    let v: Value = serde_json::from_str(&json).expect("error body is JSON");
    assert_eq!(v["error"]["message"], s);
    assert_eq!(v["error"]["type"], s);
    assert_eq!(v["error"]["code"], status);
    assert!(v["error"]["param"].is_null());
}

/// Splits a fuzz input into a body and the fields to inject:
/// `body \0 key \0 value \0 key \0 value ...` (a JSON body holds no NUL byte).
/// Keys and values that are not UTF-8 are made so, lossily.
pub fn split_inject_input(data: &[u8]) -> (&[u8], Vec<(String, String)>) {
    let mut parts = data.split(|&b| b == 0);
    let body = parts.next().unwrap_or_default();
    let rest: Vec<String> = parts
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let fields = rest
        .chunks(2)
        .take(8)
        .map(|kv| (kv[0].clone(), kv.get(1).cloned().unwrap_or_default()))
        .collect();
    (body, fields)
}

/// Field injection: for a body that parses, `with_fields` fails exactly when
/// an effective value is not JSON; otherwise the output parses, every
/// injected key has exactly the injected value (all duplicates), every other
/// top-level entry is byte-identical and in place, new keys come last, and
/// the routing text is unchanged unless a key it reads was injected.
pub fn check_inject(data: &[u8]) {
    let (raw, fields) = split_inject_input(data);
    let Ok(body) = RequestBody::parse(raw) else {
        return;
    };
    let pairs: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    // The last occurrence of each key sets it.
    let effective: Vec<(&str, &str)> = pairs
        .iter()
        .enumerate()
        .filter(|(i, (k, _))| !pairs[i + 1..].iter().any(|(k2, _)| k2 == k))
        .map(|(_, p)| *p)
        .collect();
    let valid = |v: &str| serde_json::from_str::<&RawValue>(v).is_ok();
    let out = body.with_fields(&pairs);
    if let Some((k, _)) = effective.iter().find(|(_, v)| !valid(v)) {
        assert_eq!(out, Err(BodyError::InvalidInjection(k.to_string())));
        return;
    }
    let out = out.expect("valid fields inject");

    // Valid JSON in, valid JSON object out.
    assert_ne!(
        tree_is_object(&out),
        Some(false),
        "output is not a JSON object"
    );
    let again = RequestBody::parse(&out).expect("output parses");

    let before = entries(raw).expect("entries of a parsed body");
    let after = entries(&out).expect("entries of the output");
    let mut expected: Vec<(String, String)> = before
        .iter()
        .map(|(k, v)| match effective.iter().find(|(ek, _)| ek == k) {
            Some((_, ev)) => (k.clone(), trim_json_ws(ev).to_string()),
            None => (k.clone(), v.clone()),
        })
        .collect();
    for (k, v) in &effective {
        if !before.iter().any(|(bk, _)| bk == k) {
            expected.push((k.to_string(), trim_json_ws(v).to_string()));
        }
    }
    assert_eq!(after, expected, "top-level entries after injection");
    for (k, v) in &effective {
        assert_eq!(again.get(k).map(|r| r.get()), Some(trim_json_ws(v)));
    }
    if !effective.iter().any(|(k, _)| TEXT_KEYS.contains(k)) {
        for route in ROUTES {
            assert_eq!(
                again.routing_text(route),
                body.routing_text(route),
                "injecting other fields changed the routing text"
            );
        }
    }
}
