//! SGLang's native endpoints: health, server and model info, load,
//! `/generate`, and `/v1/rerank`.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::future::{join_all, ready, try_join_all};
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};

use crate::disagg::{DisaggregationMode, Handoff};
use crate::error::ApiError;
use crate::record::RecordId;
use crate::request::{self, field, parse_object, per_item};
use crate::sse;
use crate::state::AppState;
use crate::tokens::{
    generated_text, generated_token, generated_token_id, logprob, token_id, tokenize, Token,
};

/// `GET /get_server_info` and `GET /server_info` (those `--info-routes`
/// serves): SGLang's server args (flattened), its version, and the
/// simulator's own settings.
pub async fn server_info(State(state): State<AppState>) -> Json<Value> {
    let c = &state.config;
    let switches = state.control.get();
    let mut info = json!({
        "model_path": c.model_path,
        "tokenizer_path": c.model_path,
        "served_model_name": c.model_path,
        "dp_size": c.dp_size,
        "tp_size": 1,
        "port": c.port,
        "host": c.host,
        "version": c.reported_version(),
        "load_balance_method": match c.disaggregation_mode {
            DisaggregationMode::Prefill => "follow_bootstrap_room",
            _ => "round_robin",
        },
        "enable_cache_report": c.enable_cache_report,
        "disaggregation_mode": c.disaggregation_mode.as_str(),
        "disaggregation_bootstrap_port": c.disaggregation_bootstrap_port,
        "disaggregation_timeout_ms": c.disaggregation_timeout_ms,
        "max_total_num_tokens": c.cache_tokens,
        "max_running_prefills": c.max_running_prefills,
        "prefill_us_per_token": switches.prefill_us_per_token,
        "decode_us_per_token": switches.decode_us_per_token,
    });
    // Only with KV events on, so that the answer is unchanged without them.
    // SGLang 0.5.23 reports the flag's JSON string as `kv_events_config`,
    // `page_size`, and the publisher descriptor as `kv_events`.
    if let (Some(kv), Some(obj)) = (&state.kv, info.as_object_mut()) {
        obj.insert("kv_events_config".into(), json!(kv.raw_config()));
        obj.insert("page_size".into(), json!(kv.page_size()));
        obj.insert("kv_events".into(), kv.descriptor());
    }
    Json(info)
}

/// `GET` or `POST /flush_cache` (both, as SGLang 0.5.23 routes it): empties
/// every rank's prefix cache (publishing `AllBlocksCleared` with KV events
/// on) and answers 200 with a text body; like SGLang, refuses with a 400
/// while requests are running or waiting. Its `timeout` query (how long
/// SGLang waits for them) is ignored.
pub async fn flush_cache(State(state): State<AppState>) -> Response {
    if state.engine.flush() {
        tracing::info!("prefix cache flushed");
        "Cache flushed.\n".into_response()
    } else {
        (
            axum::http::StatusCode::BAD_REQUEST,
            "Flush cache failed: requests are running or waiting.\n",
        )
            .into_response()
    }
}

/// `GET /get_model_info` and `GET /model_info`.
pub async fn model_info(State(state): State<AppState>) -> Json<Value> {
    let c = &state.config;
    Json(json!({
        "model_path": c.model_path,
        "tokenizer_path": c.model_path,
        "is_generation": true,
    }))
}

/// One sequence of a `/generate` request.
struct GenItem {
    tokens: Vec<Token>,
    handoff: Handoff,
    /// Tokens to generate here (see [`AppState::to_generate`]).
    max_new: usize,
    report: GenReport,
}

/// What a `/generate` answer object reports about one sequence.
#[derive(Clone)]
struct GenReport {
    rid: String,
    started: Instant,
    /// Position in a batch answer.
    index: Option<usize>,
    /// `meta_info.input_token_logprobs` when `return_logprob` was asked.
    input_logprobs: Option<Value>,
    prompt_tokens: usize,
    cached_tokens: usize,
}

/// `[logprob, token_id, null]`, SGLang's logprob entry (no token text).
fn logprob_entry(logprob: Option<f64>, id: i64) -> Value {
    json!([logprob, id, null])
}

/// `meta_info.input_token_logprobs` of a prompt: one entry per prompt token,
/// the first without a logprob (nothing precedes it), as SGLang reports.
fn input_logprobs(tokens: &[Token]) -> Value {
    tokens
        .iter()
        .enumerate()
        .map(|(pos, &t)| {
            let id = token_id(t);
            logprob_entry((pos > 0).then(|| logprob(id, pos)), id)
        })
        .collect()
}

impl GenReport {
    /// The answer object after `done` generated tokens.
    fn object(&self, text: &str, done: usize, finished: bool) -> Value {
        let finish_reason = if finished {
            json!({"type": "length", "length": done})
        } else {
            Value::Null
        };
        let mut meta = json!({
            "id": self.rid,
            "finish_reason": finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "cached_tokens": self.cached_tokens,
            "e2e_latency": self.started.elapsed().as_secs_f64(),
        });
        if let (Some(input), Some(m)) = (&self.input_logprobs, meta.as_object_mut()) {
            let output: Vec<Value> = (0..done)
                .map(|i| {
                    let id = generated_token_id(i);
                    logprob_entry(Some(logprob(id, self.prompt_tokens + i)), id)
                })
                .collect();
            m.insert("input_token_logprobs".into(), input.clone());
            m.insert("output_token_logprobs".into(), Value::Array(output));
        }
        let mut v = json!({"text": text, "meta_info": meta});
        if let (Some(i), Some(obj)) = (self.index, v.as_object_mut()) {
            obj.insert("index".into(), json!(i));
        }
        v
    }
}

/// `POST /generate`: `text` or `input_ids` (single or batch),
/// `sampling_params.max_new_tokens`, `stream`, `rid`, `return_logprob`,
/// the DP-rank fields of the worker's profile (see [`crate::wire`]), and in
/// PD mode the bootstrap fields (see
/// [`crate::disagg`]).
pub async fn generate(
    State(state): State<AppState>,
    record: Option<Extension<RecordId>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let in_flight = state.begin("/generate")?;
    let record = record.map(|Extension(id)| id);
    let raw = body;
    let body = parse_object(&raw)?;
    let (prompts, batch) = if let Some(text) = field(&body, "text") {
        request::prompts("text", text)?
    } else if let Some(ids) = field(&body, "input_ids") {
        request::prompts("input_ids", ids)?
    } else {
        return Err(ApiError::bad("either text or input_ids is required"));
    };
    let stream = request::opt_bool(&body, "stream")?.unwrap_or(false);
    let ranks = state.ranks(&body)?;
    let handoffs = state.handoffs(&body, prompts.len(), batch)?;
    let decode_side = state.config.disaggregation_mode == DisaggregationMode::Decode;
    let mut items = Vec::with_capacity(prompts.len());
    for ((i, prompt), handoff) in prompts.iter().enumerate().zip(handoffs) {
        let rid = match per_item(body.get("rid"), i) {
            None => request::random_id(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(ApiError::bad("rid must be a string or a list of strings")),
        };
        let max_new = match per_item(body.get("sampling_params"), i) {
            None => state.config.default_max_tokens,
            Some(Value::Object(sp)) => request::max_tokens(
                sp,
                &["max_new_tokens"],
                state.config.default_max_tokens,
                state.config.context_length,
            )?,
            Some(_) => return Err(ApiError::bad("sampling_params must be an object")),
        };
        let return_logprob = match per_item(body.get("return_logprob"), i) {
            None => false,
            Some(v) => v.as_bool().ok_or_else(|| {
                ApiError::bad("return_logprob must be a boolean or a list of booleans")
            })?,
        };
        let tokens = match state.file_tokens("/generate", &raw) {
            Some(tokens) if !batch => tokens,
            _ => prompt.tokens(),
        };
        // A decode worker has no prompt logprobs: the prefill worker
        // reports them and a router merges the two.
        let input_logprobs = return_logprob.then(|| {
            if decode_side {
                json!([])
            } else {
                input_logprobs(&tokens)
            }
        });
        items.push(GenItem {
            handoff,
            max_new: state.to_generate(max_new),
            report: GenReport {
                rid,
                started,
                index: batch.then_some(i),
                input_logprobs,
                prompt_tokens: 0,
                cached_tokens: 0,
            },
            tokens,
        });
    }
    state.control.wait_unstalled().await;

    if !stream {
        // The first failure ends the request (and withdraws the others).
        let outs = try_join_all(items.iter().map(|it| {
            let state = &state;
            async move {
                let p = state
                    .start_sequence(
                        record,
                        &it.handoff,
                        &ranks,
                        &it.report.rid,
                        &it.tokens,
                        it.max_new,
                    )
                    .await?;
                let report = GenReport {
                    prompt_tokens: p.prompt_tokens,
                    cached_tokens: p.cached_tokens,
                    ..it.report.clone()
                };
                p.decode(it.max_new).await;
                Ok::<_, ApiError>(report.object(&generated_text(it.max_new), it.max_new, true))
            }
        }))
        .await?;
        drop(in_flight);
        let answer = if batch {
            Value::Array(outs)
        } else {
            outs.into_iter().next().unwrap_or(Value::Null)
        };
        return Ok(Json(answer).into_response());
    }

    let streams = items.into_iter().map(|it| {
        let state = state.clone();
        stream::once(async move {
            let p = state
                .start_sequence(
                    record,
                    &it.handoff,
                    &ranks,
                    &it.report.rid,
                    &it.tokens,
                    it.max_new,
                )
                .await;
            (p, it)
        })
        .flat_map(move |(p, it)| {
            let p = match p {
                Ok(p) => p,
                Err(e) => return stream::once(ready(Err(e))).boxed(),
            };
            let report = GenReport {
                prompt_tokens: p.prompt_tokens,
                cached_tokens: p.cached_tokens,
                ..it.report
            };
            let n = it.max_new;
            let mut text = String::new();
            let nothing_to_generate = (n == 0).then(|| Ok(sse::event(&report.object("", 0, true))));
            p.decode_stream(n)
                .map(move |i| {
                    text.push_str(&generated_token(i));
                    Ok(sse::event(&report.object(&text, i + 1, i + 1 == n)))
                })
                .chain(stream::iter(nothing_to_generate))
                .boxed()
        })
    });
    let events = stream::select_all(streams.map(StreamExt::boxed))
        .chain(stream::once(async { Ok(sse::done()) }));
    Ok(sse::response(sse::until_error(events), in_flight))
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
    let rank = state.ranks(&body)?.run;
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
