//! `docker compose` as a user runs it (README, "Docker compose"): the
//! README's command in the repository, with the images the Dockerfile
//! builds, against a real Docker engine (scripts/docker-images.sh starts one
//! and makes the base images where no registry answers; scripts/test.sh
//! builds the project's images before the suite, once per run).
//!
//! - the demo (`--profile demo`) as typed, with no .env: health, a chat
//!   completion and an SSE stream through Envoy on :30000, the admin API
//!   kept off that port, a worker removed and added again from inside the
//!   control plane's container (without a token, changes are its host's),
//!   `/metrics` on the admin port;
//! - in front of workers outside compose (`WORKER_URLS`, here simulated
//!   workers on this machine, reached as host.docker.internal), with
//!   `ADMIN_TOKEN` and `ADMIN_ROUTES=on`: changes through Envoy's port
//!   refused without the token, taken with it;
//! - profile ha with the demo (two control planes sharing the worker list
//!   through Redis): a change through either reaches the other, and every
//!   request is answered with one control plane stopped, then Redis too;
//!
//! each ended with `docker compose down`, after which nothing of it is left.
//! They run once, in the wasm pass of scripts/test.sh (compose runs the wasm
//! filter), one at a time (all publish :30000).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use sglang_envoy_e2e::{free_port, fresh_dir, repo_root, wait_until, FrontDoor, SimWorker};

/// The compose project's name, so the test finds what is its own.
const PROJECT: &str = "sglang-envoy-compose-test";
/// The admin token the test's .env would hold.
const TOKEN: &str = "compose-test-token";
/// The ports the README's command publishes.
const CLIENT: &str = "http://127.0.0.1:30000";
const ADMIN: &str = "http://127.0.0.1:30010";

/// One compose project at a time: both tests publish the same ports.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn skip() -> bool {
    if FrontDoor::current() != FrontDoor::Wasm {
        eprintln!("skipped: compose runs the wasm filter (run in the wasm pass)");
        return true;
    }
    let engine = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success())
        && Command::new("docker")
            .arg("info")
            .output()
            .is_ok_and(|o| o.status.success());
    if !engine {
        assert!(
            std::env::var("CI").is_err(),
            "no Docker engine or compose plugin (scripts/docker-images.sh sets them up)"
        );
        eprintln!("skipped: no Docker engine here (scripts/docker-images.sh starts one)");
        return true;
    }
    false
}

/// A running `docker compose up`, in the foreground as the README runs
/// it, its output in a log; brought down when dropped.
struct Compose {
    env: Vec<(String, String)>,
    up: Option<Child>,
    log: PathBuf,
}

impl Compose {
    /// `docker compose [--profile P]... up --build` in the repository, with
    /// `env` as the user's .env would set it.
    fn up(profiles: &[&str], env: &[(&str, String)], dir: &Path) -> Compose {
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        env.push(("COMPOSE_PROJECT_NAME".into(), PROJECT.into()));
        let log = dir.join("compose-up.log");
        let out = std::fs::File::create(&log).unwrap();
        let mut args = vec!["compose"];
        for profile in profiles {
            args.extend(["--profile", profile]);
        }
        args.extend(["up", "--build"]);
        let up = Command::new("docker")
            .args(&args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(repo_root())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("docker compose up starts");
        Compose {
            env,
            up: Some(up),
            log,
        }
    }

    /// `docker compose ARGS` with the same environment; its output.
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("docker")
            .arg("compose")
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(repo_root())
            .output()
            .expect("docker compose runs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `curl -fsS` of the admin API from inside `service`'s container (its
    /// own host, where changes need no token): `POST` when `post`.
    fn admin_in(&self, service: &str, post: bool, path: &str) -> String {
        let url = format!("http://127.0.0.1:30010{path}");
        let mut args = vec!["exec", "-T", service, "curl", "-fsS"];
        if post {
            args.extend(["-X", "POST"]);
        }
        args.push(&url);
        self.run(&args)
    }

    /// The health check status of `service`'s container.
    fn health(&self, service: &str) -> String {
        let id = self.run(&["ps", "-q", service]);
        let out = Command::new("docker")
            .args(["inspect", "--format", "{{.State.Health.Status}}", id.trim()])
            .output()
            .expect("docker runs");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// What `up` printed so far (for failure messages).
    fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// `docker compose down`, as the user ends it; `up` then exits.
    fn down(&mut self) {
        let all = ["--profile", "demo", "--profile", "ha"];
        self.run(&[&all[..], &["down", "--timeout", "5"]].concat());
        if let Some(mut up) = self.up.take() {
            let stopped = (0..100).any(|_| {
                std::thread::sleep(Duration::from_millis(100));
                matches!(up.try_wait(), Ok(Some(_)))
            });
            if !stopped {
                let _ = up.kill();
                let _ = up.wait();
            }
        }
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        if self.up.is_some() {
            self.down();
        }
    }
}

/// The project's containers and networks still on the engine.
fn leftovers() -> String {
    let label = format!("label=com.docker.compose.project={PROJECT}");
    let list = |what: &[&str]| {
        let out = Command::new("docker")
            .args(what)
            .args(["--filter", &label, "-q"])
            .output()
            .expect("docker runs");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    format!("{}{}", list(&["ps", "-a"]), list(&["network", "ls"]))
}

async fn get(url: &str) -> Option<reqwest::Response> {
    reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()
}

/// Workers the control plane lists as healthy.
async fn healthy_workers() -> Vec<String> {
    let Some(r) = get(&format!("{ADMIN}/workers")).await else {
        return Vec::new();
    };
    healthy_urls(&r.json().await.unwrap_or_default())
}

/// The URLs of the healthy workers in a `/workers` answer.
fn healthy_urls(workers: &Value) -> Vec<String> {
    workers["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["healthy"] == Value::Bool(true))
        .filter_map(|w| w["url"].as_str().map(str::to_string))
        .collect()
}

/// Requests routed, by a control plane's `/metrics` text
/// (`sgl_router_requests_total`, all series).
fn requests_routed(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("sgl_router_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Up within `limit`: the workers healthy and a chat answered through
/// Envoy; then Envoy's container passes its own health check too.
async fn wait_ready(compose: &Compose, workers: usize, limit: Duration) {
    let ready = wait_until(limit, || async {
        healthy_workers().await.len() == workers
            && chat(false).await.is_some_and(|(status, _)| status == 200)
    })
    .await;
    assert!(ready, "compose did not come up:\n{}", compose.log());
    let envoy_healthy = wait_until(Duration::from_secs(30), || async {
        compose.health("envoy") == "healthy"
    })
    .await;
    assert!(
        envoy_healthy,
        "Envoy's health check: {}",
        compose.health("envoy")
    );
}

/// A chat completion through Envoy on :30000: status and body.
async fn chat(stream: bool) -> Option<(u16, String)> {
    let body = json!({"model": "m", "stream": stream, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello from compose"}]});
    let r = reqwest::Client::new()
        .post(format!("{CLIENT}/v1/chat/completions"))
        .json(&body)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.text().await.ok()?))
}

/// A chat answer and an SSE stream to its end, through Envoy.
async fn chat_and_stream_through_envoy() {
    let (status, body) = chat(false).await.expect("chat answered");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    let (status, body) = chat(true).await.expect("stream answered");
    assert_eq!(status, 200, "{body}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert!(body.matches("data: ").count() >= 3, "{body}");
}

/// Compose's ends: down, every container stopping on its signal (none
/// killed when the grace period runs out), and nothing of the project left
/// on the engine.
fn down_leaves_nothing(mut compose: Compose) {
    compose.down();
    let log = std::fs::read_to_string(&compose.log).unwrap_or_default();
    let killed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("exited with code 137"))
        .collect();
    assert!(killed.is_empty(), "killed, not stopped: {killed:?}");
    let left = leftovers();
    assert!(left.is_empty(), "left after down: {left}");
}

#[tokio::test]
async fn the_demo_as_typed_serves_and_keeps_worker_changes_to_its_host() {
    if skip() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = fresh_dir(&format!("sglang-compose-demo-{}", std::process::id())).unwrap();
    // No .env: the README's command as typed. Its worker registration runs
    // in the control plane's network namespace, so it is this host's.
    let compose = Compose::up(&["demo"], &[], &dir);
    // The images are built before the suite; a build here takes minutes.
    wait_ready(&compose, 2, Duration::from_secs(600)).await;
    chat_and_stream_through_envoy().await;

    // Defaults: the admin API is not on Envoy's port (Envoy's JSON 404,
    // nothing removed); the control plane's health is.
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{CLIENT}/remove_worker?url=http://worker-2:31002"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "not_found_error", "{body}");
    for path in ["/workers", "/list_workers", "/get_loads", "/metrics"] {
        let r = get(&format!("{CLIENT}{path}")).await.expect(path);
        assert_eq!(r.status(), 404, "{path} is not shown to clients");
    }
    let health = get(&format!("{CLIENT}/health")).await.expect("health");
    assert_eq!(health.status(), 200);
    assert_eq!(healthy_workers().await.len(), 2, "nothing was removed");

    // Without ADMIN_TOKEN, changes are taken on the control plane's own
    // host: inside its container, as the docs say to make them.
    let exec = |path: &str| compose.admin_in("control-plane", true, path);
    let removed = exec("/remove_worker?url=http://worker-2:31002");
    assert!(removed.contains("Successfully removed"), "{removed}");
    assert_eq!(healthy_workers().await, ["http://worker-1:31001"]);
    let added = exec("/add_worker?url=http://worker-2:31002");
    assert!(added.contains("Successfully added"), "{added}");
    assert!(
        wait_until(Duration::from_secs(10), || async {
            healthy_workers().await.len() == 2
        })
        .await,
        "the worker came back"
    );

    // Metrics on the admin port, published on the host's loopback.
    let metrics = get(&format!("{ADMIN}/metrics")).await.expect("metrics");
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await.unwrap();
    let routed = requests_routed(&text);
    assert!(routed >= 2.0, "the chat and the stream counted: {text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("sgl_router_worker_healthy{") && l.contains("worker-1:31001")),
        "per-worker series: {text}"
    );
    down_leaves_nothing(compose);
}

#[tokio::test]
async fn compose_fronts_workers_outside_it() {
    if skip() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = fresh_dir(&format!("sglang-compose-workers-{}", std::process::id())).unwrap();
    // Workers on this machine, listening where the containers reach it.
    let mut workers = Vec::new();
    for _ in 0..2 {
        let w = SimWorker::spawn_at(&dir, "0.0.0.0", free_port(), &[], None).unwrap();
        w.wait_healthy(Duration::from_secs(10)).await.unwrap();
        workers.push(w);
    }
    let urls: Vec<String> = workers
        .iter()
        .map(|w| format!("http://host.docker.internal:{}", w.port()))
        .collect();
    // As .env would set them: the workers, a token, and the admin API on
    // Envoy's port too.
    let compose = Compose::up(
        &[],
        &[
            ("WORKER_URLS", urls.join(" ")),
            ("ADMIN_TOKEN", TOKEN.into()),
            ("ADMIN_ROUTES", "on".into()),
        ],
        &dir,
    );
    wait_ready(&compose, 2, Duration::from_secs(600)).await;
    let before: u64 = served(&workers).await;
    chat_and_stream_through_envoy().await;
    assert!(
        served(&workers).await >= before + 2,
        "the chat and the stream reached the workers outside compose"
    );

    // Worker changes through Envoy's port: refused without the token,
    // taken with it.
    let admin = |path: &str, token: Option<&str>| {
        let mut r = reqwest::Client::new().post(format!("{CLIENT}{path}"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.timeout(Duration::from_secs(30)).send()
    };
    let path = format!("/remove_worker?url={}", urls[1]);
    let refused = admin(&path, None).await.unwrap();
    assert_eq!(refused.status(), 401, "{}", refused.text().await.unwrap());
    let removed = admin(&path, Some(TOKEN)).await.unwrap();
    assert_eq!(removed.status(), 200, "{}", removed.text().await.unwrap());
    assert_eq!(healthy_workers().await, [urls[0].clone()]);
    let added = admin(&format!("/add_worker?url={}", urls[1]), Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(added.status(), 200, "{}", added.text().await.unwrap());
    assert!(
        wait_until(Duration::from_secs(10), || async {
            healthy_workers().await.len() == 2
        })
        .await,
        "the worker came back"
    );
    down_leaves_nothing(compose);
}

/// The workers control-plane-2 lists as healthy, sorted (its admin API is
/// not published: read from inside its container).
fn healthy_workers_of_second(compose: &Compose) -> Vec<String> {
    let out = compose.admin_in("control-plane-2", false, "/workers");
    let mut urls = healthy_urls(&serde_json::from_str(&out).unwrap_or_default());
    urls.sort();
    urls
}

/// The workers control-plane lists as healthy, sorted.
async fn healthy_sorted() -> Vec<String> {
    let mut urls = healthy_workers().await;
    urls.sort();
    urls
}

/// Requests control-plane-2 has routed (`sgl_router_requests_total`).
fn routed_by_second(compose: &Compose) -> f64 {
    requests_routed(&compose.admin_in("control-plane-2", false, "/metrics"))
}

/// Sends `n` chats through Envoy, one after another, and asserts each
/// was answered 200 (`phase` says when, with the compose log if not).
async fn assert_chats_answered(compose: &Compose, n: usize, phase: &str) {
    let mut failed = Vec::new();
    for i in 0..n {
        match chat(false).await {
            Some((200, _)) => {}
            Some((status, body)) => failed.push(format!("request {i}: {status} {body}")),
            None => failed.push(format!("request {i}: no answer")),
        }
    }
    assert!(failed.is_empty(), "{phase}: {failed:?}\n{}", compose.log());
}

/// Profile ha as the README runs it (`--profile ha`, with the demo's
/// workers, and .env's `FLEET_STORE_FLAGS` set as .env.example says): the
/// demo's workers, registered through control-plane, reach control-plane-2
/// through Redis; a worker removed and added through control-plane-2
/// reaches control-plane; with control-plane stopped, every request is
/// answered and control-plane-2 routes them; with Redis stopped too, every
/// request is still answered; both come back.
#[tokio::test]
async fn profile_ha_shares_the_workers_and_outlives_a_control_plane_and_redis() {
    if skip() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = fresh_dir(&format!("sglang-compose-ha-{}", std::process::id())).unwrap();
    let store = (
        "FLEET_STORE_FLAGS",
        "--fleet-store-url redis://redis:6379".into(),
    );
    let compose = Compose::up(&["demo", "ha"], &[store], &dir);
    wait_ready(&compose, 2, Duration::from_secs(600)).await;
    let both = [
        "http://worker-1:31001".to_string(),
        "http://worker-2:31002".to_string(),
    ];
    let shared = wait_until(Duration::from_secs(10), || async {
        healthy_workers_of_second(&compose) == both
    })
    .await;
    assert!(
        shared,
        "control-plane-2 never took the demo's workers from Redis: {:?}\n{}",
        healthy_workers_of_second(&compose),
        compose.log()
    );

    // A change through control-plane-2 (on its own host: no token needed)
    // reaches control-plane.
    let exec_second = |path: &str| compose.admin_in("control-plane-2", true, path);
    let removed = exec_second("/remove_worker?url=http://worker-2:31002");
    assert!(removed.contains("Successfully removed"), "{removed}");
    assert!(
        wait_until(Duration::from_secs(5), || async {
            healthy_sorted().await == both[..1]
        })
        .await,
        "the removal never reached control-plane: {:?}",
        healthy_sorted().await
    );
    let added = exec_second("/add_worker?url=http://worker-2:31002");
    assert!(added.contains("Successfully added"), "{added}");
    assert!(
        wait_until(Duration::from_secs(10), || async {
            healthy_sorted().await == both
        })
        .await,
        "the worker never came back to control-plane: {:?}",
        healthy_sorted().await
    );

    // control-plane stopped: Envoy's streams move to control-plane-2.
    let before = routed_by_second(&compose);
    compose.run(&["stop", "control-plane"]);
    assert_chats_answered(&compose, 30, "with control-plane stopped").await;
    let routed = routed_by_second(&compose) - before;
    assert!(
        routed >= 30.0,
        "control-plane-2 routed {routed} of the 30 requests after control-plane stopped\n{}\n{}",
        compose.run(&["logs", "--tail", "60", "envoy"]),
        compose.run(&["logs", "--tail", "30", "control-plane-2"])
    );

    // Redis stopped as well: the control plane left routes on what it has.
    compose.run(&["stop", "redis"]);
    assert_chats_answered(&compose, 20, "with Redis stopped too").await;

    // Both back: control-plane lists the workers again.
    compose.run(&["start", "redis"]);
    compose.run(&["start", "control-plane"]);
    assert!(
        wait_until(Duration::from_secs(30), || async {
            healthy_sorted().await == both
        })
        .await,
        "control-plane came back without the workers: {:?}",
        healthy_sorted().await
    );
    assert_chats_answered(&compose, 20, "with both back").await;
    down_leaves_nothing(compose);
}

async fn served(workers: &[SimWorker]) -> u64 {
    let mut total = 0;
    for w in workers {
        total += w.served().await;
    }
    total
}

/// The README's commands block that the marker names this test for.
fn readme_block_tested_by(test: &str) -> Vec<String> {
    let readme = sglang_envoy_e2e::read_repo_file("README.md");
    let marker = readme
        .find(&format!("compose.rs::{test}"))
        .expect("the README names this test");
    let block = &readme[marker..];
    let start = block.find("```sh\n").expect("a block after the marker") + 6;
    let end = start + block[start..].find("```").unwrap();
    block[start..end]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("docker runs")
}

/// Users without Rust take the wasm file out of the `filter` image and run
/// the `control-plane` image, with the README's commands as written. The
/// images are the ones compose builds from the same Dockerfile targets
/// (each build takes minutes, so the suite builds them once), tagged with
/// the README's names.
#[tokio::test]
async fn the_readmes_commands_take_the_artefacts_out_of_the_images() {
    if skip() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let build = Command::new("docker")
        .args(["compose", "build", "-q", "filter", "control-plane"])
        .env("COMPOSE_PROJECT_NAME", PROJECT)
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(build.status.success(), "{build:?}");
    let readme = sglang_envoy_e2e::read_repo_file("README.md");
    for (target, name) in [
        ("control-plane", "sglang-envoy-control-plane"),
        ("filter", "sglang-envoy-filter-file"),
    ] {
        assert!(
            readme.contains(&format!("docker build --target {target} -t {name} .")),
            "the README builds {name} from the target compose builds"
        );
        let tag = docker(&["tag", &format!("{PROJECT}-{target}"), name]);
        assert!(tag.status.success(), "{tag:?}");
    }

    let dir = fresh_dir(&format!("sglang-compose-artefacts-{}", std::process::id())).unwrap();
    let commands =
        readme_block_tested_by("the_readmes_commands_take_the_artefacts_out_of_the_images");
    assert!(commands.len() >= 3, "{commands:?}");
    let mut last = String::new();
    for c in &commands {
        let out = Command::new("bash")
            .arg("-c")
            .arg(c)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{c}: {out:?}");
        last = String::from_utf8_lossy(&out.stdout).to_string();
    }
    let wasm = std::fs::read(dir.join("sglang_envoy_filter.wasm")).expect("the file came out");
    assert!(wasm.starts_with(b"\0asm"), "a wasm module");
    let exports = |name: &[u8]| wasm.windows(name.len()).any(|w| w == name);
    assert!(
        exports(b"proxy_abi_version_0_2_1") && exports(b"proxy_on_context_create"),
        "a proxy-wasm filter"
    );
    assert!(
        last.starts_with("sglang-envoy-control-plane "),
        "the control plane's image runs: {last}"
    );
    assert!(
        !docker(&["ps", "-a", "--format", "{{.Names}}"])
            .stdout
            .windows(13)
            .any(|w| w == b"sglang-filter"),
        "the README's container is removed"
    );
    for name in ["sglang-envoy-control-plane", "sglang-envoy-filter-file"] {
        docker(&["rmi", name]);
    }
}
