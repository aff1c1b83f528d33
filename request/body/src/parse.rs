use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::layout::{Key, Layout, Span};
use crate::BodyError;

/// Deepest nesting of arrays and objects a body may have, the top-level
/// object counting as one: serde_json's own limit, so sglang-router refuses
/// the same bodies. Deeper bodies are refused before anything walks them.
pub const MAX_DEPTH: usize = 128;

/// Most top-level fields a body may have. Real requests have a few dozen;
/// each costs a small record while the body is routed, so a body of
/// millions of tiny fields would cost many times its size in memory.
pub const MAX_FIELDS: usize = 1024;

/// A validated JSON object body with the byte span of every top-level value.
#[derive(Debug)]
pub struct RequestBody<'a> {
    raw: &'a [u8],
    fields: Vec<Field<'a>>,
    /// Offset of the object's closing `}`.
    close: usize,
}

#[derive(Debug)]
struct Field<'a> {
    key: Cow<'a, str>,
    value: &'a RawValue,
    start: usize,
}

impl<'a> RequestBody<'a> {
    /// Validates `raw` as one JSON object within [`MAX_DEPTH`] and
    /// [`MAX_FIELDS`] and locates its top-level fields.
    pub fn parse(raw: &'a [u8]) -> Result<Self, BodyError> {
        let TopLevel(entries) = serde_json::from_slice(raw).map_err(|e| {
            if e.to_string().starts_with(TOO_MANY_FIELDS) {
                BodyError::TooManyFields(MAX_FIELDS)
            } else if e.classify() == serde_json::error::Category::Data {
                BodyError::NotAnObject(e.to_string())
            } else {
                BodyError::InvalidJson(e.to_string())
            }
        })?;
        if nesting_exceeds(raw, MAX_DEPTH) {
            return Err(BodyError::TooDeep(MAX_DEPTH));
        }
        let base = raw.as_ptr() as usize;
        let fields = entries
            .into_iter()
            .map(|(key, value)| Field {
                key: key.0,
                // RawValue borrows from `raw`, so its address gives its offset.
                start: value.get().as_ptr() as usize - base,
                value,
            })
            .collect();
        // A valid object ends with `}` followed only by whitespace.
        let close = raw
            .iter()
            .rposition(|&b| b == b'}')
            .ok_or_else(|| BodyError::NotAnObject("no closing brace".into()))?;
        Ok(RequestBody { raw, fields, close })
    }

    /// The value of a top-level field; the last one wins on duplicate keys, as
    /// in Python's `json` module that SGLang workers use.
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.fields
            .iter()
            .rev()
            .find(|f| f.key == key)
            .map(|f| f.value)
    }

    /// The `model` field when it is a JSON string (escapes decoded);
    /// `None` when it is absent or not a string.
    pub fn model(&self) -> Option<String> {
        serde_json::from_str::<String>(self.get("model")?.get()).ok()
    }

    /// True when the client asked for a streamed response (`"stream": true`).
    pub fn is_stream(&self) -> bool {
        self.get("stream").is_some_and(|v| v.get() == "true")
    }

    /// The body with `fields` set: existing keys get their value replaced in
    /// place, new keys are appended before the closing brace. Every other byte
    /// is the client's. When `fields` names a key twice, the last one wins.
    pub fn with_fields(&self, fields: &[(&str, &str)]) -> Result<Vec<u8>, BodyError> {
        self.layout().with_fields(self.raw, fields)
    }

    /// Where the fields are, to edit this body later without this parse
    /// (and without keeping the body: a few words per field).
    pub fn layout(&self) -> Layout {
        let base = self.raw.as_ptr() as usize;
        let spans = self
            .fields
            .iter()
            .map(|f| Span {
                key: match &f.key {
                    // Borrowed from `raw`: its address gives its offset.
                    Cow::Borrowed(k) => {
                        let at = k.as_ptr() as usize - base;
                        Key::At(at, at + k.len())
                    }
                    Cow::Owned(k) => Key::Text(k.clone()),
                },
                start: f.start,
                end: f.start + f.value.get().len(),
            })
            .collect();
        Layout::new(self.raw.len(), self.close, spans)
    }
}

/// A JSON string, borrowed from the body when it has no escapes.
#[derive(Debug)]
pub(crate) struct Str<'a>(pub(crate) Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// The error text that tells [`RequestBody::parse`] the field limit was hit.
const TOO_MANY_FIELDS: &str = "too many top-level fields";

/// True when arrays and objects in `raw`, a valid JSON text, nest deeper
/// than `max`. One pass with a counter, never recursion: serde_json's raw
/// values (which the parse above uses) accept any depth, and every later
/// walk of the body relies on this bound.
///
/// Only brackets outside strings count; in valid JSON a string starts and
/// ends with an unescaped `"`, and a backslash inside one escapes exactly
/// the next byte (multi-byte UTF-8 never contains `"` or `\`).
fn nesting_exceeds(raw: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut at = 0;
    while let Some(&b) = raw.get(at) {
        match b {
            // A string is skipped whole with memchr, not byte by byte: a
            // prompt is mostly string, and this walk was three quarters of
            // the parse of a 16 KB body.
            b'"' => match string_end(raw, at + 1) {
                Some(end) => at = end,
                None => return false,
            },
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        at += 1;
    }
    false
}

/// The offset of the `"` that closes the string whose contents start at
/// `from`, or None when the text ends first.
fn string_end(raw: &[u8], mut from: usize) -> Option<usize> {
    loop {
        let found = from + memchr::memchr2(b'"', b'\\', raw.get(from..)?)?;
        if raw.get(found) == Some(&b'"') {
            return Some(found);
        }
        // A backslash escapes exactly the byte after it.
        from = found + 2;
    }
}

/// The top-level object as ordered (key, raw value) pairs, duplicates kept.
struct TopLevel<'a>(Vec<(Str<'a>, &'a RawValue)>);

impl<'de> Deserialize<'de> for TopLevel<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TopLevel<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(8);
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    if entries.len() == MAX_FIELDS {
                        // Still validate the rest, keeping none of it.
                        map.next_value::<de::IgnoredAny>()?;
                        while map
                            .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                            .is_some()
                        {}
                        return Err(de::Error::custom(TOO_MANY_FIELDS));
                    }
                    let value: &'de RawValue = map.next_value()?;
                    entries.push((key, value));
                }
                Ok(TopLevel(entries))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inject(body: &str, fields: &[(&str, &str)]) -> String {
        let parsed = RequestBody::parse(body.as_bytes()).unwrap();
        String::from_utf8(parsed.with_fields(fields).unwrap()).unwrap()
    }

    #[test]
    fn keeps_every_client_byte_without_injection() {
        let body =
            "{ \"temperature\": 0.7, \"x\": {\"b\":1,\"a\":[1e3, 1.0]},\n \"model\":\"m\" }\n";
        assert_eq!(inject(body, &[]), body);
    }

    #[test]
    fn replaces_existing_value_in_place() {
        let body = r#"{"rid": "client", "temperature":0.7}"#;
        assert_eq!(
            inject(body, &[("rid", "\"ours\"")]),
            r#"{"rid": "ours", "temperature":0.7}"#
        );
    }

    #[test]
    fn replaces_every_duplicate() {
        let body = r#"{"a":1,"a":2}"#;
        assert_eq!(inject(body, &[("a", "3")]), r#"{"a":3,"a":3}"#);
    }

    #[test]
    fn appends_new_fields_before_closing_brace() {
        assert_eq!(
            inject(r#"{"a":1} "#, &[("b", "null"), ("c", "[1,2]")]),
            r#"{"a":1,"b":null,"c":[1,2]} "#
        );
        assert_eq!(inject("{ }", &[("b", "7")]), r#"{ "b":7}"#);
    }

    #[test]
    fn rejects_non_json_and_non_objects() {
        assert!(matches!(
            RequestBody::parse(b"{\"a\":"),
            Err(BodyError::InvalidJson(_))
        ));
        assert!(matches!(
            RequestBody::parse(b"[1,2]"),
            Err(BodyError::NotAnObject(_))
        ));
        assert!(matches!(
            RequestBody::parse(b"{} x"),
            Err(BodyError::InvalidJson(_))
        ));
        assert!(RequestBody::parse(b"").is_err());
        assert!(RequestBody::parse(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn rejects_invalid_injected_value() {
        let parsed = RequestBody::parse(b"{}").unwrap();
        assert_eq!(
            parsed.with_fields(&[("a", "nope")]),
            Err(BodyError::InvalidInjection("a".into()))
        );
    }

    #[test]
    fn escaped_keys_are_matched_by_their_value() {
        let body = r#"{"r\u0069d":"x"}"#;
        let parsed = RequestBody::parse(body.as_bytes()).unwrap();
        assert_eq!(parsed.get("rid").map(|v| v.get()), Some("\"x\""));
    }

    #[test]
    fn stream_flag() {
        let on = RequestBody::parse(br#"{"stream": true}"#).unwrap();
        let off = RequestBody::parse(br#"{"stream": "true"}"#).unwrap();
        assert!(on.is_stream());
        assert!(!off.is_stream());
    }

    #[test]
    fn last_of_duplicate_injected_keys_wins() {
        assert_eq!(
            inject(
                r#"{"rid":"c"}"#,
                &[("rid", "1"), ("x", "2"), ("rid", "3"), ("x", "4")]
            ),
            r#"{"rid":3,"x":4}"#
        );
    }

    #[test]
    fn refuses_bodies_nested_too_deep() {
        let nested = |d: usize| format!("{{\"a\":{}1{}}}", "[".repeat(d - 1), "]".repeat(d - 1));
        assert!(RequestBody::parse(nested(MAX_DEPTH).as_bytes()).is_ok());
        assert_eq!(
            RequestBody::parse(nested(MAX_DEPTH + 1).as_bytes()).unwrap_err(),
            BodyError::TooDeep(MAX_DEPTH)
        );
        // The issue's attack: 10,000 levels inside a chat message.
        let d = 10_000;
        let attack = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":{}"a"{}}}]}}"#,
            "[".repeat(d),
            "]".repeat(d)
        );
        assert_eq!(
            RequestBody::parse(attack.as_bytes()).unwrap_err(),
            BodyError::TooDeep(MAX_DEPTH)
        );
        // Brackets inside strings, escaped quotes included, do not count.
        let quoted = format!(r#"{{"a":"\"{}","b":[]}}"#, "[".repeat(500));
        assert!(RequestBody::parse(quoted.as_bytes()).is_ok());
    }

    #[test]
    fn refuses_too_many_fields() {
        let body = |n: usize| {
            let fields: Vec<String> = (0..n).map(|i| format!("\"k{i}\":1")).collect();
            format!("{{{}}}", fields.join(","))
        };
        assert!(RequestBody::parse(body(MAX_FIELDS).as_bytes()).is_ok());
        assert_eq!(
            RequestBody::parse(body(MAX_FIELDS + 1).as_bytes()).unwrap_err(),
            BodyError::TooManyFields(MAX_FIELDS)
        );
    }

    /// The deepest nesting in `raw`, byte by byte with no skipping: the
    /// oracle the string-skipping scan must agree with.
    fn deepest_bytewise(raw: &[u8]) -> usize {
        let (mut depth, mut deepest) = (0usize, 0usize);
        let (mut in_string, mut escaped) = (false, false);
        for &b in raw {
            if escaped {
                escaped = false;
                continue;
            }
            match (in_string, b) {
                (true, b'\\') => escaped = true,
                (_, b'"') => in_string = !in_string,
                (false, b'[' | b'{') => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                (false, b']' | b'}') => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        deepest
    }

    proptest::proptest! {
        /// On any bytes at all (unclosed strings and a trailing backslash
        /// included), the string-skipping scan says what the byte-by-byte
        /// one says, and never panics.
        #[test]
        fn nesting_scan_matches_the_bytewise_one(
            raw in proptest::collection::vec(proptest::sample::select(b"[]{}\"\\ab".to_vec()), 0..64),
            max in 0usize..6,
        ) {
            proptest::prop_assert_eq!(nesting_exceeds(&raw, max), deepest_bytewise(&raw) > max);
        }

        /// The depth counter agrees with serde_json's tree on any JSON.
        #[test]
        fn nesting_matches_the_tree(v in json_tree()) {
            fn depth(v: &serde_json::Value) -> usize {
                match v {
                    serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
                    serde_json::Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
                    _ => 0,
                }
            }
            let raw = v.to_string();
            let d = depth(&v);
            proptest::prop_assert!(!nesting_exceeds(raw.as_bytes(), d));
            if d > 0 {
                proptest::prop_assert!(nesting_exceeds(raw.as_bytes(), d - 1));
            }
        }

        /// Any body and any list of fields: never a panic, and the result is
        /// valid JSON whenever the input was.
        #[test]
        fn injection_never_panics(
            body in ".{0,40}",
            fields in proptest::collection::vec(("[a-c]{1,2}", "[0-9]{1,3}|null|\"[a-z]*\"|\\{"), 0..6),
        ) {
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            for raw in [body.clone(), format!("{{\"a\":{}}}", serde_json::to_string(&body).unwrap())] {
                if let Ok(parsed) = RequestBody::parse(raw.as_bytes()) {
                    if let Ok(out) = parsed.with_fields(&fields) {
                        proptest::prop_assert!(RequestBody::parse(&out).is_ok());
                    }
                }
            }
        }

        /// Whatever object the client sends, injecting fields changes nothing
        /// but those fields: removing them again gives the client's values.
        #[test]
        fn injection_preserves_other_fields(
            keys in proptest::collection::vec("[a-z]{1,6}", 0..6),
            nums in proptest::collection::vec(-1.0e6f64..1.0e6, 6),
        ) {
            let mut body = String::from("{");
            for (i, k) in keys.iter().enumerate() {
                if i > 0 { body.push_str(", "); }
                body.push_str(&format!("\"{k}\": {}", nums[i]));
            }
            body.push('}');
            let parsed = RequestBody::parse(body.as_bytes()).unwrap();
            let out = parsed.with_fields(&[("rid", "\"r-1\""), ("data_parallel_rank", "3")]).unwrap();
            let again = RequestBody::parse(&out).unwrap();
            proptest::prop_assert_eq!(again.get("rid").map(|v| v.get()), Some("\"r-1\""));
            proptest::prop_assert_eq!(again.get("data_parallel_rank").map(|v| v.get()), Some("3"));
            for k in keys.iter().filter(|k| *k != "rid") {
                proptest::prop_assert_eq!(again.get(k).map(|v| v.get()), parsed.get(k).map(|v| v.get()));
            }
        }
    }

    fn json_tree() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<i64>().prop_map(serde_json::Value::from),
            "[\\[\\]{}\"\\\\a-z]{0,6}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(8, 64, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("[a-z{\\[\"]{0,3}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
