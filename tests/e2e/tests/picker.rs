//! What the Gateway API Inference Extension's endpoint picker protocol asks
//! of the control plane beyond routing (which the whole suite checks through
//! the picker setup, `SGLANG_ENVOY_FRONT_DOOR=picker`): gRPC health on the
//! gRPC port, and bodies far over one ext_proc message.

use serde_json::Value;
use sglang_envoy_e2e::{Stack, StackOptions};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[tokio::test]
async fn grpc_health_answers_the_services_a_gateway_checks() {
    let stack = Stack::with_workers(1).await;
    let channel = tonic::transport::Channel::from_shared(stack.grpc.clone())
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
