//! `bench-load`: the overhead scenario's closed loop against any URL, for
//! profiling a router by hand (`perf record -p <pid>` while it runs).
//!
//! ```text
//! bench-load --url http://127.0.0.1:30000/v1/chat/completions --body-bytes 1024 --clients 64 --seconds 10
//! ```

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use sglang_envoy_bench::loadgen::closed_loop;
use sglang_envoy_bench::workload::overhead_bodies;

/// Closed-loop load of chat completions against one URL.
#[derive(Debug, Parser)]
struct Cli {
    /// Where to POST.
    #[arg(long)]
    url: String,
    /// Approximate size of each JSON body.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// Clients, each sending its next request when its answer is read.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Measured seconds (after one second of warm-up).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let bodies = Arc::new(overhead_bodies(1, cli.body_bytes, 512, 8));
    let r = closed_loop(
        &cli.url,
        bodies,
        cli.clients,
        Duration::from_secs(1),
        Duration::from_secs(cli.seconds),
        &|| None,
    )
    .await?;
    println!(
        "{:.0} req/s, p50 {:.3} ms, p99 {:.3} ms, {} errors",
        r.rps, r.latency_ms.p50, r.latency_ms.p99, r.errors
    );
    Ok(())
}
