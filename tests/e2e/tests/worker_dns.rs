//! Workers named by DNS: a name that does not resolve yet is retried, not
//! fatal, and a name that moves to another address (a Kubernetes pod
//! rescheduled under the same name) is followed within seconds, while a
//! name that stops resolving keeps its last address. The control plane gets
//! a mount namespace whose `/etc/hosts` the test rewrites: the real
//! resolver, no test hook in the router.

use std::path::Path;
use std::time::Duration;

use sglang_envoy_e2e::{
    expect_openai_error, free_port, fresh_dir, hosts_file_supported, wait_until, ScratchDir,
    SimWorker, Stack, StackOptions,
};

const NAME: &str = "sglang-worker.dns-test";
const GEN: &str = r#"{"text":"where are you","sampling_params":{"max_new_tokens":1}}"#;

/// Writes the control plane's `/etc/hosts` in place (the bind mount follows
/// the file, not a name), with `NAME` at `ip` when given.
fn point_name(hosts: &Path, ip: Option<&str>) {
    let mut text = "127.0.0.1 localhost\n".to_string();
    if let Some(ip) = ip {
        text.push_str(&format!("{ip} {NAME}\n"));
    }
    std::fs::write(hosts, text).expect("write the hosts file");
}

fn scratch_dir() -> ScratchDir {
    fresh_dir(&format!("sglang-dns-{}", std::process::id())).expect("scratch dir")
}

#[tokio::test]
async fn a_worker_named_by_dns_is_found_late_and_followed_when_it_moves() {
    if !hosts_file_supported() {
        // CI (and scripts/test.sh) must run it, not pass by skipping.
        assert!(
            std::env::var_os("CI").is_none(),
            "cannot give the control plane its own /etc/hosts \
             (unshare --map-root-user --mount: run as root or allow user namespaces)"
        );
        eprintln!("skipped: no unshare --mount here");
        return;
    }
    let dir = scratch_dir();
    let hosts = dir.join("hosts");
    point_name(&hosts, None);
    let port = free_port();
    let worker_args = StackOptions::default().worker_args;
    let stack = Stack::start(StackOptions {
        workers: 0,
        policy: "round_robin".into(),
        cp_args: vec![
            "--worker-urls".into(),
            format!("http://{NAME}:{port}"),
            "--dns-refresh-secs".into(),
            "1".into(),
        ],
        cp_hosts_file: Some(hosts.clone()),
        ..Default::default()
    })
    .await
    .expect("a worker name that does not resolve yet does not stop the router");
    let first = SimWorker::spawn_at(&dir, "127.0.0.1", port, &worker_args, None).unwrap();
    first.wait_healthy(Duration::from_secs(20)).await.unwrap();

    // The worker is up but its name is not known yet: nothing to route to.
    expect_openai_error(stack.post("/generate", GEN).await, 503).await;

    // The name appears: the worker is registered and serves.
    point_name(&hosts, Some("127.0.0.1"));
    let s = &stack;
    assert!(
        wait_until(Duration::from_secs(15), || async move {
            s.post("/generate", GEN).await.status() == 200
        })
        .await,
        "the worker was not found once its name resolved"
    );
    assert!(first.served().await > 0);

    // The pod moves: a new process at another address under the same name.
    // The old one stays up, so only the name can send traffic to the new.
    let second = SimWorker::spawn_at(&dir, "127.0.0.2", port, &worker_args, None).unwrap();
    second.wait_healthy(Duration::from_secs(20)).await.unwrap();
    assert_eq!(second.served().await, 0);
    point_name(&hosts, Some("127.0.0.2"));
    let moved = wait_until(Duration::from_secs(15), || async {
        let _ = stack.post("/generate", GEN).await;
        second.served().await > 0
    })
    .await;
    assert!(moved, "requests still go to the old address");
    let old_count = first.served().await;
    for _ in 0..5 {
        assert_eq!(stack.post("/generate", GEN).await.status(), 200);
    }
    assert_eq!(
        first.served().await,
        old_count,
        "the old address still gets requests"
    );

    // The name stops resolving (a DNS hiccup): the worker keeps its address.
    point_name(&hosts, None);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = second.served().await;
    for _ in 0..3 {
        assert_eq!(stack.post("/generate", GEN).await.status(), 200);
    }
    assert_eq!(second.served().await, before + 3);
    assert!(
        stack.wait_loads_zero(Duration::from_secs(5)).await,
        "{:?}",
        stack.loads().await
    );
}
