//! The OpenAI-compatible endpoints: `/v1/models`, `/v1/chat/completions`,
//! `/v1/completions` and `/v1/embeddings`, with the response and stream
//! chunk shapes the official `openai` client parses.

use std::ops::Range;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::future::{join_all, ready, try_join_all};
use futures::stream::{self, StreamExt};
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::disagg::Handoff;
use crate::error::ApiError;
use crate::record::RecordId;
use crate::request::{self, field, parse_object};
use crate::sse;
use crate::state::AppState;
use crate::tokens::{self, generated_text, generated_token, generated_token_id, logprob, Token};
use crate::wire::Ranks;

/// Context length reported by `/v1/models`.
const MAX_MODEL_LEN: u64 = 32768;

/// Numbers in the embeddings the simulator returns.
const EMBEDDING_DIM: usize = 8;

/// `GET /v1/models`.
pub async fn models(State(state): State<AppState>) -> Json<Value> {
    let model = &state.config.model_path;
    Json(json!({
        "object": "list",
        "data": [{
            "id": model,
            "object": "model",
            "created": request::unix_secs(),
            "owned_by": "sglang",
            "root": model,
            "max_model_len": MAX_MODEL_LEN,
        }],
    }))
}

/// OpenAI `usage`. SGLang reports cache hits there only with
/// `--enable-cache-report` (`prompt_tokens_details` is null otherwise; with
/// it, 0.5.23 reports `cached_tokens` even when 0, `usage_processor.py`).
fn usage(
    cache_report: bool,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
) -> Value {
    let details = if cache_report {
        json!({"cached_tokens": cached_tokens})
    } else {
        Value::Null
    };
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": details,
    })
}

/// The logprob of generated token `i` of a sequence with `prompt_tokens`
/// prompt tokens: the same number `/generate` reports for it.
fn token_logprob(prompt_tokens: usize, i: usize) -> f64 {
    logprob(generated_token_id(i), prompt_tokens + i)
}

/// A chat choice's `logprobs` for generated tokens `range`, or `null` when
/// not asked.
fn chat_logprobs(asked: bool, prompt_tokens: usize, range: Range<usize>) -> Value {
    if !asked {
        return Value::Null;
    }
    let content: Vec<Value> = range
        .map(|i| {
            let token = generated_token(i);
            json!({
                "token": token,
                "logprob": token_logprob(prompt_tokens, i),
                "bytes": token.as_bytes(),
                "top_logprobs": [],
            })
        })
        .collect();
    json!({ "content": content })
}

/// A completion choice's `logprobs` for generated tokens `range`, or `null`
/// when not asked.
fn completion_logprobs(asked: bool, prompt_tokens: usize, range: Range<usize>) -> Value {
    if !asked {
        return Value::Null;
    }
    let mut offset = generated_text(range.start).len();
    let (mut tokens, mut logprobs, mut offsets) = (vec![], vec![], vec![]);
    for i in range {
        let token = generated_token(i);
        offsets.push(offset);
        offset += token.len();
        logprobs.push(token_logprob(prompt_tokens, i));
        tokens.push(token);
    }
    let top: Vec<Value> = tokens.iter().map(|_| json!({})).collect();
    json!({
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

/// What chat and completions requests share once parsed.
struct Generation {
    id: String,
    created: u64,
    model: String,
    /// Tokens to generate here (see [`AppState::to_generate`]).
    max_new: usize,
    stream: bool,
    include_usage: bool,
    /// `logprobs` asked (chat: `true`; completions: a number).
    logprobs: bool,
    ranks: Ranks,
    /// `--enable-cache-report`.
    cache_report: bool,
}

impl Generation {
    fn parse(body: &request::Body, state: &AppState, id_prefix: &str) -> Result<Self, ApiError> {
        let include_usage = match field(body, "stream_options") {
            None => false,
            Some(Value::Object(o)) => o
                .get("include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            Some(_) => return Err(ApiError::bad("stream_options must be an object")),
        };
        Ok(Generation {
            id: match request::opt_str(body, "rid")? {
                Some(rid) => rid.to_string(),
                None => format!("{id_prefix}{}", request::random_id()),
            },
            created: request::unix_secs(),
            model: request::model(body, &state.config.model_path),
            max_new: state.to_generate(request::max_tokens(
                body,
                &["max_completion_tokens", "max_tokens"],
                state.config.default_max_tokens,
                state.config.context_length,
            )?),
            stream: request::opt_bool(body, "stream")?.unwrap_or(false),
            include_usage,
            logprobs: match field(body, "logprobs") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(v) if v.is_u64() => true,
                Some(_) => {
                    return Err(ApiError::bad(
                        "logprobs must be a boolean (chat) or a non-negative integer (completions)",
                    ))
                }
            },
            ranks: state.ranks(body)?,
            cache_report: state.config.enable_cache_report,
        })
    }

    /// A stream chunk with `choices`.
    fn chunk(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The usage-only chunk sent last when `stream_options.include_usage`.
    fn usage_chunk(&self, object: &str, usage: Value) -> Value {
        let mut v = self.chunk(object, json!([]));
        if let Some(o) = v.as_object_mut() {
            o.insert("usage".into(), usage);
        }
        v
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(state): State<AppState>,
    record: Option<Extension<RecordId>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let in_flight = state.begin("/v1/chat/completions")?;
    let record = record.map(|Extension(id)| id);
    let raw = body;
    let body = parse_object(&raw)?;
    let messages = field(&body, "messages").ok_or_else(|| ApiError::bad("messages is required"))?;
    let prompt = match state.file_tokens("/v1/chat/completions", &raw) {
        Some(tokens) => tokens,
        None => tokens::tokenize(&tokens::render_chat(messages)?),
    };
    let g = Generation::parse(&body, &state, "chatcmpl-")?;
    let handoff = state
        .handoffs(&body, 1, false)?
        .pop()
        .unwrap_or(Handoff::Local);
    state.control.wait_unstalled().await;

    if !g.stream {
        let p = state
            .start_sequence(record, &handoff, &g.ranks, &g.id, &prompt, g.max_new)
            .await?;
        let (prompt_tokens, cached) = (p.prompt_tokens, p.cached_tokens);
        p.decode(g.max_new).await;
        let answer = json!({
            "id": g.id,
            "object": "chat.completion",
            "created": g.created,
            "model": g.model,
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": generated_text(g.max_new),
                    "reasoning_content": null,
                    "tool_calls": null,
                },
                "logprobs": chat_logprobs(g.logprobs, prompt_tokens, 0..g.max_new),
                "finish_reason": "length",
                "matched_stop": null,
            }],
            "usage": usage(g.cache_report, prompt_tokens, g.max_new, cached),
        });
        return Ok(Json(answer).into_response());
    }

    const CHUNK: &str = "chat.completion.chunk";
    let choice = |delta: Value, logprobs: Value, finish: Option<&str>| json!([{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]);
    let events = stream::once(async move {
        let p = state
            .start_sequence(record, &handoff, &g.ranks, &g.id, &prompt, g.max_new)
            .await;
        (p, g)
    })
    .flat_map(move |(p, g)| {
        let p = match p {
            Ok(p) => p,
            Err(e) => return stream::once(ready(Err(e))).boxed(),
        };
        let (prompt_tokens, cached) = (p.prompt_tokens, p.cached_tokens);
        // The role comes with the first output, as SGLang sends it.
        let head = sse::event(&g.chunk(
            CHUNK,
            choice(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
                None,
            ),
        ));
        let mut tail = vec![sse::event(
            &g.chunk(CHUNK, choice(json!({}), Value::Null, Some("length"))),
        )];
        if g.include_usage {
            tail.push(sse::event(&g.usage_chunk(
                CHUNK,
                usage(g.cache_report, prompt_tokens, g.max_new, cached),
            )));
        }
        let tokens = p.decode_stream(g.max_new).map(move |i| {
            sse::event(&g.chunk(
                CHUNK,
                choice(
                    json!({"content": generated_token(i)}),
                    chat_logprobs(g.logprobs, prompt_tokens, i..i + 1),
                    None,
                ),
            ))
        });
        stream::once(async { head })
            .chain(tokens)
            .chain(stream::iter(tail))
            .map(Ok)
            .boxed()
    })
    .chain(stream::once(async { Ok(sse::done()) }));
    Ok(sse::response(sse::until_error(events), in_flight))
}

/// `POST /v1/completions`: `prompt` is a string, token ids, or a batch.
pub async fn completions(
    State(state): State<AppState>,
    record: Option<Extension<RecordId>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let in_flight = state.begin("/v1/completions")?;
    let record = record.map(|Extension(id)| id);
    let raw = body;
    let body = parse_object(&raw)?;
    let prompt = field(&body, "prompt").ok_or_else(|| ApiError::bad("prompt is required"))?;
    let (prompts, batch) = request::prompts("prompt", prompt)?;
    let prompts: Vec<Vec<Token>> = match state.file_tokens("/v1/completions", &raw) {
        Some(tokens) if !batch => vec![tokens],
        _ => prompts.iter().map(tokens::Prompt::tokens).collect(),
    };
    let g = Generation::parse(&body, &state, "cmpl-")?;
    let handoffs = state.handoffs(&body, prompts.len(), batch)?;
    state.control.wait_unstalled().await;

    const OBJECT: &str = "text_completion";
    if !g.stream {
        // The first failure ends the request (and withdraws the others).
        let done = try_join_all(prompts.iter().zip(&handoffs).map(|(tokens, handoff)| {
            let state = &state;
            let g = &g;
            async move {
                let p = state
                    .start_sequence(record, handoff, &g.ranks, &g.id, tokens, g.max_new)
                    .await?;
                let counts = (p.prompt_tokens, p.cached_tokens);
                p.decode(g.max_new).await;
                Ok::<_, ApiError>(counts)
            }
        }))
        .await?;
        let choices: Vec<Value> = done
            .iter()
            .enumerate()
            .map(|(i, &(prompt_tokens, _))| {
                json!({
                    "index": i,
                    "text": generated_text(g.max_new),
                    "logprobs": completion_logprobs(g.logprobs, prompt_tokens, 0..g.max_new),
                    "finish_reason": "length",
                    "matched_stop": null,
                })
            })
            .collect();
        let prompt_tokens = done.iter().map(|d| d.0).sum();
        let cached = done.iter().map(|d| d.1).sum();
        let mut answer = g.chunk(OBJECT, Value::Array(choices));
        if let Some(o) = answer.as_object_mut() {
            o.insert(
                "usage".into(),
                usage(
                    g.cache_report,
                    prompt_tokens,
                    g.max_new * done.len(),
                    cached,
                ),
            );
        }
        return Ok(Json(answer).into_response());
    }

    let g = Arc::new(g);
    let n_prompts = prompts.len();
    // Usage of all prompts, reported once every prompt has finished.
    let totals = Arc::new(Mutex::new((0usize, 0usize)));
    let choice = |index: usize, text: String, logprobs: Value, finish: Option<&str>| json!([{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]);
    let per_prompt =
        prompts
            .into_iter()
            .zip(handoffs)
            .enumerate()
            .map(|(index, (tokens, handoff))| {
                let state = state.clone();
                let g = Arc::clone(&g);
                let totals = Arc::clone(&totals);
                stream::once(async move {
                    let p = state
                        .start_sequence(record, &handoff, &g.ranks, &g.id, &tokens, g.max_new)
                        .await;
                    if let Ok(p) = &p {
                        let mut t = totals.lock();
                        t.0 += p.prompt_tokens;
                        t.1 += p.cached_tokens;
                    }
                    (p, g)
                })
                .flat_map(move |(p, g)| {
                    let p = match p {
                        Ok(p) => p,
                        Err(e) => return stream::once(ready(Err(e))).boxed(),
                    };
                    let last = sse::event(&g.chunk(
                        OBJECT,
                        choice(index, String::new(), Value::Null, Some("length")),
                    ));
                    let g2 = Arc::clone(&g);
                    let prompt_tokens = p.prompt_tokens;
                    p.decode_stream(g.max_new)
                        .map(move |i| {
                            let logprobs =
                                completion_logprobs(g2.logprobs, prompt_tokens, i..i + 1);
                            sse::event(
                                &g2.chunk(
                                    OBJECT,
                                    choice(index, generated_token(i), logprobs, None),
                                ),
                            )
                        })
                        .chain(stream::once(async move { last }))
                        .map(Ok)
                        .boxed()
                })
                .boxed()
            });
    // Collected so the closures above are done borrowing `g` and `totals`.
    let per_prompt: Vec<_> = per_prompt.collect();
    let usage_event = stream::once(async move {
        if !g.include_usage {
            return None;
        }
        let (prompt_tokens, cached) = *totals.lock();
        Some(sse::event(&g.usage_chunk(
            OBJECT,
            usage(g.cache_report, prompt_tokens, g.max_new * n_prompts, cached),
        )))
    })
    .filter_map(|e| async move { e.map(Ok) });
    let events = stream::select_all(per_prompt)
        .chain(usage_event)
        .chain(stream::once(async { Ok(sse::done()) }));
    Ok(sse::response(sse::until_error(events), in_flight))
}

/// A deterministic unit vector of [`EMBEDDING_DIM`] numbers for `tokens`.
fn embedding(tokens: &[Token]) -> Vec<f64> {
    let mut h = crate::cache::prefix_hashes(tokens)
        .last()
        .copied()
        .unwrap_or(0x0123_4567_89ab_cdef);
    let raw: Vec<f64> = (0..EMBEDDING_DIM)
        .map(|_| {
            // xorshift64: a fixed pseudo-random sequence seeded by the text.
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect();
    let norm = raw.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm > 0.0 {
        raw.iter().map(|x| x / norm).collect()
    } else {
        raw
    }
}

/// `POST /v1/embeddings`: `input` is a string, token ids, or a batch.
pub async fn embeddings(
    State(state): State<AppState>,
    record: Option<Extension<RecordId>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let _in_flight = state.begin("/v1/embeddings")?;
    let record = record.map(|Extension(id)| id);
    let body = parse_object(&body)?;
    let input = field(&body, "input").ok_or_else(|| ApiError::bad("input is required"))?;
    let (prompts, _batch) = request::prompts("input", input)?;
    let rank = state.ranks(&body)?.run;
    let model = request::model(&body, &state.config.model_path);
    state.control.wait_unstalled().await;

    let token_lists: Vec<Vec<Token>> = prompts.iter().map(tokens::Prompt::tokens).collect();
    let counts = join_all(token_lists.iter().map(|tokens| {
        let state = &state;
        async move { state.prefill(record, rank, tokens, 0).await.prompt_tokens }
    }))
    .await;
    let prompt_tokens: usize = counts.iter().sum();
    let data: Vec<Value> = token_lists
        .iter()
        .enumerate()
        .map(|(i, tokens)| json!({"object": "embedding", "embedding": embedding(tokens), "index": i}))
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }))
    .into_response())
}
