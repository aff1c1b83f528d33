//! The text the cache-aware policies match on.
//!
//! It only has to be stable and prefix-preserving: two requests whose prompts
//! share a prefix must yield texts that share a prefix. It is never sent to a
//! worker. Malformed fields give less text, never an error: the worker, not
//! the router, decides whether a request is well-formed.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::parse::Str;
use crate::{RequestBody, Route};

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    role: Option<Str<'a>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

impl RequestBody<'_> {
    /// The routing text of this body for `route`: chat messages as
    /// `role\ncontent\n`, else the prompt-like field of the route.
    pub fn routing_text(&self, route: Route) -> String {
        let mut out = String::new();
        match route {
            Route::ChatCompletions => {
                if let Some(messages) = self.get("messages") {
                    append_messages(messages, &mut out);
                }
            }
            Route::Completions => self.append_first(&["prompt"], &mut out),
            Route::Generate => self.append_first(&["text", "input_ids", "prompt"], &mut out),
            Route::Embeddings => self.append_first(&["input", "text"], &mut out),
            Route::Rerank => {
                self.append_first(&["query"], &mut out);
                self.append_first(&["documents"], &mut out);
            }
        }
        out
    }

    fn append_first(&self, keys: &[&str], out: &mut String) {
        if let Some(v) = keys.iter().find_map(|k| self.get(k)) {
            append_textish(v, out);
        }
    }
}

fn append_messages(messages: &RawValue, out: &mut String) {
    let Ok(list) = serde_json::from_str::<Vec<Message<'_>>>(messages.get()) else {
        return;
    };
    for m in list {
        if let Some(role) = m.role {
            out.push_str(&role.0);
        }
        out.push('\n');
        if let Some(content) = m.content {
            append_textish(content, out);
        }
        out.push('\n');
    }
}

/// Appends strings as they are, numbers as written, and arrays item by item;
/// objects contribute their `text` field (chat content parts).
fn append_textish(v: &RawValue, out: &mut String) {
    let json = v.get();
    match json.as_bytes().first() {
        Some(b'"') => {
            if let Ok(s) = serde_json::from_str::<Str<'_>>(json) {
                out.push_str(&s.0);
            }
        }
        Some(b'[') => {
            if let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(json) {
                for (i, item) in items.into_iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    append_textish(item, out);
                }
            }
        }
        Some(b'{') => {
            #[derive(Deserialize)]
            struct Part<'a> {
                #[serde(borrow, default)]
                text: Option<&'a RawValue>,
            }
            if let Ok(Part { text: Some(t) }) = serde_json::from_str::<Part<'_>>(json) {
                append_textish(t, out);
            }
        }
        Some(b'-' | b'0'..=b'9') => out.push_str(json),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(route: Route, body: &str) -> String {
        RequestBody::parse(body.as_bytes())
            .unwrap()
            .routing_text(route)
    }

    #[test]
    fn chat_messages_keep_order_roles_and_parts() {
        let t = text(
            Route::ChatCompletions,
            r#"{"messages":[{"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hi \u00e9"},{"type":"image_url","image_url":{}}]}]}"#,
        );
        assert_eq!(t, "system\nbe brief\nuser\nhi é \n");
    }

    #[test]
    fn shared_prefix_survives_extraction() {
        let a = text(
            Route::ChatCompletions,
            r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"one"}]}"#,
        );
        let b = text(
            Route::ChatCompletions,
            r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"two"}]}"#,
        );
        assert!(a.starts_with("system\nS\nuser\n") && b.starts_with("system\nS\nuser\n"));
        assert_ne!(a, b);
    }

    #[test]
    fn prompt_like_fields_per_route() {
        assert_eq!(text(Route::Completions, r#"{"prompt":"abc"}"#), "abc");
        assert_eq!(text(Route::Generate, r#"{"text":["a","b"]}"#), "a b");
        assert_eq!(text(Route::Generate, r#"{"input_ids":[1,22,3]}"#), "1 22 3");
        assert_eq!(text(Route::Embeddings, r#"{"input":"e"}"#), "e");
        assert_eq!(
            text(Route::Rerank, r#"{"query":"q","documents":["d1","d2"]}"#),
            "qd1 d2"
        );
    }

    proptest::proptest! {
        /// Whatever bytes a client sends, parsing and text extraction return
        /// (a panic in the filter would kill the wasm VM).
        #[test]
        fn any_bytes_are_handled(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            if let Ok(body) = RequestBody::parse(&raw) {
                for route in [Route::ChatCompletions, Route::Completions, Route::Generate, Route::Embeddings, Route::Rerank] {
                    let _ = body.routing_text(route);
                }
                let _ = body.is_stream();
            }
        }

        /// Structured JSON of any shape under the fields the text comes from.
        #[test]
        fn any_json_shape_is_handled(v in json_value()) {
            let text = v.to_string();
            for key in ["messages", "prompt", "text", "input_ids", "input", "query", "documents"] {
                let raw = format!("{{\"{key}\":{text}}}");
                let body = RequestBody::parse(raw.as_bytes()).unwrap();
                for route in [Route::ChatCompletions, Route::Completions, Route::Generate, Route::Embeddings, Route::Rerank] {
                    let _ = body.routing_text(route);
                }
                // A plain string prompt is the text, decoded from its escapes.
                if let (serde_json::Value::String(s), "prompt") = (&v, key) {
                    proptest::prop_assert_eq!(&body.routing_text(Route::Completions), s);
                }
            }
        }
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "[a-z\\u{e9}\"]{0,6}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("(role|content|text|type|x)", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn malformed_fields_give_empty_text() {
        assert_eq!(text(Route::ChatCompletions, r#"{"messages":7}"#), "");
        assert_eq!(text(Route::Completions, r#"{"prompt":{"x":1}}"#), "");
        assert_eq!(text(Route::Completions, r#"{}"#), "");
    }
}
