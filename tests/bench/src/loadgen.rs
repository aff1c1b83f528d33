//! The load generator: a closed loop of N clients (scenario 1, whole
//! answers or SSE streams read to `[DONE]`) and an open loop replaying a
//! schedule (scenario 2), over keep-alive HTTP/1.1 connections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;

use crate::sse::EventCounter;
use crate::stats::Percentiles;
use crate::workload::Scheduled;

/// A closed-loop request that takes longer than this fails (a router that
/// hangs must not hang the bench).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A client with keep-alive connections and no proxy.
pub fn client(pool: usize) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(pool.max(1))
        .tcp_nodelay(true)
        .build()
        .context("building the HTTP client")
}

/// Result of one closed-loop cell.
#[derive(Debug, Clone, Serialize)]
pub struct ClosedLoopResult {
    /// Requests answered 2xx within the measured window, per second.
    pub rps: f64,
    /// Latency of those requests, milliseconds.
    pub latency_ms: Percentiles,
    /// Requests answered with an error or failed, in the window.
    pub errors: u64,
    /// CPU seconds the router used over the measured window (see
    /// `closed_loop`'s `cpu`); `None` when not measured.
    pub cpu_s: Option<f64>,
    /// SSE chunk events (before `[DONE]`) of the requests counted in
    /// `rps`, per second; 0 for whole answers.
    pub chunks_per_s: f64,
    /// What the first failed request saw (status and the start of the
    /// answer, or the client's error), for the report.
    pub first_error: Option<String>,
}

/// How the closed loop reads an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// The whole body; 2xx is a success.
    Whole,
    /// An SSE stream read to its end; a success is 2xx ending with
    /// `data: [DONE]`.
    Sse,
}

/// Runs `concurrency` clients against `url` for `warmup + measure`; each
/// sends the next of `bodies` as soon as its last answer is read. Only
/// requests started after the warm-up and finished inside the window count.
/// `cpu` (the router's CPU seconds so far) is read at the window's start
/// and end.
pub async fn closed_loop(
    url: &str,
    bodies: Arc<Vec<Vec<u8>>>,
    concurrency: usize,
    warmup: Duration,
    measure: Duration,
    cpu: &dyn Fn() -> Option<f64>,
) -> anyhow::Result<ClosedLoopResult> {
    closed_loop_reading(
        url,
        bodies,
        concurrency,
        warmup,
        measure,
        cpu,
        Reading::Whole,
    )
    .await
}

/// [`closed_loop`], reading each answer as `answer` says.
pub async fn closed_loop_reading(
    url: &str,
    bodies: Arc<Vec<Vec<u8>>>,
    concurrency: usize,
    warmup: Duration,
    measure: Duration,
    cpu: &dyn Fn() -> Option<f64>,
    answer: Reading,
) -> anyhow::Result<ClosedLoopResult> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(concurrency.max(1))
        .tcp_nodelay(true)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("building the HTTP client")?;
    let start = Instant::now();
    let (from, until) = (start + warmup, start + warmup + measure);
    let mut tasks = Vec::with_capacity(concurrency);
    for c in 0..concurrency {
        let (client, bodies, url) = (client.clone(), Arc::clone(&bodies), url.to_string());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let (mut errors, mut chunks) = (0u64, 0u64);
            let mut first_error = None;
            let mut i = c * 7919;
            loop {
                let sent = Instant::now();
                if sent >= until {
                    break;
                }
                let body = bodies[i % bodies.len()].clone();
                i += 1;
                let got = request(&client, &url, body, answer).await;
                let done = Instant::now();
                let ok = got.is_ok();
                if sent >= from && done <= until {
                    match got {
                        Ok(n) => {
                            lat.push((done - sent).as_secs_f64() * 1e3);
                            chunks += n;
                        }
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert(e);
                        }
                    }
                }
                if !ok {
                    // Do not spin on a dead endpoint.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            (lat, errors, chunks, first_error)
        }));
    }
    tokio::time::sleep_until(from.into()).await;
    let cpu_from = cpu();
    tokio::time::sleep_until(until.into()).await;
    let cpu_s = cpu().zip(cpu_from).map(|(b, a)| b - a);
    let mut all = Vec::new();
    let (mut errors, mut chunks) = (0, 0);
    let mut first_error = None;
    for t in tasks {
        let (lat, e, n, first) = t.await.context("client task panicked")?;
        all.extend(lat);
        errors += e;
        chunks += n;
        first_error = first_error.or(first);
    }
    Ok(ClosedLoopResult {
        rps: all.len() as f64 / measure.as_secs_f64(),
        latency_ms: Percentiles::of(&mut all),
        errors,
        cpu_s,
        chunks_per_s: chunks as f64 / measure.as_secs_f64(),
        first_error,
    })
}

/// One closed-loop request: the SSE chunks it got (0 for a whole answer),
/// or why it failed.
async fn request(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    answer: Reading,
) -> Result<u64, String> {
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| error_chain(&e))?;
    let status = r.status();
    if !status.is_success() {
        let text = r.text().await.unwrap_or_default();
        let text: String = text.chars().take(200).collect();
        return Err(format!("HTTP {}: {}", status.as_u16(), text.trim()));
    }
    match answer {
        Reading::Whole => r.bytes().await.map(|_| 0).map_err(|e| error_chain(&e)),
        Reading::Sse => {
            let mut counter = EventCounter::default();
            let mut stream = r.bytes_stream();
            while let Some(piece) = stream.next().await {
                counter.feed(&piece.map_err(|e| error_chain(&e))?);
            }
            if counter.done() {
                Ok(counter.chunks())
            } else {
                Err(format!(
                    "the stream ended without [DONE] after {} events",
                    counter.chunks()
                ))
            }
        }
    }
}

/// `e` and its sources, `: `-separated.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// What one streamed request of scenario 2 saw.
#[derive(Debug, Clone, Default)]
pub struct StreamOutcome {
    /// Time to the first chunk carrying content, milliseconds.
    pub ttft_ms: Option<f64>,
    /// Time to the end of the stream, milliseconds.
    pub e2e_ms: Option<f64>,
    /// `usage.prompt_tokens` of the last chunk.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens` (or SGLang's
    /// `meta_info.cached_tokens`).
    pub cached_tokens: u64,
    /// HTTP status (0 when the request failed before an answer).
    pub status: u16,
    /// Why the request failed, if it did: no answer, a non-2xx status, an
    /// error event in the stream, a stream that ended without `[DONE]`, or
    /// one cut at the end of the drain. A failed request keeps its TTFT in
    /// the percentiles when it had one (or its wait, when cut).
    pub failure: Option<String>,
}

impl StreamOutcome {
    fn fail(&mut self, why: impl Into<String>) {
        if self.failure.is_none() {
            self.failure = Some(why.into());
        }
    }
}

/// Replays `schedule` (open loop: each request leaves at its time whatever
/// the others are doing) against `url`; requests still running at
/// `last arrival + drain` are cut.
pub async fn open_loop(
    url: &str,
    schedule: Arc<Vec<Scheduled>>,
    drain: Duration,
) -> anyhow::Result<(Vec<StreamOutcome>, Duration)> {
    let client = client(256)?;
    let start = tokio::time::Instant::now();
    let last = schedule.last().map_or(Duration::ZERO, |s| s.at);
    let deadline = start + last + drain;
    let mut tasks = Vec::with_capacity(schedule.len());
    for i in 0..schedule.len() {
        let (client, schedule, url) = (client.clone(), Arc::clone(&schedule), url.to_string());
        tasks.push(tokio::spawn(async move {
            let s = &schedule[i];
            tokio::time::sleep_until(start + s.at).await;
            let sent = Instant::now();
            let mut out = StreamOutcome::default();
            let run = stream_one(&client, &url, s.body.clone(), sent, &mut out);
            if tokio::time::timeout_at(deadline, run).await.is_err() {
                out.fail("cut at the end of the drain");
                if out.ttft_ms.is_none() {
                    // Cut before the first token: count the wait so far as
                    // a lower bound, so that cut requests weigh in the
                    // percentiles.
                    out.ttft_ms = Some(sent.elapsed().as_secs_f64() * 1e3);
                }
            }
            (out, Instant::now())
        }));
    }
    let mut outcomes = Vec::with_capacity(tasks.len());
    let mut end = Instant::now();
    let started = start.into_std();
    for t in tasks {
        let (o, done) = t.await.context("request task panicked")?;
        end = end.max(done);
        outcomes.push(o);
    }
    Ok((outcomes, end.saturating_duration_since(started)))
}

async fn stream_one(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    sent: Instant,
    out: &mut StreamOutcome,
) {
    let resp = match client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return out.fail(format!("no answer: {e}")),
    };
    out.status = resp.status().as_u16();
    if !resp.status().is_success() {
        let _ = resp.bytes().await;
        // Its wait counts in the TTFT percentiles: a refusal is not fast
        // service.
        out.ttft_ms = Some(sent.elapsed().as_secs_f64() * 1e3);
        return out.fail(format!("status {}", out.status));
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return out.fail("the stream broke");
        };
        buf.extend_from_slice(&chunk);
        // Events end with a blank line.
        while let Some(end) = find(&buf, b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            for line in event.split(|&b| b == b'\n') {
                let Some(data) = line.strip_prefix(b"data:") else {
                    continue;
                };
                let data = data.trim_ascii();
                if data == b"[DONE]" {
                    out.e2e_ms = Some(sent.elapsed().as_secs_f64() * 1e3);
                    return;
                }
                let Ok(v) = serde_json::from_slice::<Value>(data) else {
                    continue;
                };
                if v.get("error").is_some_and(|e| !e.is_null()) {
                    // SGLang and the routers report a failure that happens
                    // after the 200 as an error event in the stream.
                    out.fail(format!("error event: {}", v["error"]));
                }
                if out.ttft_ms.is_none() && has_content(&v) {
                    out.ttft_ms = Some(sent.elapsed().as_secs_f64() * 1e3);
                }
                read_usage(&v, out);
            }
        }
    }
    // The stream ended without [DONE]: a failure, whose end counts anyway if
    // content came.
    out.fail("the stream ended without [DONE]");
    if out.ttft_ms.is_some() {
        out.e2e_ms = Some(sent.elapsed().as_secs_f64() * 1e3);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// True when an OpenAI chunk (chat `delta.content` or completions `text`)
/// carries generated text.
fn has_content(v: &Value) -> bool {
    v["choices"].as_array().is_some_and(|cs| {
        cs.iter().any(|c| {
            c["delta"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
                || c["text"].as_str().is_some_and(|s| !s.is_empty())
        })
    })
}

fn read_usage(v: &Value, out: &mut StreamOutcome) {
    let usage = &v["usage"];
    if let Some(p) = usage["prompt_tokens"].as_u64() {
        out.prompt_tokens = p;
    }
    if let Some(c) = usage["prompt_tokens_details"]["cached_tokens"].as_u64() {
        out.cached_tokens = c;
    } else if let Some(c) = v["meta_info"]["cached_tokens"].as_u64() {
        out.cached_tokens = c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_and_usage_are_read() {
        assert!(!has_content(
            &json!({"choices":[{"delta":{"role":"assistant","content":""}}]})
        ));
        assert!(has_content(
            &json!({"choices":[{"delta":{"content":" tok0"}}]})
        ));
        let mut o = StreamOutcome::default();
        read_usage(
            &json!({"choices":[],"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4}}}),
            &mut o,
        );
        assert_eq!((o.prompt_tokens, o.cached_tokens), (10, 4));
    }
}
