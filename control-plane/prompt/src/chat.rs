//! A chat request's messages, tools and template arguments as SGLang 0.5.23
//! hands them to the chat template (`serving_chat.py` `_process_messages`,
//! `parser/jinja_template_utils.py`), checked against that release's source:
//!
//! * a message's keys whose value is null are dropped, and a missing or
//!   null `content` becomes `""`;
//! * content given as parts: with a "string" template, the text parts are
//!   joined with one space; with an "openai" template (one that names media
//!   or loops over `message.content`), they stay a list of
//!   `{"type": "text", "text": ...}`; any media part makes the prompt
//!   unpredictable (the worker expands it into tokens of its own);
//! * an assistant tool call's `arguments` JSON string is parsed into a map,
//!   in the client's key order;
//! * a final assistant message is rendered as a user message, unless the
//!   client asked to continue it (then its text is tokenized apart:
//!   unpredictable here);
//! * tools go to the template only when there are some and `tool_choice`
//!   is not `"none"` (a named choice passes that tool alone), each dumped as
//!   pydantic does: the function's own keys in order, then `description`
//!   and `parameters` as null where absent, and `defer_loading: null`;
//! * `chat_template_kwargs` are passed through, and `reasoning_effort` sets
//!   `thinking` and `enable_thinking` unless they are given.

use minijinja::value::{Value, ValueKind};

use crate::{field, PromptError};

/// How a template reads message content (SGLang's
/// `detect_jinja_template_content_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// Content is a string: text parts joined with a space.
    String,
    /// Content is a list of typed parts.
    OpenAi,
}

impl ContentFormat {
    /// The format a template's source expects.
    pub fn of_template(source: &str) -> Self {
        const MEDIA: &[&str] = &["image", "audio", "video", "vision"];
        const LOOPS: &[&str] = &[
            "in message.content",
            "in message['content']",
            "in message[\"content\"]",
        ];
        if MEDIA.iter().chain(LOOPS).any(|s| source.contains(s)) {
            ContentFormat::OpenAi
        } else {
            ContentFormat::String
        }
    }
}

/// What a chat template is rendered with.
#[derive(Debug, Clone)]
pub struct ChatInput {
    /// The normalised messages.
    pub messages: Value,
    /// The tools, when the template gets them.
    pub tools: Option<Value>,
    /// Extra template arguments, in order (later ones win).
    pub kwargs: Vec<(String, Value)>,
}

fn invalid(msg: &str) -> PromptError {
    PromptError::Invalid(msg.to_string())
}

/// The entries of a map value, in order.
fn entries(v: &Value) -> Result<Vec<(String, Value)>, PromptError> {
    let keys = v.try_iter().map_err(|_| invalid("expected an object"))?;
    Ok(keys
        .filter_map(|k| {
            let name = k.as_str()?.to_string();
            let value = v.get_item(&k).ok()?;
            Some((name, value))
        })
        .collect())
}

fn items(v: &Value) -> Result<Vec<Value>, PromptError> {
    if v.kind() != ValueKind::Seq {
        return Err(invalid("expected a list"));
    }
    Ok(v.try_iter()
        .map_err(|_| invalid("expected a list"))?
        .collect())
}

fn map(pairs: Vec<(String, Value)>) -> Value {
    Value::from_iter(pairs)
}

impl ChatInput {
    /// Reads a chat completions body.
    pub fn from_body(body: &Value, format: ContentFormat) -> Result<Self, PromptError> {
        let list = field(body, "messages").ok_or_else(|| invalid("no messages"))?;
        let list = items(&list)?;
        if list.is_empty() {
            return Err(invalid("messages must not be empty"));
        }
        let continue_final = field(body, "continue_final_message").is_some_and(|v| v.is_true());
        let last = list.len() - 1;
        let mut messages = Vec::with_capacity(list.len());
        for (i, m) in list.iter().enumerate() {
            let mut msg = message(m, format)?;
            if i == last && role_of(&msg) == Some("assistant") {
                if continue_final {
                    return Err(PromptError::Unpredictable("continue_final_message"));
                }
                set(&mut msg, "role", Value::from("user"));
            }
            messages.push(map(msg));
        }
        Ok(ChatInput {
            messages: Value::from(messages),
            tools: tools(body)?,
            kwargs: kwargs(body)?,
        })
    }
}

fn role_of(msg: &[(String, Value)]) -> Option<&str> {
    msg.iter().find(|(k, _)| k == "role")?.1.as_str()
}

fn set(msg: &mut Vec<(String, Value)>, key: &str, value: Value) {
    match msg.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value,
        None => msg.push((key.to_string(), value)),
    }
}

/// One message, normalised.
fn message(m: &Value, format: ContentFormat) -> Result<Vec<(String, Value)>, PromptError> {
    if m.kind() != ValueKind::Map {
        return Err(invalid("a message must be an object"));
    }
    let mut out: Vec<(String, Value)> = entries(m)?
        .into_iter()
        .filter(|(k, v)| k == "content" || !v.is_none())
        .collect();
    let role = role_of(&out)
        .ok_or_else(|| invalid("a message needs a role"))?
        .to_string();
    let content = out
        .iter()
        .find(|(k, _)| k == "content")
        .map(|(_, v)| v.clone());
    let content = match content {
        None => Value::from(""),
        Some(c) if c.is_none() || c.is_undefined() => Value::from(""),
        Some(c) if c.kind() == ValueKind::Seq => {
            let texts = text_parts(&c)?;
            // Tool results are always flattened (`normalize_tool_content`).
            if format == ContentFormat::String || role == "tool" {
                Value::from(texts.join(" "))
            } else {
                Value::from(
                    texts
                        .into_iter()
                        .map(|t| {
                            map(vec![
                                ("type".into(), Value::from("text")),
                                ("text".into(), Value::from(t)),
                            ])
                        })
                        .collect::<Vec<_>>(),
                )
            }
        }
        Some(c) => c,
    };
    set(&mut out, "content", content);
    if let Some(calls) = out
        .iter()
        .find(|(k, _)| k == "tool_calls")
        .map(|(_, v)| v.clone())
    {
        let calls = items(&calls)?
            .iter()
            .map(tool_call)
            .collect::<Result<Vec<_>, _>>()?;
        set(&mut out, "tool_calls", Value::from(calls));
    }
    Ok(out)
}

/// The texts of content parts; media parts are unpredictable.
fn text_parts(parts: &Value) -> Result<Vec<String>, PromptError> {
    items(parts)?
        .iter()
        .map(
            |p| match field(p, "type").as_ref().and_then(Value::as_str) {
                Some("text") => field(p, "text")
                    .and_then(|t| t.as_str().map(str::to_owned))
                    .ok_or_else(|| invalid("a text part needs its text")),
                Some(_) => Err(PromptError::Unpredictable("multimodal content")),
                None => Err(invalid("a content part needs a type")),
            },
        )
        .collect()
}

/// An assistant tool call with its `arguments` string parsed.
fn tool_call(call: &Value) -> Result<Value, PromptError> {
    let mut out = entries(call)?;
    if let Some(slot) = out.iter_mut().find(|(k, _)| k == "function") {
        let mut function = entries(&slot.1)?;
        if let Some(args) = function.iter_mut().find(|(k, _)| k == "arguments") {
            if let Some(text) = args.1.as_str() {
                if let Ok(parsed) = serde_json::from_str::<Value>(text) {
                    args.1 = parsed;
                }
            }
        }
        slot.1 = map(function);
    }
    Ok(map(out))
}

/// The tools the template gets, dumped as pydantic does.
fn tools(body: &Value) -> Result<Option<Value>, PromptError> {
    let Some(list) = field(body, "tools") else {
        return Ok(None);
    };
    let list = items(&list)?;
    let choice = field(body, "tool_choice");
    if list.is_empty() || choice.as_ref().and_then(Value::as_str) == Some("none") {
        return Ok(None);
    }
    let named = choice
        .as_ref()
        .filter(|c| c.kind() == ValueKind::Map)
        .and_then(|c| field(c, "function"))
        .and_then(|f| field(&f, "name"))
        .and_then(|n| n.as_str().map(str::to_owned));
    let mut out = Vec::new();
    for t in &list {
        let function = field(t, "function").ok_or_else(|| invalid("a tool needs a function"))?;
        let name = field(&function, "name").and_then(|n| n.as_str().map(str::to_owned));
        if named.is_some() && name != named {
            continue;
        }
        let mut f: Vec<(String, Value)> = entries(&function)?
            .into_iter()
            .filter(|(k, v)| !(matches!(k.as_str(), "strict" | "defer_loading") && v.is_none()))
            .collect();
        for key in ["description", "parameters"] {
            if !f.iter().any(|(k, _)| k == key) {
                f.push((key.to_string(), Value::from(())));
            }
        }
        let kind = field(t, "type").unwrap_or_else(|| Value::from("function"));
        out.push(map(vec![
            ("type".into(), kind),
            ("function".into(), map(f)),
            ("defer_loading".into(), Value::from(())),
        ]));
    }
    Ok(Some(Value::from(out)))
}

/// `chat_template_kwargs`, then what `reasoning_effort` implies.
fn kwargs(body: &Value) -> Result<Vec<(String, Value)>, PromptError> {
    let mut out = match field(body, "chat_template_kwargs") {
        Some(k) if k.kind() == ValueKind::Map => entries(&k)?,
        Some(_) => return Err(invalid("chat_template_kwargs must be an object")),
        None => Vec::new(),
    };
    if let Some(effort) =
        field(body, "reasoning_effort").and_then(|e| e.as_str().map(str::to_owned))
    {
        let thinking = Value::from(effort != "none");
        for key in ["thinking", "enable_thinking"] {
            if !out.iter().any(|(k, _)| k == key) {
                out.push((key.to_string(), thinking.clone()));
            }
        }
    }
    Ok(out)
}
