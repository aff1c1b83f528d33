//! Many clients at once, each on new connections: requests that land on
//! every Envoy worker thread, fresh VMs' first ticks included.

use std::time::{Duration, Instant};

/// `clients` clients, each posting `body(i)` (its index) to `url` one
/// request after another, every request on a new connection (which the
/// kernel spreads over Envoy's threads), for `lasting`: what those not
/// answered 200 got.
pub async fn burst(
    url: &str,
    clients: usize,
    lasting: Duration,
    body: fn(usize) -> String,
) -> Vec<String> {
    // No idle connection is kept: each request opens its own.
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
    let until = Instant::now() + lasting;
    let tasks = (0..clients).map(|i| {
        let (fresh, url) = (fresh.clone(), url.to_string());
        tokio::spawn(async move {
            let mut failed = Vec::new();
            while Instant::now() < until {
                let r = fresh
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body(i))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 200 => {}
                    Ok(r) => {
                        let status = r.status();
                        failed.push(format!("{status}: {}", r.text().await.unwrap_or_default()));
                    }
                    Err(e) => failed.push(e.to_string()),
                }
            }
            failed
        })
    });
    let mut failed = Vec::new();
    for task in futures::future::join_all(tasks).await {
        match task {
            Ok(f) => failed.extend(f),
            Err(e) => failed.push(format!("a client panicked: {e}")),
        }
    }
    failed
}
