//! What the Gateway API Inference Extension's endpoint picker protocol asks
//! of the control plane beyond routing (which the whole suite checks through
//! the picker setup, `SGLANG_ENVOY_FRONT_DOOR=picker`): gRPC health on the
//! gRPC port, and bodies far over one ext_proc message.

use serde_json::Value;
use sglang_envoy_e2e::{expect_openai_error, FrontDoor, Stack, StackOptions};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[tokio::test]
async fn grpc_health_answers_the_services_a_gateway_checks() {
    let stack = Stack::with_workers(1).await;
    if FrontDoor::current() == FrontDoor::Picker {
        // The gRPC port speaks TLS only (Envoy reached it to route this far).
        let plain = tonic::transport::Channel::from_shared(stack.grpc.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let refused = HealthClient::new(plain)
            .check(HealthCheckRequest::default())
            .await;
        assert!(refused.is_err(), "plaintext on the TLS port: {refused:?}");
    }
    let channel = tonic::transport::Channel::from_shared(stack.grpc_health.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    for service in [
        "",
        "liveness",
        "readiness",
        "inference-extension",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ] {
        let status = client
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .unwrap_or_else(|e| panic!("{service:?}: {e}"))
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = client
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

/// Gateways stream bodies to the picker and take them back in chunks of at
/// most 62,000 bytes: bodies of 100 KB and 4 MB arrive whole, edited only
/// where the router injects, whichever front door carries them.
#[tokio::test]
async fn bodies_over_one_message_arrive_whole() {
    let stack = Stack::start(StackOptions {
        workers: 1,
        max_body_bytes: 8 << 20,
        ..Default::default()
    })
    .await
    .unwrap();
    for size in [100_000, 4 << 20] {
        let text: String = (0..size).map(|i| (b'a' + (i % 26) as u8) as char).collect();
        let body = serde_json::json!({
            "text": text,
            "sampling_params": {"max_new_tokens": 1},
        })
        .to_string();
        let r = stack.post("/generate", &body).await;
        assert_eq!(
            r.status(),
            200,
            "{size}: {}",
            r.text().await.unwrap_or_default()
        );
        let seen = stack.workers[0].requests().await;
        let last = seen
            .iter()
            .rev()
            .find(|r| r["path"] == "/generate")
            .expect("recorded");
        let got: Value = serde_json::from_str(last["body"].as_str().unwrap()).unwrap();
        assert_eq!(got["text"].as_str().map(str::len), Some(size), "{size}");
        assert_eq!(got["text"].as_str(), Some(text.as_str()));
        assert_eq!(
            last["headers"]["content-length"].as_str(),
            Some(last["body"].as_str().unwrap().len().to_string().as_str()),
            "{size}: the length matches what arrived"
        );
    }
}

/// The protocol: with a subset hint the picker chooses only among those
/// endpoints; when none of them is ready (or the list is empty), 503.
#[tokio::test]
async fn a_gateways_subset_hint_is_obeyed() {
    if FrontDoor::current() != FrontDoor::Picker {
        eprintln!("skipped: the picker setup sets the hint");
        return;
    }
    let stack = Stack::with_workers(3).await;
    let chosen = stack.workers[1].address();
    let post = |hint: String, i: usize| {
        reqwest::Client::new()
            .post(stack.url("/generate"))
            .header("x-test-subset-hint", hint)
            .body(format!(r#"{{"text":"request {i}"}}"#))
            .send()
    };
    for i in 0..6 {
        let r = post(format!("10.255.0.1:9,{chosen}"), i).await.unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(stack.workers[1].served().await, 6);
    assert_eq!(
        stack.workers[0].served().await + stack.workers[2].served().await,
        0
    );
    for hint in ["10.255.0.1:9", ","] {
        let r = post(hint.to_string(), 9).await.unwrap();
        let message = expect_openai_error(r, 503).await;
        assert!(message.contains("subset"), "{message}");
    }
    assert_eq!(stack.workers[1].served().await, 6, "nothing more went out");
}
