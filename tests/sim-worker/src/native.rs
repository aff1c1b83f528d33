//! SGLang's native endpoints: health, server and model info, load,
//! `/generate`, and `/v1/rerank`.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::future::join_all;
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};

use crate::engine::RankLoad;
use crate::error::ApiError;
use crate::record::RecordId;
use crate::request::{self, field, parse_object, per_item};
use crate::sse;
use crate::state::AppState;
use crate::tokens::{generated_text, generated_token, tokenize, Token};

/// Version reported by the info endpoints.
pub const VERSION: &str = "0.0.0-sim";

/// `GET /health` and `GET /health_generate`: 200, or 503 when switched off.
pub async fn health(State(state): State<AppState>) -> StatusCode {
    if state.control.get().healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// `GET /get_server_info` and `GET /server_info`.
pub async fn server_info(State(state): State<AppState>) -> Json<Value> {
    let c = &state.config;
    let switches = state.control.get();
    Json(json!({
        "model_path": c.model_path,
        "tokenizer_path": c.model_path,
        "served_model_name": c.model_path,
        "dp_size": c.dp_size,
        "tp_size": 1,
        "port": c.port,
        "host": c.host,
        "version": VERSION,
        "disaggregation_mode": "null",
        "max_total_num_tokens": c.cache_tokens,
        "max_running_prefills": c.max_running_prefills,
        "prefill_us_per_token": switches.prefill_us_per_token,
        "decode_us_per_token": switches.decode_us_per_token,
    }))
}

/// `GET /get_model_info`.
pub async fn model_info(State(state): State<AppState>) -> Json<Value> {
    let c = &state.config;
    Json(json!({
        "model_path": c.model_path,
        "tokenizer_path": c.model_path,
        "is_generation": true,
    }))
}

/// `GET /get_load`: one entry per DP rank.
pub async fn load(State(state): State<AppState>) -> Json<Vec<RankLoad>> {
    Json(state.engine.loads())
}

/// One sequence of a `/generate` request.
struct GenItem {
    tokens: Vec<Token>,
    rid: String,
    max_new: usize,
}

/// The `/generate` answer object for a sequence after `done` tokens.
#[allow(clippy::too_many_arguments)]
fn generate_object(
    rid: &str,
    text: &str,
    prompt_tokens: usize,
    cached_tokens: usize,
    done: usize,
    finished: bool,
    started: Instant,
    index: Option<usize>,
) -> Value {
    let finish_reason = if finished {
        json!({"type": "length", "length": done})
    } else {
        Value::Null
    };
    let mut v = json!({
        "text": text,
        "meta_info": {
            "id": rid,
            "finish_reason": finish_reason,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": done,
            "cached_tokens": cached_tokens,
            "e2e_latency": started.elapsed().as_secs_f64(),
        },
    });
    if let (Some(i), Some(obj)) = (index, v.as_object_mut()) {
        obj.insert("index".into(), json!(i));
    }
    v
}

/// `POST /generate`: `text` or `input_ids` (single or batch),
/// `sampling_params.max_new_tokens`, `stream`, `rid`, `data_parallel_rank`.
pub async fn generate(
    State(state): State<AppState>,
    record: Option<Extension<RecordId>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let in_flight = state.begin("/generate")?;
    let record = record.map(|Extension(id)| id);
    let body = parse_object(&body)?;
    let (prompts, batch) = if let Some(text) = field(&body, "text") {
        request::prompts("text", text)?
    } else if let Some(ids) = field(&body, "input_ids") {
        request::prompts("input_ids", ids)?
    } else {
        return Err(ApiError::bad("either text or input_ids is required"));
    };
    let stream = request::opt_bool(&body, "stream")?.unwrap_or(false);
    let rank = request::dp_rank(&body)?;
    let mut items = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.iter().enumerate() {
        let rid = match per_item(body.get("rid"), i) {
            None => request::random_id(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(ApiError::bad("rid must be a string or a list of strings")),
        };
        let max_new = match per_item(body.get("sampling_params"), i) {
            None => state.config.default_max_tokens,
            Some(Value::Object(sp)) => {
                request::max_tokens(sp, &["max_new_tokens"], state.config.default_max_tokens)?
            }
            Some(_) => return Err(ApiError::bad("sampling_params must be an object")),
        };
        items.push(GenItem {
            tokens: prompt.tokens(),
            rid,
            max_new,
        });
    }
    state.control.wait_unstalled().await;

    if !stream {
        let outs = join_all(items.iter().enumerate().map(|(i, it)| {
            let state = &state;
            async move {
                let p = state.prefill(record, rank, &it.tokens, it.max_new).await;
                let (prompt_tokens, cached) = (p.prompt_tokens, p.cached_tokens);
                p.decode(it.max_new).await;
                let index = batch.then_some(i);
                let text = generated_text(it.max_new);
                generate_object(
                    &it.rid,
                    &text,
                    prompt_tokens,
                    cached,
                    it.max_new,
                    true,
                    started,
                    index,
                )
            }
        }))
        .await;
        drop(in_flight);
        let answer = if batch {
            Value::Array(outs)
        } else {
            outs.into_iter().next().unwrap_or(Value::Null)
        };
        return Ok(Json(answer).into_response());
    }

    let streams = items.into_iter().enumerate().map(|(i, it)| {
        let state = state.clone();
        let index = batch.then_some(i);
        stream::once(async move {
            let p = state.prefill(record, rank, &it.tokens, it.max_new).await;
            (p, it)
        })
        .flat_map(move |(p, it)| {
            let (prompt_tokens, cached) = (p.prompt_tokens, p.cached_tokens);
            let n = it.max_new;
            let rid = it.rid;
            let mut text = String::new();
            let object = move |text: &str, done: usize| {
                sse::event(&generate_object(
                    &rid,
                    text,
                    prompt_tokens,
                    cached,
                    done,
                    done == n,
                    started,
                    index,
                ))
            };
            let nothing_to_generate = (n == 0).then(|| object("", 0));
            let object_for_tokens = object.clone();
            p.decode_stream(n)
                .map(move |i| {
                    text.push_str(&generated_token(i));
                    object_for_tokens(&text, i + 1)
                })
                .chain(stream::iter(nothing_to_generate))
        })
    });
    let events = stream::select_all(streams.map(StreamExt::boxed))
        .chain(stream::once(async { sse::done() }));
    Ok(sse::response(events, in_flight))
}

/// Deterministic relevance of `doc` to `query`: the share of query words
/// found in the document, plus a tiny hash-based tie-breaker.
fn rerank_score(query: &str, doc: &str) -> f64 {
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect()
    };
    let q = words(query);
    let d = words(doc);
    let overlap = if q.is_empty() {
        0.0
    } else {
        q.iter().filter(|w| d.contains(w)).count() as f64 / q.len() as f64
    };
    let tie = crate::cache::prefix_hashes(&tokenize(doc))
        .last()
        .map_or(0.0, |h| (h % 1000) as f64 / 1e6);
    overlap * 0.99 + tie
}

/// `POST /v1/rerank`: `{"query":..,"documents":[..]}` -> documents with
/// scores, best first.
pub async fn rerank(
    State(state): State<AppState>,
    record: Option<Extension<RecordId>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let _in_flight = state.begin("/v1/rerank")?;
    let record = record.map(|Extension(id)| id);
    let body = parse_object(&body)?;
    let query = request::opt_str(&body, "query")?
        .ok_or_else(|| ApiError::bad("query is required"))?
        .to_string();
    let documents = field(&body, "documents")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("documents is required and must be a list of strings"))?;
    let documents = documents
        .iter()
        .map(|d| d.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ApiError::bad("documents must be a list of strings"))?;
    let rank = request::dp_rank(&body)?;
    state.control.wait_unstalled().await;

    let query_tokens = tokenize(&query);
    let prompt_tokens = join_all(documents.iter().map(|doc| {
        let state = &state;
        let mut tokens = query_tokens.clone();
        tokens.extend(tokenize(doc));
        async move { state.prefill(record, rank, &tokens, 0).await.prompt_tokens }
    }))
    .await;
    let latency = started.elapsed().as_secs_f64();
    let mut results: Vec<(f64, usize)> = documents
        .iter()
        .enumerate()
        .map(|(i, doc)| (rerank_score(&query, doc), i))
        .collect();
    results.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let answer: Vec<Value> = results
        .into_iter()
        .map(|(score, i)| {
            json!({
                "score": score,
                "document": documents[i],
                "index": i,
                "meta_info": {
                    "prompt_tokens": prompt_tokens[i],
                    "completion_tokens": 0,
                    "e2e_latency": latency,
                },
            })
        })
        .collect();
    Ok(Json(answer).into_response())
}
