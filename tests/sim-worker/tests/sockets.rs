//! What the worker's sockets do that a router can see.

mod common;

use std::time::{Duration, Instant};

use common::{fast, start};
use futures::StreamExt;
use serde_json::json;

/// A stream's chunks leave as they are written, as SGLang's do (Python's
/// asyncio turns Nagle's algorithm off on every TCP connection). With it on,
/// the chunk after the head waited for the client's ACK of the head: with
/// delayed ACKs, 40 ms, on some connections every request, straight from
/// the worker or through Envoy alike, and on others none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_first_chunk_follows_its_head_at_once() {
    let sim = start(fast()).await;
    let system = "a long shared system prompt ".repeat(1200);
    let mut stalled = Vec::new();
    let mut requests = 0;
    // Fresh connections: whether a connection's ACKs are delayed depends
    // on its history.
    for connection in 0..8 {
        let client = reqwest::Client::new();
        for i in 0..6 {
            let body = json!({
                "model": "m", "stream": true, "max_tokens": 2,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": format!("question {connection} {i}")},
                ],
            });
            let sent = Instant::now();
            let r = client
                .post(sim.url("/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let head = sent.elapsed();
            let mut stream = r.bytes_stream();
            let first = stream.next().await.map(|_| sent.elapsed());
            while stream.next().await.is_some() {}
            requests += 1;
            let gap = first.expect("no chunk") - head;
            if gap > Duration::from_millis(25) {
                stalled.push(gap);
            }
        }
    }
    // A busy machine may delay one or two; the delayed ACK held whole
    // connections.
    assert!(
        stalled.len() <= 2,
        "{} of {requests} first chunks came 25 ms or more after their head: {stalled:?}",
        stalled.len()
    );
}
