//! A real Redis for the tests of several control planes sharing state
//! (`--fleet-store-url`): Debian's `redis-server`, which scripts/test.sh
//! installs.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::{free_port, fresh_dir, wait_until, Proc, ScratchDir};

/// A Redis of one test's own, as its control planes' fleet store.
pub struct Store {
    /// The server (its first start numbered 0; [`Store::restart`] counts on).
    pub server: Proc,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The control plane's flags for it, keys under the test's tag.
    pub flags: Vec<String>,
    starts: usize,
    /// Its directory; last, so that Redis is gone before it is removed.
    pub dir: ScratchDir,
}

impl Store {
    /// Starts a Redis for the test `tag` (a directory and key prefix of
    /// its own) and waits until it answers; `None`, and the test skips,
    /// where there is no `redis-server` ([`missing`]).
    pub async fn start(tag: &str) -> Option<Store> {
        if missing() {
            return None;
        }
        let tag = format!("{tag}-{}", std::process::id());
        let dir = fresh_dir(&tag).expect("a scratch directory");
        let port = free_port();
        let server = start(&dir, port, 0);
        assert!(answers(port).await, "redis never answered");
        Some(Store {
            server,
            port,
            flags: fleet_store_flags(port, &tag),
            starts: 1,
            dir,
        })
    }

    /// Kills Redis like a crash.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Starts it again on the same port, empty (nothing is kept on disk),
    /// and waits until it answers.
    pub async fn restart(&mut self) {
        self.server.kill();
        self.server = start(&self.dir, self.port, self.starts);
        self.starts += 1;
        assert!(answers(self.port).await, "redis never came back");
    }
}

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
