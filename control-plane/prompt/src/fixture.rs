//! A small model's tokenizer files, made here so tests download nothing:
//! a byte-level BPE `tokenizer.json` in the format of GPT-2 / Qwen / Llama 3
//! (every byte a token, a few merges, the GPT-2 split regex with its
//! lookahead), special tokens `<s>`, `<|im_start|>` and `<|im_end|>`, a
//! post-processor that adds `<s>` to plain text, and a ChatML chat template
//! that renders tools with `tojson`.

use std::path::Path;

use serde_json::{json, Map, Value};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use crate::ModelFiles;

/// Merges, as `"left right"` pairs of byte-level symbols (`Ġ` is a space).
const MERGES: &[&str] = &[
    "Ġ t", "h e", "Ġt he", "i n", "e r", "Ġ a", "o n", "r e", "a t", "Ġ s", "e n", "o r",
];

/// The chat template (ChatML with a tools block).
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}\
{%- if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}\
{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}\
{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The special tokens, after the byte and merge tokens.
const SPECIAL: &[&str] = &["<s>", "<|im_start|>", "<|im_end|>"];

/// `tokenizer.json`.
pub fn tokenizer_json() -> Value {
    let mut symbols: Vec<String> = ByteLevel::alphabet()
        .into_iter()
        .map(String::from)
        .collect();
    symbols.sort();
    for m in MERGES {
        symbols.push(m.replace(' ', ""));
    }
    let vocab: Map<String, Value> = symbols
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), json!(i)))
        .collect();
    let first_special = symbols.len();
    let added: Vec<Value> = SPECIAL
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": first_special + i, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [first_special], "tokens": ["<s>"]}}
        },
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": MERGES
        }
    })
}

/// `tokenizer_config.json`.
pub fn tokenizer_config() -> Value {
    json!({
        "bos_token": {"content": "<s>", "special": true},
        "eos_token": "<|im_end|>",
        "chat_template": CHAT_TEMPLATE,
    })
}

/// The files, in memory.
pub fn model_files() -> ModelFiles {
    ModelFiles::from_parts(
        tokenizer_json().to_string().into_bytes(),
        Some(&tokenizer_config()),
        None,
    )
}

/// Writes `tokenizer.json` and `tokenizer_config.json` into `dir`.
pub fn write_model_files(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json().to_string())?;
    std::fs::write(
        dir.join("tokenizer_config.json"),
        tokenizer_config().to_string(),
    )
}
