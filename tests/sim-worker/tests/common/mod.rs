//! Starts simulated workers in-process and talks to them.

#![allow(dead_code)]

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use sglang_sim_worker::{serve, SimConfig};
use tokio::net::TcpListener;

/// A worker running in the test's runtime.
pub struct Sim {
    pub url: String,
    pub client: reqwest::Client,
}

/// Fast timing, for tests that do not measure time.
pub fn fast() -> SimConfig {
    SimConfig {
        prefill_us_per_token: 1,
        decode_us_per_token: 100,
        ..SimConfig::default()
    }
}

/// Starts a worker on a free port.
pub async fn start(config: SimConfig) -> Sim {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(serve(config, listener));
    Sim {
        url,
        client: reqwest::Client::new(),
    }
}

impl Sim {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// POSTs raw `body` to `path`.
    pub async fn post_raw(&self, path: &str, body: &str) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
    }

    /// POSTs JSON; returns the status and the JSON answer.
    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r = self.post_raw(path, &body.to_string()).await;
        let status = r.status();
        (status, r.json().await.unwrap())
    }

    /// GETs JSON.
    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Changes the `/_sim/config` switches; asserts they were accepted.
    pub async fn configure(&self, changes: Value) -> Value {
        let (status, v) = self.post("/_sim/config", changes).await;
        assert_eq!(status, 200, "{v}");
        v
    }

    pub async fn stats(&self) -> Value {
        self.get("/_sim/stats").await.1
    }

    /// The DP rank each request ran on, in the order of the request log
    /// (`/_sim/requests`).
    pub async fn ranks_run(&self) -> Vec<Value> {
        let (_, log) = self.get("/_sim/requests").await;
        log.as_array()
            .unwrap()
            .iter()
            .map(|r| r["dp_rank"].clone())
            .collect()
    }

    /// Waits until `/_sim/stats` reports nothing in flight and `/get_load`
    /// nothing running; false on timeout.
    pub async fn idle(&self) -> bool {
        for _ in 0..200 {
            let in_flight = self.stats().await["in_flight"].as_u64();
            let load = self.get("/get_load").await.1;
            let busy = load
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["num_reqs"] != 0 || r["num_tokens"] != 0);
            if in_flight == Some(0) && !busy {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }
}

/// The JSON payloads of an SSE body, `[DONE]` included as a string.
pub fn sse_events(body: &str) -> Vec<Value> {
    assert!(body.ends_with("\n\n"), "unterminated SSE body: {body:?}");
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let data = e
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {e:?}"));
            if data == "[DONE]" {
                Value::String(data.into())
            } else {
                serde_json::from_str(data).unwrap_or_else(|err| panic!("{err}: {data}"))
            }
        })
        .collect()
}

/// Asserts `r` is an error in SGLang's shape with `status`.
pub async fn assert_error(r: reqwest::Response, status: u16) -> String {
    assert_eq!(r.status().as_u16(), status);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "error", "{v}");
    assert_eq!(v["code"], status, "{v}");
    assert!(v["type"].is_string(), "{v}");
    assert!(v["param"].is_null(), "{v}");
    v["message"].as_str().unwrap().to_string()
}
