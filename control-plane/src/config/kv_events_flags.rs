//! Where the KV-event subscriber finds each worker's publisher, beyond what
//! the worker advertises (SGLang's `--kv-events-config` keys), and its off
//! switch. docs/kv-events.md says what they do.

use std::path::{Path, PathBuf};

use clap::Args;
use sglang_envoy_prompt::{ModelFiles, PromptError, PromptTokenizer};

use crate::kv_events::{KvEventsOptions, Overrides};

/// How `--tokenizer-path` and `--model-path` differ from the peers'.
pub const TOKENIZER_DIR: &str = "a local directory with the model's tokenizer files, read to route on the exact prefix each worker's KV events say it holds (docs/kv-events.md); a Hugging Face model id is refused at start (download the files first)";

/// How `--chat-template` differs from the peers'.
pub const CHAT_TEMPLATE_FILE: &str = "a .jinja file only (SGLang's built-in template names are refused), used instead of the model's own to tokenize chat requests for KV-event routing";

/// The KV-event subscriber's flags.
#[derive(Debug, Clone, Args)]
pub struct KvEventsFlags {
    /// Do not subscribe to any worker's KV cache events (docs/kv-events.md).
    #[arg(long)]
    pub disable_kv_events: bool,
    /// TCP port of every worker's KV-event PUB socket for DP rank 0 (rank r
    /// publishes on this + r), overriding `endpoint_port_base` of the
    /// `kv_events` object SGLang advertises in `/server_info`; with it,
    /// workers that advertise nothing are subscribed too, at their URL's
    /// host. SGLang's `--kv-events-config` key: `endpoint`.
    #[arg(long, value_name = "PORT")]
    pub kv_events_endpoint_port: Option<u16>,
    /// TCP port of every worker's replay ROUTER for DP rank 0 (rank r adds
    /// r), overriding the advertised `replay_endpoint_port_base`; asked for
    /// missed batches when a sequence gap shows. SGLang's key:
    /// `replay_endpoint`.
    #[arg(long, value_name = "PORT")]
    pub kv_events_replay_endpoint_port: Option<u16>,
    /// ZMQ topic to subscribe to (a prefix of the publisher's topic),
    /// overriding the advertised `topic`. SGLang's key: `topic`.
    #[arg(long, value_name = "TOPIC")]
    pub kv_events_topic: Option<String>,
    /// The model's tokenizer files: a directory with `tokenizer.json`, and
    /// `tokenizer_config.json` or `chat_template.jinja` for chat. With it,
    /// requests are tokenized as the workers tokenize them and routed on
    /// the exact prefix each worker's KV events say it holds
    /// (docs/kv-events.md). sglang-router's flag; here a local directory
    /// (download a Hugging Face model's files first).
    #[arg(long, value_name = "DIR")]
    pub tokenizer_path: Option<PathBuf>,
    /// The model's directory, read for its tokenizer files when
    /// `--tokenizer-path` is not given (sglang-router's flag; a local
    /// directory).
    #[arg(long, value_name = "DIR")]
    pub model_path: Option<PathBuf>,
    /// A Jinja chat template file (`.jinja`) used instead of the model's,
    /// as the workers' own `--chat-template FILE.jinja` must be.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
}

impl KvEventsFlags {
    /// The model's tokenizer, from `--tokenizer-path` (else
    /// `--model-path`) and `--chat-template`; `None` when neither
    /// directory is given.
    pub fn tokenizer(&self) -> Result<Option<PromptTokenizer>, PromptError> {
        let Some(dir) = self.tokenizer_path.as_ref().or(self.model_path.as_ref()) else {
            if self.chat_template.is_some() {
                return Err(PromptError::Files(
                    "--chat-template needs --tokenizer-path or --model-path".into(),
                ));
            }
            return Ok(None);
        };
        if !dir.is_dir() {
            return Err(PromptError::Files(format!(
                "{} is not a local directory (a Hugging Face model id is not downloaded here: fetch the model's tokenizer files first)",
                dir.display()
            )));
        }
        let mut files = ModelFiles::read(dir)?;
        if let Some(path) = &self.chat_template {
            files.chat_template = Some(read_template(path)?);
        }
        PromptTokenizer::from_files(files).map(Some)
    }

    /// How the KV-event subscriber runs; `None` with `--disable-kv-events`.
    pub fn options(&self) -> Option<KvEventsOptions> {
        (!self.disable_kv_events).then(|| KvEventsOptions {
            overrides: Overrides {
                endpoint_port: self.kv_events_endpoint_port,
                replay_endpoint_port: self.kv_events_replay_endpoint_port,
                topic: self.kv_events_topic.clone(),
            },
            ..KvEventsOptions::default()
        })
    }
}

/// A `--chat-template` file as SGLang loads one: newlines trimmed at both
/// ends and each literal backslash-n read as a newline.
fn read_template(path: &Path) -> Result<String, PromptError> {
    if path.extension().and_then(|e| e.to_str()) != Some("jinja") {
        return Err(PromptError::Files(format!(
            "--chat-template {}: only .jinja files are read (SGLang's built-in template names are not)",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| PromptError::Files(format!("--chat-template {}: {e}", path.display())))?;
    Ok(text.trim_matches('\n').replace("\\n", "\n"))
}
