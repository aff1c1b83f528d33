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
            for route in Route::ALL {
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
            for route in Route::ALL {
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

#[test]
fn responses_input_reads_like_chat() {
    assert_eq!(
        text(
            Route::Responses,
            r#"{"instructions":"be brief","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]}"#
        ),
        "be briefuser\nhi\n"
    );
    assert_eq!(text(Route::Responses, r#"{"input":"plain"}"#), "plain");
    assert_eq!(text(Route::Classify, r#"{"input":["a","b"]}"#), "a b");
}

#[test]
fn role_comes_first_whatever_the_key_order() {
    assert_eq!(
        text(
            Route::ChatCompletions,
            r#"{"messages":[{"content":"c","role":"r"},7,{"role":"u","content":"d","content":"e"}]}"#
        ),
        "r\nc\nu\ne\n"
    );
}

#[test]
fn numbers_never_grow_much() {
    assert_eq!(
        text(
            Route::Generate,
            r#"{"input_ids":[1e300,0.5,-3,18446744073709551615]}"#
        ),
        "1e300 5e-1 -3 18446744073709551615"
    );
}

#[test]
fn values_deeper_than_the_text_depth_add_nothing() {
    let depth = 100;
    let deep = format!("{}\"hidden\"{}", "[".repeat(depth), "]".repeat(depth));
    let body = format!(r#"{{"messages":[{{"role":"user","content":["shown",{deep}]}}]}}"#);
    assert_eq!(text(Route::ChatCompletions, &body), "user\nshown \n");
    // Right at the limit still counts: `prompt` (0) > 8 arrays (1..=8).
    let at_limit = format!(
        r#"{{"prompt":{}"ok"{}}}"#,
        "[".repeat(usize::from(MAX_TEXT_DEPTH)),
        "]".repeat(usize::from(MAX_TEXT_DEPTH))
    );
    assert_eq!(text(Route::Completions, &at_limit), "ok");
}

#[test]
fn a_million_items_cost_only_their_text() {
    let items = vec!["7"; 1_000_000].join(",");
    let body = format!(r#"{{"input_ids":[{items}]}}"#);
    let t = text(Route::Generate, &body);
    assert_eq!(t.len(), 2 * 1_000_000 - 1);
}

/// The routing text the walk must produce, computed independently on
/// serde_json's tree (which holds only bodies up to its own depth limit).
fn reference(route: Route, body: &serde_json::Value) -> String {
    use serde_json::Value;
    fn textish(v: &Value, depth: u8, out: &mut String) {
        match v {
            Value::String(s) => out.push_str(s),
            Value::Number(n) if n.is_f64() => out.push_str(&format!("{:e}", n.as_f64().unwrap())),
            Value::Number(n) => out.push_str(&n.to_string()),
            Value::Array(items) if depth < MAX_TEXT_DEPTH => {
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    textish(item, depth + 1, out);
                }
            }
            Value::Object(m) if depth < MAX_TEXT_DEPTH => {
                if let Some(t) = m.get("text") {
                    textish(t, depth + 1, out);
                }
            }
            _ => {}
        }
    }
    let mut out = String::new();
    let first = |keys: &[&str], out: &mut String| {
        if let Some(v) = keys.iter().find_map(|k| body.get(*k)) {
            textish(v, 0, out);
        }
    };
    match route {
        Route::ChatCompletions => {
            if let Some(Value::Array(list)) = body.get("messages") {
                for m in list.iter().filter_map(Value::as_object) {
                    if let Some(Value::String(r)) = m.get("role") {
                        out.push_str(r);
                    }
                    out.push('\n');
                    if let Some(c) = m.get("content") {
                        textish(c, 2, &mut out);
                    }
                    out.push('\n');
                }
            }
        }
        Route::Completions => first(&["prompt"], &mut out),
        Route::Generate => first(&["text", "input_ids", "prompt"], &mut out),
        Route::Embeddings | Route::Classify => first(&["input", "text"], &mut out),
        Route::Responses => {
            first(&["instructions"], &mut out);
            match body.get("input") {
                Some(Value::Array(items)) => {
                    for m in items.iter().filter_map(Value::as_object) {
                        if let Some(Value::String(r)) = m.get("role") {
                            out.push_str(r);
                        }
                        out.push('\n');
                        if let Some(c) = m.get("content") {
                            textish(c, 2, &mut out);
                        }
                        out.push('\n');
                    }
                }
                Some(v) => textish(v, 0, &mut out),
                None => {}
            }
        }
        Route::Rerank => {
            first(&["query"], &mut out);
            first(&["documents"], &mut out);
        }
    }
    out
}

const ROUTES: [Route; 7] = Route::ALL;

/// Nested arrays and `text` objects `depth` levels deep around `leaf`.
fn nest(depth: usize, pattern: &[bool], leaf: &str) -> String {
    let mut s = String::new();
    for i in 0..depth {
        s.push_str(if pattern[i % pattern.len()] {
            "["
        } else {
            "{\"text\":"
        });
    }
    s.push_str(leaf);
    for i in (0..depth).rev() {
        s.push(if pattern[i % pattern.len()] { ']' } else { '}' });
    }
    s
}

proptest::proptest! {
    /// Adversarial nesting under every routing field: bodies deeper than
    /// the limit are refused, every other one gives the reference text and
    /// never more than twice its size.
    #[test]
    fn adversarial_nesting(
        depth in 0usize..400,
        pattern in proptest::collection::vec(proptest::bool::ANY, 1..5),
        key in proptest::sample::select(vec!["messages", "prompt", "text", "input_ids", "input", "query", "documents", "instructions", "content"]),
        leaf in "[a-z]{0,5}|-?[1-9][0-9]{0,3}(\\.[0-9]{1,3})?",
    ) {
        let leaf = if leaf.chars().all(|c| c.is_ascii_lowercase()) { format!("\"{leaf}\"") } else { leaf };
        let inner = nest(depth, &pattern, &leaf);
        let raw = if key == "content" {
            format!(r#"{{"messages":[{{"role":"user","content":{inner}}}]}}"#)
        } else {
            format!(r#"{{"{key}":{inner}}}"#)
        };
        let body_depth = depth + if key == "content" { 3 } else { 1 };
        match RequestBody::parse(raw.as_bytes()) {
            Err(crate::BodyError::TooDeep(max)) => proptest::prop_assert!(body_depth > max),
            Err(e) => proptest::prop_assert!(false, "unexpected error {e}"),
            Ok(body) => {
                proptest::prop_assert!(body_depth <= crate::MAX_DEPTH);
                let tree: Option<serde_json::Value> = serde_json::from_str(&raw).ok();
                for route in ROUTES {
                    let t = body.routing_text(route);
                    proptest::prop_assert!(t.len() <= 2 * raw.len());
                    if let Some(tree) = &tree {
                        proptest::prop_assert_eq!(&t, &reference(route, tree));
                    }
                }
            }
        }
    }

    /// Any JSON shape: the walk agrees with the reference.
    #[test]
    fn agrees_with_the_reference(v in json_value()) {
        let text = v.to_string();
        for key in ["messages", "prompt", "text", "input_ids", "input", "query", "documents", "instructions"] {
            let raw = format!("{{\"{key}\":{text}}}");
            let body = RequestBody::parse(raw.as_bytes()).unwrap();
            let tree: serde_json::Value = serde_json::from_str(&raw).unwrap();
            for route in ROUTES {
                proptest::prop_assert_eq!(body.routing_text(route), reference(route, &tree));
            }
        }
    }
}
