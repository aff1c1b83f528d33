//! The load generator: a closed loop of N clients (scenario 1) and an open
//! loop replaying a schedule (scenario 2), over keep-alive HTTP/1.1
//! connections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;

use crate::stats::Percentiles;
use crate::workload::Scheduled;

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
    let client = client(concurrency)?;
    let start = Instant::now();
    let (from, until) = (start + warmup, start + warmup + measure);
    let mut tasks = Vec::with_capacity(concurrency);
    for c in 0..concurrency {
        let (client, bodies, url) = (client.clone(), Arc::clone(&bodies), url.to_string());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut i = c * 7919;
            loop {
                let sent = Instant::now();
                if sent >= until {
                    break;
                }
                let body = bodies[i % bodies.len()].clone();
                i += 1;
                let ok = match client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                {
                    Ok(r) => {
                        let good = r.status().is_success();
                        r.bytes().await.is_ok() && good
                    }
                    Err(_) => false,
                };
                let done = Instant::now();
                if sent >= from && done <= until {
                    if ok {
                        lat.push((done - sent).as_secs_f64() * 1e3);
                    } else {
                        errors += 1;
                    }
                }
                if !ok {
                    // Do not spin on a dead endpoint.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            (lat, errors)
        }));
    }
    tokio::time::sleep_until(from.into()).await;
    let cpu_from = cpu();
    tokio::time::sleep_until(until.into()).await;
    let cpu_s = cpu().zip(cpu_from).map(|(b, a)| b - a);
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await.context("client task panicked")?;
        all.extend(lat);
        errors += e;
    }
    Ok(ClosedLoopResult {
        rps: all.len() as f64 / measure.as_secs_f64(),
        latency_ms: Percentiles::of(&mut all),
        errors,
        cpu_s,
    })
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
            if tokio::time::timeout_at(deadline, run).await.is_err() && out.ttft_ms.is_none() {
                // Cut before the first token: count the wait so far as a
                // lower bound, so that cut requests weigh in the percentiles.
                out.ttft_ms = Some(sent.elapsed().as_secs_f64() * 1e3);
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
        Err(_) => return,
    };
    out.status = resp.status().as_u16();
    if !resp.status().is_success() {
        let _ = resp.bytes().await;
        return;
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else { return };
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
                if out.ttft_ms.is_none() && has_content(&v) {
                    out.ttft_ms = Some(sent.elapsed().as_secs_f64() * 1e3);
                }
                read_usage(&v, out);
            }
        }
    }
    // The stream ended without [DONE]: count the end anyway if content came.
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
