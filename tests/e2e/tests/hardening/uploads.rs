//! Large uploads refused before they have all arrived: the client still
//! reads its JSON answer (issue 26).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sglang_envoy_e2e::{wait_until, Stack, StackOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{answer_complete, normal_traffic, raw_json};

/// How one upload of [`upload`] ended: the answer's status and JSON body,
/// or what went wrong before a whole answer was read.
type Uploaded = Result<(u16, Value), String>;

/// How long a client of [`upload`] may take to notice that its upload has
/// stopped moving and read the answer: past Envoy's default grace period
/// (`delayed_close_timeout`, 1 s), well within the router's.
const SLOW_CLIENT: Duration = Duration::from_secs(2);

/// POSTs a chat body of `len` bytes (its `content-length`) to `path` over
/// a connection of its own, as a busy client does: it writes the body and
/// turns to the answer only once its writes have stopped moving for
/// [`SLOW_CLIENT`] (or the body is all sent), as a client on a loaded
/// machine may be late to notice an early answer. An upload cut by a reset
/// before the client has read the answer fails, as it does in clients that
/// give up on a failed write (hyper when the write error comes first,
/// Java's, Python's http.client).
async fn upload(addr: String, path: &'static str, len: usize) -> Uploaded {
    let conn = TcpStream::connect(&addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut rd, mut wr) = conn.into_split();
    let started = Instant::now();
    let moved = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let mut writer = tokio::spawn({
        let (moved, done) = (moved.clone(), done.clone());
        async move {
            let (open, close) = (
                r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":""#,
                r#""}]}"#,
            );
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n{open}"
            );
            wr.write_all(head.as_bytes()).await?;
            let filler = vec![b'x'; 64 * 1024];
            let mut left = len - open.len() - close.len();
            while left > 0 {
                let n = left.min(filler.len());
                wr.write_all(&filler[..n]).await?;
                moved.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                left -= n;
            }
            wr.write_all(close.as_bytes()).await?;
            done.store(true, Ordering::Relaxed);
            // The connection stays open both ways (no half close, which
            // Envoy takes for the client's leaving) until the answer is read.
            std::future::pending::<()>().await;
            std::io::Result::Ok(wr)
        }
    });
    // Busy writing until the writes stop moving.
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if writer.is_finished() || done.load(Ordering::Relaxed) {
            break;
        }
        let idle = started.elapsed().as_millis() as u64 - moved.load(Ordering::Relaxed);
        if idle >= SLOW_CLIENT.as_millis() as u64 {
            break;
        }
    }
    if writer.is_finished() {
        if let Err(e) = (&mut writer).await.unwrap() {
            return Err(format!("upload cut before the answer was read: {e}"));
        }
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    let read = loop {
        match rd.read(&mut buf).await {
            Ok(0) => break Err("closed".to_string()),
            Err(e) => break Err(format!("{e}")),
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
        if answer_complete(&out) {
            break Ok(());
        }
    };
    writer.abort();
    let answer = String::from_utf8_lossy(&out).into_owned();
    if let Err(e) = read {
        return Err(format!(
            "{e} after {} bytes of answer, {:?} in: {answer:?}",
            out.len(),
            started.elapsed()
        ));
    }
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, raw_json(&answer)))
}

#[tokio::test]
async fn large_uploads_refused_early_still_read_their_json_answer() {
    // Issue 26: a body refused before it has all arrived (too large by its
    // content-length, or over the body budget part way) must reach its
    // client as the JSON answer, not as a reset of the connection.
    const LIMIT: usize = 33_554_432;
    let stack = Stack::start(StackOptions {
        workers: 1,
        max_body_bytes: LIMIT,
        // The budget is one body at the limit; the test's Envoy runs one
        // thread, so one budget for either front door.
        filter_options: format!(r#", "max_buffered_bytes": {LIMIT}"#),
        cp_args: vec!["--ext-proc-max-buffered-bytes".into(), LIMIT.to_string()],
        ..Default::default()
    })
    .await
    .unwrap();
    // One body that holds most of the budget, waiting on a stalled worker,
    // so every later body under the limit is over the budget.
    stack.workers[0].configure(json!({"stall": true})).await;
    let holder = {
        let body = json!({
            "model": "m",
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "h".repeat(30_000_000)}],
        })
        .to_string();
        stack.post_spawned("/v1/chat/completions", body)
    };
    let held = wait_until(Duration::from_secs(15), || async {
        stack.loads().await.iter().map(|(_, l)| l).sum::<u64>() == 1
    })
    .await;
    assert!(held, "the holding body never reached the worker");
    let addr = stack.base.trim_start_matches("http://").to_string();
    let started = Instant::now();
    let mut failures = Vec::new();
    for round in 0..2 {
        let sends: Vec<_> = (0..24)
            .map(|i| {
                // Over the budget part way, as in the issue (20 MB), or
                // too large by its content-length.
                let (len, expect) = if i % 2 == 0 {
                    (20_000_000, 503)
                } else {
                    (LIMIT + 1, 413)
                };
                let addr = addr.clone();
                tokio::spawn(async move {
                    let answer = tokio::time::timeout(
                        Duration::from_secs(20),
                        upload(addr, "/v1/chat/completions", len),
                    )
                    .await
                    .unwrap_or_else(|_| Err("no answer within 20 s".into()));
                    (expect, answer)
                })
            })
            .collect();
        for s in sends {
            let (expect, answer) = s.await.unwrap();
            match answer {
                Ok((status, v)) if status == expect && v["error"]["code"] == expect => {}
                Ok((status, v)) => failures.push(format!("round {round}: {status} {v}")),
                Err(e) => failures.push(format!("round {round}, {expect} expected: {e}")),
            }
        }
    }
    let took = started.elapsed();
    assert!(
        failures.is_empty(),
        "{} of 48 uploads got no JSON answer: {failures:#?}",
        failures.len()
    );
    assert!(took < Duration::from_secs(40), "took {took:?}");
    stack.workers[0].configure(json!({"stall": false})).await;
    assert_eq!(
        holder.await.unwrap().ok().map(|r| r.status().as_u16()),
        Some(200)
    );
    assert_eq!(normal_traffic(&stack, 10).await, 10);
    assert!(stack.wait_loads_zero(Duration::from_secs(5)).await);
}
