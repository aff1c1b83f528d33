//! Reading a model's tokenizer files from its directory, as transformers
//! 5.19 (SGLang 0.5.23's pin) finds them: `tokenizer.json`, the chat
//! template from `chat_template.jinja` over `tokenizer_config.json`'s
//! `chat_template`, and the special tokens the template may name.

use std::path::Path;

use serde_json::Value;

use crate::PromptError;

/// The special tokens HF passes to a chat template, by name.
const SPECIAL_TOKENS: &[&str] = &[
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A model's tokenizer files, read.
#[derive(Debug, Clone, Default)]
pub struct ModelFiles {
    /// The bytes of `tokenizer.json`.
    pub tokenizer_json: Vec<u8>,
    /// The chat template's source, if the model has one.
    pub chat_template: Option<String>,
    /// Special tokens by name (`bos_token` ...), as the template sees them.
    pub special_tokens: Vec<(String, String)>,
}

impl ModelFiles {
    /// Reads the files of the model in `dir`.
    pub fn read(dir: &Path) -> Result<Self, PromptError> {
        let read = |name: &str| std::fs::read(dir.join(name));
        let tokenizer_json = read("tokenizer.json").map_err(|e| {
            PromptError::Files(format!("{}: {e}", dir.join("tokenizer.json").display()))
        })?;
        let config: Option<Value> = match read("tokenizer_config.json") {
            Ok(bytes) => Some(
                serde_json::from_slice(&bytes)
                    .map_err(|e| PromptError::Files(format!("tokenizer_config.json: {e}")))?,
            ),
            Err(_) => None,
        };
        let jinja = read("chat_template.jinja")
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        Ok(Self::from_parts(tokenizer_json, config.as_ref(), jinja))
    }

    /// Builds from `tokenizer.json`'s bytes, the parsed
    /// `tokenizer_config.json` and `chat_template.jinja`'s text.
    pub fn from_parts(
        tokenizer_json: Vec<u8>,
        config: Option<&Value>,
        jinja: Option<String>,
    ) -> Self {
        let chat_template = jinja.or_else(|| config.and_then(config_template));
        let special_tokens = config
            .map(|c| {
                SPECIAL_TOKENS
                    .iter()
                    .filter_map(|&name| Some((name.to_string(), token_text(c.get(name)?)?)))
                    .collect()
            })
            .unwrap_or_default();
        ModelFiles {
            tokenizer_json,
            chat_template,
            special_tokens,
        }
    }
}

/// `chat_template` of a tokenizer config: a string, or a list of named
/// templates of which SGLang takes "default" (`--hf-chat-template-name`
/// aside), else the first.
fn config_template(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => {
            let template = |v: &Value| v.get("template")?.as_str().map(str::to_owned);
            named
                .iter()
                .find(|v| v.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| named.first())
                .and_then(template)
        }
        _ => None,
    }
}

/// A special token's text: a string, or an `AddedToken` object's `content`.
fn token_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_jinja_file_wins_over_the_config_and_named_templates_pick_default() {
        let config = json!({"chat_template": "from config", "bos_token": {"content": "<s>"}, "eos_token": "</s>"});
        let f = ModelFiles::from_parts(vec![], Some(&config), Some("from file".into()));
        assert_eq!(f.chat_template.as_deref(), Some("from file"));
        assert_eq!(
            f.special_tokens,
            [
                ("bos_token".to_string(), "<s>".to_string()),
                ("eos_token".into(), "</s>".into())
            ]
        );
        let f = ModelFiles::from_parts(vec![], Some(&config), None);
        assert_eq!(f.chat_template.as_deref(), Some("from config"));
        let named = json!({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]});
        let f = ModelFiles::from_parts(vec![], Some(&named), None);
        assert_eq!(f.chat_template.as_deref(), Some("d"));
    }
}
