//! sglang-router's `--enable-trace`/`--otlp-traces-endpoint` through Envoy:
//! one launch line makes Envoy and the control plane export to the same
//! OTLP collector (a small one runs here), and a request carrying a W3C
//! `traceparent` leaves one trace: the client's span, Envoy's span under
//! it, the control plane's decision span under it, and the worker handed
//! Envoy's context.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use serde_json::json;
use sglang_envoy_e2e::{Stack, StackOptions};

/// One span as the collector received it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: String,
    parent: String,
}

#[derive(Default, Clone)]
struct Collector(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let mut spans = self.0.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    AnyValue::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push(Received {
                        service: service.clone(),
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        parent: hex(&span.parent_span_id),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::test]
async fn one_trace_spans_client_envoy_decision_and_worker() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    let server = TraceServiceServer::new(collector.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
    let stack = Stack::start(StackOptions {
        workers: 1,
        cp_args: vec![
            "--enable-trace".into(),
            "--otlp-traces-endpoint".into(),
            endpoint,
        ],
        ..Default::default()
    })
    .await
    .unwrap();

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let r = reqwest::Client::new()
        .post(stack.url("/v1/chat/completions"))
        .header("traceparent", format!("00-{trace_id}-{client_span}-01"))
        .json(&json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // The worker was handed the trace, under a span that is not the client's.
    let seen = stack.workers[0].requests().await;
    let chat = seen
        .iter()
        .find(|r| r["path"] == "/v1/chat/completions")
        .expect("the worker got the request");
    let header = chat["headers"]["traceparent"].as_str().unwrap_or_default();
    let parts: Vec<&str> = header.split('-').collect();
    assert_eq!(parts.get(1), Some(&trace_id), "{chat}");
    assert_ne!(parts.get(2), Some(&client_span), "{chat}");

    // Envoy flushes its spans every 5 s, the control plane every 0.5 s.
    let mut in_trace = Vec::new();
    for _ in 0..150 {
        in_trace = collector
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect::<Vec<_>>();
        let has = |service: &str| in_trace.iter().any(|s| s.service == service);
        if has("sglang-envoy") && has("sglang-envoy-control-plane") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let envoy: Vec<_> = in_trace
        .iter()
        .filter(|s| s.service == "sglang-envoy")
        .collect();
    let decision: Vec<_> = in_trace
        .iter()
        .filter(|s| s.service == "sglang-envoy-control-plane")
        .collect();
    assert!(
        envoy.iter().any(|s| s.parent == client_span),
        "Envoy's span is the client's child: {in_trace:#?}"
    );
    assert_eq!(decision.len(), 1, "{in_trace:#?}");
    assert_eq!(decision[0].name, "route_decision");
    assert_eq!(decision[0].parent, client_span, "{in_trace:#?}");
}
