//! Reading request bodies: JSON parsing and typed field access with
//! SGLang-style 400 errors. Bodies are handled as `serde_json` maps rather
//! than typed structs so that any extra field a router adds is accepted.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::tokens::Prompt;

/// A request body: a JSON object.
pub type Body = Map<String, Value>;

/// Parses `bytes` as a JSON object.
pub fn parse_object(bytes: &[u8]) -> Result<Body, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad(
            "request body is not valid JSON: the body is empty",
        ));
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad("request body must be a JSON object")),
        Err(e) => Err(ApiError::bad(format!(
            "request body is not valid JSON: {e}"
        ))),
    }
}

/// `body[key]`, treating an explicit `null` as absent.
pub fn field<'a>(body: &'a Body, key: &str) -> Option<&'a Value> {
    body.get(key).filter(|v| !v.is_null())
}

/// An optional non-negative integer field.
pub fn opt_u64(body: &Body, key: &str) -> Result<Option<u64>, ApiError> {
    match field(body, key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| ApiError::bad(format!("{key} must be a non-negative integer"))),
    }
}

/// An optional boolean field.
pub fn opt_bool(body: &Body, key: &str) -> Result<Option<bool>, ApiError> {
    match field(body, key) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| ApiError::bad(format!("{key} must be a boolean"))),
    }
}

/// An optional string field.
pub fn opt_str<'a>(body: &'a Body, key: &str) -> Result<Option<&'a str>, ApiError> {
    match field(body, key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| ApiError::bad(format!("{key} must be a string"))),
    }
}

/// Number of tokens to generate: the first of `keys` present, else `default`;
/// refused, as SGLang refuses it, when it does not fit in `context_length`
/// with at least one prompt token.
pub fn max_tokens(
    body: &Body,
    keys: &[&str],
    default: usize,
    context_length: usize,
) -> Result<usize, ApiError> {
    let mut n = default as u64;
    for key in keys {
        if let Some(asked) = opt_u64(body, key)? {
            n = asked;
            break;
        }
    }
    match usize::try_from(n) {
        Ok(n) if n < context_length => Ok(n),
        _ => Err(ApiError::bad(format!(
            "Requested token count exceeds the model's maximum context length of \
             {context_length} tokens. You requested {n} tokens for the completion."
        ))),
    }
}

/// The DP rank field `key` (`data_parallel_rank` or
/// `data_parallel_rank_decode`), if given. Out-of-range ranks are left to the
/// engine (it falls back to round-robin, like an unpinned request).
pub fn dp_rank(body: &Body, key: &str) -> Result<Option<i64>, ApiError> {
    match field(body, key) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| ApiError::bad(format!("{key} must be an integer"))),
    }
}

/// The `model` of the request, or the served model.
pub fn model(body: &Body, served: &str) -> String {
    field(body, "model")
        .and_then(Value::as_str)
        .unwrap_or(served)
        .to_string()
}

/// Prompts in `value` (named `name` in errors), and whether they form a
/// batch: a string or a list of token ids is one prompt; a list of strings
/// or a list of lists of token ids is a batch.
pub fn prompts(name: &str, value: &Value) -> Result<(Vec<Prompt>, bool), ApiError> {
    let bad = || {
        ApiError::bad(format!(
            "{name} must be a string, a list of strings, a list of token ids or a list of lists of token ids"
        ))
    };
    match value {
        Value::String(s) => Ok((vec![Prompt::Text(s.clone())], false)),
        Value::Array(items) if items.is_empty() => {
            Err(ApiError::bad(format!("{name} must not be empty")))
        }
        Value::Array(items) => {
            if items.iter().all(Value::is_string) {
                let texts = items
                    .iter()
                    .filter_map(|v| v.as_str().map(|s| Prompt::Text(s.to_string())))
                    .collect();
                Ok((texts, true))
            } else if items.iter().all(Value::is_number) {
                Ok((vec![Prompt::Ids(token_ids(items).ok_or_else(bad)?)], false))
            } else if items.iter().all(Value::is_array) {
                let batch = items
                    .iter()
                    .map(|v| {
                        v.as_array()
                            .and_then(|ids| token_ids(ids))
                            .map(Prompt::Ids)
                            .ok_or_else(bad)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((batch, true))
            } else {
                Err(bad())
            }
        }
        _ => Err(bad()),
    }
}

/// Integer token ids, or `None` if any is not an integer.
fn token_ids(items: &[Value]) -> Option<Vec<i64>> {
    items
        .iter()
        .map(|v| v.as_i64().or_else(|| v.as_u64().map(|u| u as i64)))
        .collect()
}

/// For batch item `i`: `value[i]` if `value` is a list, else `value` itself
/// (SGLang accepts per-item or shared `rid`s and sampling params).
pub fn per_item(value: Option<&Value>, i: usize) -> Option<&Value> {
    match value {
        Some(Value::Array(items)) => items.get(i),
        other => other,
    }
    .filter(|v| !v.is_null())
}

/// A random 32-hex-digit id, like SGLang's uuid-based request ids.
pub fn random_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Seconds since the Unix epoch.
pub fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prompt_shapes() {
        let one = |v: Value| prompts("p", &v).map(|(p, batch)| (p.len(), batch)).ok();
        assert_eq!(one(json!("hi")), Some((1, false)));
        assert_eq!(one(json!(["a", "b"])), Some((2, true)));
        assert_eq!(one(json!([1, 2, 3])), Some((1, false)));
        assert_eq!(one(json!([[1], [2, 3]])), Some((2, true)));
        assert_eq!(one(json!([])), None);
        assert_eq!(one(json!(["a", 1])), None);
        assert_eq!(one(json!(5)), None);
    }

    #[test]
    fn json_errors() {
        assert!(parse_object(b"").is_err());
        assert!(parse_object(b"[1]").is_err());
        assert!(parse_object(b"{\"a\":1} x").is_err());
        assert!(parse_object(b"{\"a\":1}").is_ok());
    }
}
