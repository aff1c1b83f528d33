//! A real Redis for the tests of several control planes sharing state
//! (`--fleet-store-url`): Debian's `redis-server`, which scripts/test.sh
//! installs.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::{wait_until, Proc};

/// `redis-server` on `port`, keeping nothing on disk (a restart comes back
/// empty, as a Redis without persistence does); `start` numbers its log.
pub fn start(dir: &Path, port: u16, start: usize) -> Proc {
    let args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(String::from)
    .to_vec();
    Proc::spawn(
        &format!("redis-{start}"),
        Path::new("redis-server"),
        &args,
        dir,
    )
    .expect("redis-server starts")
}

/// The control plane's flags for the Redis on `port` as its fleet store,
/// its keys under `prefix`.
pub fn fleet_store_flags(port: u16, prefix: &str) -> Vec<String> {
    vec![
        "--fleet-store-url".to_string(),
        format!("redis://127.0.0.1:{port}"),
        "--fleet-store-key-prefix".into(),
        prefix.to_string(),
    ]
}

/// Whether the Redis on `port` takes connections within 10 s.
pub async fn answers(port: u16) -> bool {
    wait_until(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await
}

/// Whether `redis-server` is missing here (then the calling test skips,
/// except in CI, where scripts/test.sh installs it).
pub fn missing() -> bool {
    let there = Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !there {
        assert!(
            std::env::var("CI").is_err(),
            "redis-server is missing (scripts/test.sh installs Debian's)"
        );
        eprintln!("skipped: no redis-server here");
    }
    !there
}
