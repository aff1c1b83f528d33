//! The README's first command, as a user runs it: `./scripts/quickstart.sh`
//! sets up what is missing, builds, starts two simulated workers, the
//! control plane and Envoy, and prints `curl` lines to try. This test runs
//! the script, then runs the lines it printed, and stops it as Ctrl-C does.
//!
//! The script's own ports come from its variables (free ones here); the
//! simulated workers keep the fixed 31001 and 31002 the script gives them.
//! Run through the wasm filter and, with `SGLANG_ENVOY_FRONT_DOOR=ext_proc`,
//! through the ext_proc front door, as the script honours that variable;
//! the picker pass has no quick start of its own.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sglang_envoy_e2e::{free_port, fresh_dir, repo_root, Proc};

/// What the quick start prints once it serves.
const READY: &str = "Ctrl-C stops everything.";

/// The `curl` commands between "Try:" and the last line, continuation
/// lines joined.
fn printed_commands(log: &str) -> Vec<String> {
    let start = log.find("Try:").expect("the quick start says what to try");
    let end = log.find(READY).unwrap();
    let mut out = Vec::new();
    let mut current = String::new();
    for line in log[start + 4..end].lines().map(str::trim) {
        if line.is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    out
}

fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

#[tokio::test]
async fn the_quick_start_serves_what_it_prints() {
    if std::env::var("SGLANG_ENVOY_FRONT_DOOR").as_deref() == Ok("picker") {
        return;
    }
    let dir = fresh_dir(&format!("sglang-quickstart-{}", std::process::id())).unwrap();
    let port = free_port();
    let admin = free_port();
    let ports = [
        ("PORT", port),
        ("CP_ADMIN_PORT", admin),
        ("CP_GRPC_PORT", free_port()),
        ("ENVOY_ADMIN_PORT", free_port()),
    ];
    let env: Vec<(String, String)> = ports
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // Without the variables cargo sets for this test (a user's shell has
    // none): build scripts that read CARGO_MANIFEST_DIR would otherwise see
    // it change and rebuild the release binaries for nothing.
    let mut args: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| {
            k == "CARGO"
                || k == "OUT_DIR"
                || k.starts_with("CARGO_MANIFEST_")
                || k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_BIN_")
                || k.starts_with("CARGO_CRATE_")
                || k.starts_with("CARGO_TARGET_TMPDIR")
                || k.starts_with("CARGO_PRIMARY_")
                || k.starts_with("CARGO_RUSTC_")
        })
        .flat_map(|k| ["-u".to_string(), k])
        .collect();
    args.push("bash".into());
    args.push(
        repo_root()
            .join("scripts/quickstart.sh")
            .display()
            .to_string(),
    );
    let mut qs = Proc::spawn_script("quickstart", Path::new("env"), &args, &dir, &env).unwrap();

    // Setting up and building are no-ops after scripts/test.sh's own; a
    // first run on a bare machine takes minutes.
    let deadline = Instant::now() + Duration::from_secs(900);
    while !qs.log().contains(READY) {
        let log = qs.log();
        assert!(
            Instant::now() < deadline && !log.contains("timed out waiting"),
            "not ready: {log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = qs.log();
    let commands = printed_commands(&log);
    assert_eq!(commands.len(), 2, "{log}");
    for command in &commands {
        assert!(
            command.starts_with("curl ") && command.contains(&format!("127.0.0.1:{port}/")),
            "{command}"
        );
        let out = Command::new("bash")
            .arg("-c")
            .arg(command)
            .output()
            .unwrap();
        assert!(out.status.success(), "{command}: {out:?}");
        let body: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{command}: {e}: {out:?}"));
        if command.contains("/v1/chat/completions") {
            let text = body["choices"][0]["message"]["content"].as_str();
            assert!(text.is_some_and(|t| !t.is_empty()), "{body}");
            assert_eq!(body["object"], "chat.completion", "{body}");
        } else {
            // The two simulated workers, each with its load back at 0.
            let workers = body["workers"].as_array().expect("workers");
            assert_eq!(workers.len(), 2, "{body}");
            assert!(workers.iter().all(|w| w["load"] == 0), "{body}");
        }
    }
    // The quick start routes with cost_aware unless told otherwise.
    let health: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{admin}/health"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["policy"], "cost_aware", "{health}");

    // Ctrl-C (the script traps INT and TERM alike) stops everything.
    assert!(qs.signal("TERM"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while ports.iter().any(|(_, p)| port_open(*p)) || port_open(31001) || port_open(31002) {
        assert!(Instant::now() < deadline, "still serving after TERM");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    qs.kill();
}
