use std::sync::Arc;
use std::time::Duration;

use sglang_envoy_body::{is_worker_failure, prefill_input_logprobs};
use sglang_envoy_lifecycle::headers;
use sglang_envoy_proto::PrefillOutcome;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::metrics::Metrics;
use crate::routing_key::RoutingKey;
use crate::tickets::{Counted, PrefillHandle};
use crate::workers::{error_chain, Registry, Worker};

/// One prefill request to send.
#[derive(Debug)]
pub struct PrefillJob {
    /// The chosen prefill unit; its load is counted while the request runs.
    pub worker: Arc<Worker>,
    /// Path (and query) of the client's request.
    pub path: String,
    /// Client headers to forward.
    pub headers: Vec<(String, String)>,
    /// The client's body with the prefill fields spliced in.
    pub body: Vec<u8>,
    /// Return the prefill's `meta_info.input_token_logprobs`.
    pub want_logprobs: bool,
    /// The policy's estimate of its prefill work.
    pub work: u64,
    /// The client's routing key, counted on the prefill unit while it runs.
    pub routing_key: Option<RoutingKey>,
}

/// Sends the prefill half of PD requests; each one's handle is kept with
/// its request's ticket (`crate::tickets`) until the request ends.
pub struct PrefillDispatcher {
    client: reqwest::Client,
    timeout: Duration,
    metrics: Arc<Metrics>,
    /// Where each prefill's outcome goes to its worker's circuit breaker.
    registry: Arc<Registry>,
}

impl PrefillDispatcher {
    /// A dispatcher sending through `client` (the prefill halves' own
    /// client for workers: TLS and the client certificate for `https://`
    /// prefill servers), whose requests give up after `timeout`, reporting
    /// each outcome to the prefill worker's circuit in `registry`.
    pub fn new(
        client: reqwest::Client,
        timeout: Duration,
        metrics: Arc<Metrics>,
        registry: Arc<Registry>,
    ) -> Self {
        PrefillDispatcher {
            client,
            timeout,
            metrics,
            registry,
        }
    }

    /// Starts the prefill request; the handle follows it (the request's
    /// ticket keeps it with the decode's load). Must run inside a tokio
    /// runtime: the request runs on the caller's, the gRPC port's own
    /// thread (`grpc_runtime.rs`) for a filter's question. Waking a thread
    /// of the main runtime for it and back cost more (PD at 16 clients:
    /// 135 against 114 us of control plane CPU a request).
    pub fn dispatch(&self, job: PrefillJob) -> PrefillHandle {
        // The prefill unit's load, held for as long as its request runs,
        // including when the task is aborted (client gone) or panics.
        let guard = Counted::start(job.worker.clone(), job.work, job.routing_key);
        let (tx, rx) = watch::channel(None);
        let client = self.client.clone();
        let timeout = self.timeout;
        let metrics = self.metrics.clone();
        let registry = self.registry.clone();
        let task = tokio::spawn(async move {
            let outcome = send(&client, timeout, &job).await;
            if !outcome.ok {
                metrics.error("prefill_failed");
                warn!(worker = %job.worker.url, status = outcome.http_status, message = %outcome.message, "prefill failed");
            }
            // A client error (4xx but 408 and 429) is not the worker's.
            let worker_failed = !outcome.ok && is_worker_failure(outcome.http_status);
            registry.record_outcome(&job.worker, !worker_failed);
            drop(guard);
            let _ = tx.send(Some(outcome));
        });
        PrefillHandle::new(rx, task.abort_handle())
    }
}

fn failure(status: u32, message: &str) -> PrefillOutcome {
    PrefillOutcome {
        ok: false,
        http_status: status,
        message: message.to_string(),
        error_type: "prefill_failed".into(),
        ..Default::default()
    }
}

async fn send(client: &reqwest::Client, timeout: Duration, job: &PrefillJob) -> PrefillOutcome {
    let url = format!("{}{}", job.worker.base_url, job.path);
    let mut request = client.post(&url).timeout(timeout);
    let client_headers = job.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
    for (name, value) in headers::for_prefill(client_headers) {
        request = request.header(name, value);
    }
    debug!(%url, "sending prefill");
    let response = match request.body(job.body.clone()).send().await {
        Ok(r) => r,
        Err(e) => {
            return failure(
                502,
                &format!(
                    "prefill server {} failed: {}",
                    job.worker.base_url,
                    error_chain(&e)
                ),
            )
        }
    };
    let status = response.status();
    let body = match response.bytes().await {
        Ok(b) => b,
        Err(e) => {
            return failure(
                502,
                &format!(
                    "reading the answer of prefill server {} failed: {e}",
                    job.worker.base_url
                ),
            )
        }
    };
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body);
        return failure(
            u32::from(status.as_u16()),
            &format!(
                "prefill server {} answered {status}: {}",
                job.worker.base_url,
                text.trim()
            ),
        );
    }
    let events = json_events(&body);
    if let Some(error) = events.iter().find_map(|e| e.get("error")) {
        return failure(
            500,
            &format!(
                "prefill server {} reported an error: {error}",
                job.worker.base_url
            ),
        );
    }
    let input_token_logprobs = if job.want_logprobs {
        events
            .iter()
            .find_map(prefill_input_logprobs)
            .unwrap_or_default()
    } else {
        String::new()
    };
    PrefillOutcome {
        ok: true,
        http_status: u32::from(status.as_u16()),
        input_token_logprobs,
        ..Default::default()
    }
}

/// The JSON documents of an answer: the body itself, or each `data:` event
/// of a streamed (SSE) answer.
fn json_events(body: &[u8]) -> Vec<serde_json::Value> {
    if let Ok(v) = serde_json::from_slice(body) {
        return vec![v];
    }
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_of_json_and_sse_bodies() {
        assert_eq!(json_events(br#"{"a":1}"#).len(), 1);
        let sse = b"data: {\"meta_info\":{\"input_token_logprobs\":[[-1.0,5,null]]}}\n\ndata: {\"x\":2}\n\ndata: [DONE]\n\n";
        let events = json_events(sse);
        assert_eq!(events.len(), 2);
        assert!(events[0]
            .pointer("/meta_info/input_token_logprobs")
            .is_some());
        assert!(json_events(b"not json").is_empty());
    }
}
