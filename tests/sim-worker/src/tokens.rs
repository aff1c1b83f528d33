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

/// Size of the vocabulary that text tokens' ids are drawn from.
const VOCAB: u64 = 32000;

/// The token id reported for `t` (in logprobs): the id itself for a prompt
/// given as token ids, else a stable id derived from the text.
pub fn token_id(t: Token) -> i64 {
    if t & ID_TAG != 0 {
        // Ids were stored without their top bit; restore negative ones.
        (((t & !ID_TAG) << 1) as i64) >> 1
    } else {
        let mut h = t.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
        (h % VOCAB) as i64
    }
}

/// The token id of generated token `i`.
pub fn generated_token_id(i: usize) -> i64 {
    (i as u64 % VOCAB) as i64
}

/// A deterministic log-probability in `[-5, 0)` for token `id` at `pos`.
pub fn logprob(id: i64, pos: usize) -> f64 {
    let mut h = (id as u64) ^ (pos as u64).rotate_left(32) ^ 0x2545_f491_4f6c_dd1d;
    h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^= h >> 31;
    -((h % 5000) as f64 + 1.0) / 1000.0
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
    fn token_ids_and_logprobs() {
        assert_eq!(
            Prompt::Ids(vec![5, -3])
                .tokens()
                .into_iter()
                .map(token_id)
                .collect::<Vec<_>>(),
            vec![5, -3]
        );
        let t = tokenize("abcd")[0];
        assert_eq!(token_id(t), token_id(t));
        assert!((0..32000).contains(&token_id(t)));
        let lp = logprob(7, 3);
        assert!((-5.0..0.0).contains(&lp), "{lp}");
        assert_eq!(lp, logprob(7, 3));
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
