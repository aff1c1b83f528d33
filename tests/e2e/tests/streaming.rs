//! Server-sent events pass through Envoy chunk by chunk, and the official
//! `openai` Python client works against the router.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use sglang_envoy_e2e::{venv_python, Stack, StackOptions};

fn slow_decode() -> StackOptions {
    StackOptions {
        workers: 1,
        // 20 ms per token: a 20-token stream takes ~400 ms.
        worker_args: vec!["--decode-us-per-token".into(), "20000".into()],
        ..Default::default()
    }
}

#[tokio::test]
async fn sse_chunks_arrive_as_they_are_generated() {
    let stack = Stack::start(slow_decode()).await.unwrap();
    let started = Instant::now();
    let r = stack
        .post(
            "/v1/chat/completions",
            r#"{"model":"m","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"count"}]}"#,
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream")));
    let mut stream = r.bytes_stream();
    let mut text = String::new();
    let mut first_content_at = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
        if first_content_at.is_none()
            && text.contains("\"content\":\"")
            && text.contains("chat.completion.chunk")
        {
            first_content_at = Some(started.elapsed());
        }
    }
    let total = started.elapsed();
    let first = first_content_at.expect("no content chunk");
    assert!(
        text.trim_end().ends_with("data: [DONE]"),
        "stream must end with [DONE]"
    );
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(
        events.len() >= 20,
        "one event per token, got {}",
        events.len()
    );
    // Buffering the whole response would make the first chunk arrive at the end.
    assert!(
        total - first > Duration::from_millis(200),
        "first chunk at {first:?}, end at {total:?}: the stream was buffered"
    );
}

/// Time to a stream's first content chunk from `url` for a chat with this
/// `system` prompt, streamed with usage as the benchmark's clients do.
async fn first_content(http: &reqwest::Client, url: &str, system: &str, i: usize) -> Duration {
    let body = serde_json::json!({
        "model": "m", "stream": true, "max_tokens": 4,
        "stream_options": {"include_usage": true},
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("question {i}")},
        ],
    });
    let started = Instant::now();
    let r = http.post(url).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let mut text = String::new();
    let mut first = None;
    while let Some(chunk) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        if first.is_none() && text.contains("\"content\":\"") {
            first = Some(started.elapsed());
        }
    }
    first.expect("no content chunk")
}

/// Through Envoy, a stream's first content chunk comes as soon as the
/// worker sends it: the router holds no chunk back (a filter waiting on
/// its control plane before passing the answer on would). Compared with the
/// same requests straight to the worker, median against median.
#[tokio::test]
async fn the_first_content_chunk_is_not_held_on_the_way() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let direct = format!("{}/v1/chat/completions", stack.workers[0].url);
    let routed = stack.url("/v1/chat/completions");
    let (mut straight, mut through) = (Vec::new(), Vec::new());
    // A long system prompt, as in the benchmark's "long prompts": the
    // router reads and forwards a 32 KB body before the answer starts.
    let system = "a long shared system prompt ".repeat(1200);
    for i in 0..10 {
        straight.push(first_content(&http, &direct, &system, i).await);
        through.push(first_content(&http, &routed, &system, i).await);
    }
    straight.sort();
    through.sort();
    let (straight, through) = (straight[5], through[5]);
    assert!(
        through < straight + Duration::from_millis(15),
        "median first content {through:?} through Envoy against {straight:?} from the worker"
    );
}

#[tokio::test]
async fn official_openai_client_streams_and_reads_errors() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        max_body_bytes: 4096,
        ..Default::default()
    })
    .await
    .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/openai_client.py");
    let out = tokio::process::Command::new(venv_python())
        .arg(script)
        .arg(&stack.base)
        .output()
        .await
        .expect("run the venv's python");
    assert!(
        out.status.success(),
        "openai client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["chunks"].as_u64().unwrap() >= 8, "{v}");
    assert_eq!(v["completion_tokens"], 8, "{v}");
    assert!(!v["streamed"].as_str().unwrap().is_empty());
    assert_eq!(
        v["streamed"], v["whole"],
        "stream and non-stream answers differ: {v}"
    );
    // The filter's 413 is OpenAI-shaped, so the client raises an
    // APIStatusError carrying our message.
    assert_eq!(v["rejected"]["status"], 413, "{v}");
    assert!(
        v["rejected"]["message"]
            .as_str()
            .unwrap()
            .contains("4096 bytes"),
        "{v}"
    );
}
