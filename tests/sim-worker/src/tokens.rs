//! The toy tokenizer: one token is up to 4 bytes of prompt text, cut at char
//! boundaries, so token counts are easy to predict in tests (`"abcd" * 100`
//! is exactly 100 tokens).

use serde_json::Value;

use crate::error::ApiError;

/// Largest number of UTF-8 bytes in one token.
const TOKEN_BYTES: usize = 4;

/// Marks a token made from a token id, so that ids never collide with text.
const ID_TAG: u64 = 1 << 63;

/// A token as the prefix cache sees it: an opaque key. Text tokens pack their
/// bytes and length; token ids carry [`ID_TAG`].
pub type Token = u64;

/// One prompt of a request, before tokenization.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Plain text, tokenized with the toy tokenizer.
    Text(String),
    /// Token ids given by the client; each id is one token.
    Ids(Vec<i64>),
}

impl Prompt {
    /// The prompt's tokens.
    pub fn tokens(&self) -> Vec<Token> {
        match self {
            Prompt::Text(text) => tokenize(text),
            Prompt::Ids(ids) => ids
                .iter()
                .map(|&id| ID_TAG | ((id as u64) & !ID_TAG))
                .collect(),
        }
    }
}

/// Splits `text` into tokens of at most [`TOKEN_BYTES`] bytes each.
pub fn tokenize(text: &str) -> Vec<Token> {
    let mut out = Vec::with_capacity(text.len() / TOKEN_BYTES + 1);
    let mut key: u64 = 0;
    let mut len = 0usize;
    for ch in text.chars() {
        let mut buf = [0u8; 4];
        let bytes = ch.encode_utf8(&mut buf).as_bytes();
        if len + bytes.len() > TOKEN_BYTES {
            out.push(key | ((len as u64) << 32));
            key = 0;
            len = 0;
        }
        for &b in bytes {
            key |= u64::from(b) << (8 * len);
            len += 1;
        }
    }
    if len > 0 {
        out.push(key | ((len as u64) << 32));
    }
    out
}

/// Renders chat `messages` into the prompt text: `<|role|>\n{content}\n` per
/// message. Content may be a string, null, or an array of parts of which
/// only `{"type":"text","text":..}` parts count (images etc. are ignored).
pub fn render_chat(messages: &Value) -> Result<String, ApiError> {
    let list = messages
        .as_array()
        .ok_or_else(|| ApiError::bad("messages must be a list"))?;
    if list.is_empty() {
        return Err(ApiError::bad("messages must not be empty"));
    }
    let mut out = String::new();
    for (i, msg) in list.iter().enumerate() {
        let role = msg
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad(format!("messages[{i}].role is required")))?;
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        match msg.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => out.push_str(s),
            Some(Value::Array(parts)) => {
                for part in parts {
                    if part.get("type").and_then(Value::as_str) == Some("text") {
                        if let Some(t) = part.get("text").and_then(Value::as_str) {
                            out.push_str(t);
                        }
                    }
                }
            }
            Some(_) => {
                return Err(ApiError::bad(format!(
                    "messages[{i}].content must be a string or a list of parts"
                )))
            }
        }
        out.push('\n');
    }
    Ok(out)
}

/// The text of generated token `i`; deterministic so that streamed and
/// non-streamed answers are equal.
pub fn generated_token(i: usize) -> String {
    format!(" tok{i}")
}

/// The text of the first `n` generated tokens.
pub fn generated_text(n: usize) -> String {
    (0..n).map(generated_token).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_bytes_per_token() {
        assert_eq!(tokenize("").len(), 0);
        assert_eq!(tokenize("abcd").len(), 1);
        assert_eq!(tokenize("abcde").len(), 2);
        assert_eq!(tokenize(&"abcd".repeat(100)).len(), 100);
        // 'é' is 2 bytes: "aéé" is 5 bytes and cannot be split inside a char.
        assert_eq!(tokenize("aéé").len(), 2);
        assert_eq!(tokenize("😀😀").len(), 2);
    }

    #[test]
    fn same_prefix_same_tokens() {
        let a = tokenize("hello world, how are you");
        let b = tokenize("hello world, who is this");
        assert_eq!(a[..3], b[..3]);
        assert_ne!(a[3], b[3]);
    }

    #[test]
    fn ids_and_text_never_collide() {
        let ids = Prompt::Ids(vec![0x61]).tokens();
        assert_ne!(ids, tokenize("a"));
    }

    #[test]
    fn chat_rendering() {
        let m = serde_json::json!([
            {"role": "system", "content": "be nice"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        ]);
        assert_eq!(
            render_chat(&m).ok().as_deref(),
            Some("<|system|>\nbe nice\n<|user|>\nhi\n")
        );
        assert!(render_chat(&serde_json::json!([{"content": "x"}])).is_err());
    }
}
