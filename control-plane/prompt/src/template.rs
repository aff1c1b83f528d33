//! A chat template rendered as transformers renders it: Jinja with
//! `trim_blocks` and `lstrip_blocks`, loop controls, no trailing newline
//! kept, Python's string and dict methods (`.strip()`, `.items()` ...),
//! `tojson` as Python's `json.dumps`, and the globals `raise_exception` and
//! `strftime_now`.

use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};

use crate::chat::{ChatInput, ContentFormat};
use crate::PromptError;

const NAME: &str = "chat";

/// A model's chat template, compiled.
pub struct ChatTemplate {
    env: Environment<'static>,
    format: ContentFormat,
    special_tokens: Vec<(String, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `special_tokens` (`bos_token` ...) are passed to
    /// every rendering, as HF does.
    pub fn new(source: String, special_tokens: Vec<(String, String)>) -> Result<Self, PromptError> {
        let format = ContentFormat::of_template(&source);
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", crate::tojson::filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source)
            .map_err(|e| PromptError::Files(format!("chat template: {e}")))?;
        Ok(ChatTemplate {
            env,
            format,
            special_tokens,
        })
    }

    /// How the template reads message content.
    pub fn content_format(&self) -> ContentFormat {
        self.format
    }

    /// The prompt text of a chat, with the generation prompt added.
    pub fn render(&self, input: &ChatInput) -> Result<String, PromptError> {
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), input.messages.clone()),
            (
                "tools".into(),
                input.tools.clone().unwrap_or(Value::from(())),
            ),
            ("documents".into(), Value::from(())),
            ("add_generation_prompt".into(), Value::from(true)),
        ];
        ctx.extend(
            self.special_tokens
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(v.as_str()))),
        );
        // The request's template arguments override everything above.
        for (k, v) in &input.kwargs {
            match ctx.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = v.clone(),
                None => ctx.push((k.clone(), v.clone())),
            }
        }
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| PromptError::Template(e.to_string()))?;
        template
            .render(Value::from_iter(ctx))
            .map_err(|e| PromptError::Template(e.to_string()))
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// The local time formatted with Python's `strftime` codes (the worker's
/// clock renders the same date except around midnight).
fn strftime_now(format: String) -> Result<Value, Error> {
    let now = jiff::Zoned::now();
    let mut out = String::new();
    jiff::fmt::strtime::format(format.as_bytes(), &now)
        .map(|s| out = s)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from(out))
}
