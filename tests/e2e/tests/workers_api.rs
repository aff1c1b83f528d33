//! The JSON `/workers` API in sglang-router 0.3.2's shapes (what its own
//! integration suite and discovery shims call): 202 + `Location` +
//! `worker_id` on POST, `GET /workers/{id}` with `is_healthy`, 202 on
//! DELETE by id, 404/400 as OpenAI JSON; ids kept across restarts;
//! workers not reachable yet registered in the background.

use std::time::Duration;

use serde_json::{json, Value};
use sglang_envoy_e2e::{
    expect_openai_error, free_port, wait_until, SimWorker, Stack, StackOptions,
};

const TOKEN: &str = "workers-api-token";
const GEN: &str = r#"{"text":"hello","sampling_params":{"max_new_tokens":1}}"#;

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn json_of(r: reqwest::Response) -> Value {
    r.json().await.expect("a JSON body")
}

/// Polls `GET {base}/workers/{id}` until `is_healthy`.
async fn wait_healthy(base: &str, id: &str) -> bool {
    wait_until(Duration::from_secs(10), || async move {
        match reqwest::get(format!("{base}/workers/{id}")).await {
            Ok(r) if r.status() == 200 => {
                r.json::<Value>()
                    .await
                    .ok()
                    .map(|v| v["is_healthy"] == true)
                    == Some(true)
            }
            _ => false,
        }
    })
    .await
}

#[tokio::test]
async fn add_get_list_and_delete_by_id_through_envoy() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        policy: "round_robin".into(),
        cp_args: vec!["--admin-token".into(), TOKEN.into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let first = &stack.workers[0];

    let list = stack.get_json("/workers").await;
    assert_eq!(list["total"], 1);
    assert_eq!(list["stats"]["regular_count"], 1);
    let w0 = &list["workers"][0];
    assert_eq!(w0["url"], first.url.as_str());
    assert_eq!(w0["is_healthy"], true);
    assert_eq!(w0["worker_type"], "regular");
    assert_eq!(w0["connection_mode"], "HTTP");
    let id0 = w0["id"].as_str().expect("an id").to_string();
    assert_eq!(id0.len(), 36, "a UUID: {id0}");

    // Add a second worker by its URL: 202, Location, worker_id.
    let extra = SimWorker::start(&stack.dir, &[]).await.unwrap();
    let r = client()
        .post(stack.url("/workers"))
        .bearer_auth(TOKEN)
        .json(&json!({"url": extra.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let location = r
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("a Location header")
        .to_string();
    let body = json_of(r).await;
    assert_eq!(body["status"], "accepted");
    let id = body["worker_id"].as_str().expect("worker_id").to_string();
    assert_eq!(location, format!("/workers/{id}"));
    assert_eq!(body["location"], location.as_str());
    assert_eq!(body["url"], extra.url.as_str());
    assert!(body["message"].is_string());
    assert_ne!(id, id0);

    // The same URL again: the same id, nothing added.
    let again = client()
        .post(stack.url("/workers"))
        .bearer_auth(TOKEN)
        .json(&json!({"url": extra.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 202);
    assert_eq!(json_of(again).await["worker_id"], id.as_str());

    assert!(wait_healthy(&stack.base, &id).await, "never healthy");
    let one = stack.get_json(&format!("/workers/{id}")).await;
    assert_eq!(one["id"], id.as_str());
    assert_eq!(one["url"], extra.url.as_str());
    assert_eq!(one["worker_type"], "regular");
    assert_eq!(one["healthy"], true, "our older field stays");
    assert!(one["load"].is_u64());
    assert_eq!(stack.get_json("/workers").await["total"], 2);
    for _ in 0..4 {
        assert_eq!(stack.post("/generate", GEN).await.status(), 200);
    }
    assert_eq!(
        extra.served().await,
        2,
        "round robin reaches the new worker"
    );

    // Unknown and malformed ids: OpenAI JSON errors, GET and DELETE alike.
    let unknown = "0b5f1e0e-35b8-4b4e-9a37-2d4d5bb0a001";
    let r = reqwest::get(stack.url(&format!("/workers/{unknown}")))
        .await
        .unwrap();
    assert!(expect_openai_error(r, 404).await.contains(unknown));
    let r = reqwest::get(stack.url("/workers/not-a-uuid"))
        .await
        .unwrap();
    assert!(expect_openai_error(r, 400).await.contains("UUID"));
    let r = client()
        .delete(stack.url(&format!("/workers/{unknown}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 404).await;
    let r = client()
        .delete(stack.url("/workers/not-a-uuid"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 400).await;
    // A method the API does not take is a JSON 405, not an empty one.
    let r = client()
        .put(stack.admin_url(&format!("/workers/{id}")))
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 405).await;

    // Still the secure default: no token, no change.
    let r = client()
        .delete(stack.url(&format!("/workers/{id}")))
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 401).await;

    let r = client()
        .delete(stack.url(&format!("/workers/{id}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let body = json_of(r).await;
    assert_eq!(body["status"], "accepted");
    assert_eq!(body["worker_id"], id.as_str());
    let r = reqwest::get(stack.url(&format!("/workers/{id}")))
        .await
        .unwrap();
    expect_openai_error(r, 404).await;
    let list = stack.get_json("/workers").await;
    assert_eq!(list["total"], 1);
    assert_eq!(list["workers"][0]["id"], id0.as_str());
    for _ in 0..4 {
        assert_eq!(stack.post("/generate", GEN).await.status(), 200);
    }
    assert_eq!(extra.served().await, 2, "a removed worker gets nothing");
    assert_eq!(first.served().await, 6);
}

#[tokio::test]
async fn ids_survive_a_control_plane_restart() {
    let mut stack = Stack::start(StackOptions {
        workers: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let extra = SimWorker::start(&stack.dir, &[]).await.unwrap();
    let r = client()
        .post(stack.admin_url("/workers"))
        .json(&json!({"url": extra.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let added = json_of(r).await["worker_id"].as_str().unwrap().to_string();
    let ids = |v: &Value| -> Vec<(String, String)> {
        let mut ids: Vec<_> = v["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|w| {
                (
                    w["url"].as_str().unwrap_or_default().to_string(),
                    w["id"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        ids.sort();
        ids
    };
    // The state file is written when the registry changes.
    let state = stack.dir.join("workers.json");
    let (state, added_ref) = (&state, added.as_str());
    assert!(
        wait_until(Duration::from_secs(5), || async move {
            std::fs::read_to_string(state).is_ok_and(|t| t.contains(added_ref))
        })
        .await
    );
    let before = ids(&stack.get_json("/workers").await);
    assert_eq!(before.len(), 2);
    stack.restart_control_plane().await.unwrap();
    let after = ids(&reqwest::get(stack.admin_url("/workers"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap());
    assert_eq!(after, before, "ids changed across the restart");
    assert!(wait_healthy(&stack.admin, &added).await);
}

#[tokio::test]
async fn a_dp_aware_worker_that_is_not_up_yet_registers_in_the_background() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        worker_args: vec!["--dp-size".into(), "2".into()],
        cp_args: vec!["--dp-aware".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let r = client()
        .post(stack.admin_url("/workers"))
        .json(&json!({"url": url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let id = json_of(r).await["worker_id"].as_str().unwrap().to_string();
    let pending = stack.get_json(&format!("/workers/{id}")).await;
    assert_eq!(pending["is_healthy"], false);
    assert_eq!(pending["job_status"]["job_type"], "AddWorker");
    assert_eq!(pending["job_status"]["status"], "processing");
    assert_eq!(pending["job_status"]["worker_url"], url.as_str());
    assert_eq!(
        stack.get_json("/workers").await["pending"][0]["id"],
        id.as_str()
    );

    let late = SimWorker::spawn(&stack.dir, port, &["--dp-size".into(), "2".into()]).unwrap();
    late.wait_healthy(Duration::from_secs(20)).await.unwrap();
    assert!(wait_healthy(&stack.base, &id).await, "never registered");
    let one = stack.get_json(&format!("/workers/{id}")).await;
    assert!(one.get("job_status").is_none(), "{one}");
    assert_eq!(one["metadata"]["dp_size"], "2");
    assert_eq!(one["units"].as_array().map(Vec::len), Some(2));
    assert_eq!(stack.get_json("/workers").await["total"], 4);

    // A registration still waiting can be called off.
    let never = format!("http://127.0.0.1:{}", free_port());
    let r = client()
        .post(stack.admin_url("/workers"))
        .json(&json!({"url": never}))
        .send()
        .await
        .unwrap();
    let id = json_of(r).await["worker_id"].as_str().unwrap().to_string();
    let r = client()
        .delete(stack.admin_url(&format!("/workers/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let r = reqwest::get(stack.url(&format!("/workers/{id}")))
        .await
        .unwrap();
    expect_openai_error(r, 404).await;
}
