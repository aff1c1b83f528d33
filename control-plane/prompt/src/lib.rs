//! A request's prompt tokens as an SGLang worker computes them, so that a
//! router can hash them into the same KV-cache blocks the worker publishes
//! (see `sglang-envoy-kv-events`).
//!
//! What SGLang 0.5.23 does, and so what this crate does:
//! * **chat** (`/v1/chat/completions`): the messages are normalised
//!   ([`chat`]), rendered with the model's Jinja chat template and
//!   `add_generation_prompt=True` ([`template`]), and the text is encoded
//!   *without* the tokenizer's special tokens (BOS comes from the template);
//! * **text** (`/v1/completions` `prompt`, `/generate` `text`): encoded
//!   *with* the tokenizer's special tokens (its post-processor's BOS);
//! * **token ids** (`input_ids`, a completions prompt of integers): as given.
//!
//! Anything whose tokens a router cannot know (images, batches, a
//! continued final message, a template that fails) is
//! [`PromptError::Unpredictable`]: the caller routes that request on its
//! approximate tree instead.
//!
//! The model's files are read once at start ([`files`]); [`fixture`] writes
//! a small but real set of them for tests (nothing is downloaded).

pub mod chat;
pub mod files;
pub mod fixture;
pub mod template;
mod tojson;

use std::path::Path;

use minijinja::value::{Value, ValueKind};
use tokenizers::Tokenizer;

pub use files::ModelFiles;
pub use template::ChatTemplate;

/// Why a prompt's tokens could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The model's files are missing or unreadable (at start only).
    #[error("model files: {0}")]
    Files(String),
    /// The request is valid but its tokens depend on what a router cannot
    /// reproduce (multimodal input, several prompts, ...).
    #[error("prompt not predictable: {0}")]
    Unpredictable(&'static str),
    /// The body is not a request this crate reads.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// A request's prompt, as the worker's tokenizer manager receives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Rendered chat: encoded without special tokens.
    Chat(String),
    /// Plain text: encoded with special tokens.
    Text(String),
    /// Token ids given by the client.
    Ids(Vec<u32>),
}

/// A prompt's tokens and the cache namespace they are stored under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptTokens {
    /// The token ids, as the worker's radix cache keys them.
    pub ids: Vec<u32>,
    /// The request's `cache_salt`, which seeds SGLang's page hash chain.
    pub cache_salt: Option<String>,
    /// The request names a LoRA adapter (`lora_path`): SGLang publishes
    /// its blocks under a namespace derived from the adapter's id, which a
    /// router cannot compute.
    pub lora: bool,
}

/// A model's tokenizer and chat template.
pub struct PromptTokenizer {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
}

impl std::fmt::Debug for PromptTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptTokenizer")
            .field("vocab", &self.tokenizer.get_vocab_size(true))
            .field("template", &self.template.is_some())
            .finish()
    }
}

impl PromptTokenizer {
    /// Loads `tokenizer.json` and the chat template from a model directory
    /// (sglang-router's `--tokenizer-path` / `--model-path`).
    pub fn from_dir(dir: &Path) -> Result<Self, PromptError> {
        Self::from_files(ModelFiles::read(dir)?)
    }

    /// Builds from files already read.
    pub fn from_files(files: ModelFiles) -> Result<Self, PromptError> {
        let tokenizer = Tokenizer::from_bytes(&files.tokenizer_json)
            .map_err(|e| PromptError::Files(format!("tokenizer.json: {e}")))?;
        let template = match files.chat_template {
            Some(source) => Some(ChatTemplate::new(source, files.special_tokens)?),
            None => None,
        };
        Ok(PromptTokenizer {
            tokenizer,
            template,
        })
    }

    /// True when chat requests can be rendered (the model has a template).
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// The prompt of a request to `path` with JSON `body` (parsed into
    /// Jinja values, which keep the client's key order for `tojson`).
    pub fn prompt(&self, path: &str, body: &Value) -> Result<Prompt, PromptError> {
        if let Some(ids) = token_ids(field(body, "input_ids").as_ref())? {
            return Ok(Prompt::Ids(ids));
        }
        match path {
            "/v1/chat/completions" => {
                let template = self
                    .template
                    .as_ref()
                    .ok_or(PromptError::Unpredictable("the model has no chat template"))?;
                let input = chat::ChatInput::from_body(body, template.content_format())?;
                Ok(Prompt::Chat(template.render(&input)?))
            }
            "/v1/completions" => match field(body, "prompt") {
                Some(p) if p.as_str().is_some() => Ok(Prompt::Text(p.to_string())),
                p => token_ids(p.as_ref())?
                    .map(Prompt::Ids)
                    .ok_or_else(|| PromptError::Invalid("no prompt".into())),
            },
            "/generate" => match field(body, "text") {
                Some(t) if t.as_str().is_some() => Ok(Prompt::Text(t.to_string())),
                Some(_) => Err(PromptError::Unpredictable("several prompts")),
                None => Err(PromptError::Invalid("no text or input_ids".into())),
            },
            _ => Err(PromptError::Unpredictable("no prompt on this route")),
        }
    }

    /// The token ids of a prompt.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>, PromptError> {
        let (text, special) = match prompt {
            Prompt::Ids(ids) => return Ok(ids.clone()),
            Prompt::Chat(text) => (text, false),
            Prompt::Text(text) => (text, true),
        };
        self.tokenizer
            .encode_fast(text.as_str(), special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| PromptError::Tokenizer(e.to_string()))
    }

    /// The tokens of a request to `path` with the raw JSON `body`.
    pub fn tokens(&self, path: &str, body: &[u8]) -> Result<PromptTokens, PromptError> {
        // serde_json refuses nesting past 128 levels, so no client body
        // recurses deeper than that here or in the template.
        let body: Value =
            serde_json::from_slice(body).map_err(|e| PromptError::Invalid(e.to_string()))?;
        if body.kind() != ValueKind::Map {
            return Err(PromptError::Invalid("the body is not a JSON object".into()));
        }
        let prompt = self.prompt(path, &body)?;
        Ok(PromptTokens {
            ids: self.encode(&prompt)?,
            cache_salt: field(&body, "cache_salt")
                .and_then(|s| s.as_str().filter(|s| !s.is_empty()).map(str::to_owned)),
            lora: field(&body, "lora_path").is_some(),
        })
    }
}

/// `v[name]`, or None when absent or null.
pub(crate) fn field(v: &Value, name: &str) -> Option<Value> {
    v.get_attr(name)
        .ok()
        .filter(|x| !x.is_undefined() && !x.is_none())
}

/// A list of token ids (`[1, 2, 3]`); `None` when absent; an error for a
/// list of lists (several prompts) or anything else.
fn token_ids(v: Option<&Value>) -> Result<Option<Vec<u32>>, PromptError> {
    let Some(v) = v else {
        return Ok(None);
    };
    if v.kind() != ValueKind::Seq {
        return Err(PromptError::Unpredictable("prompt is not text or ids"));
    }
    let items = v
        .try_iter()
        .map_err(|_| PromptError::Unpredictable("prompt is not text or ids"))?;
    items
        .map(|x| {
            x.as_i64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or(PromptError::Unpredictable("not a list of token ids"))
        })
        .collect::<Result<Vec<u32>, _>>()
        .map(Some)
}

#[cfg(test)]
mod tests;
