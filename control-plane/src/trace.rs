//! sglang-router's `--enable-trace` and `--otlp-traces-endpoint`: the
//! routing decision as an OpenTelemetry span, exported over OTLP/gRPC.
//! Envoy traces the request itself (the templates' OpenTelemetry tracer,
//! rendered from the same flags) and hands its context to the worker; the
//! decision span joins the client's trace through the request's W3C
//! `traceparent`, so client, Envoy, decision and worker share one trace id.

use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The service name the control plane's spans carry.
pub const SERVICE_NAME: &str = "sglang-envoy-control-plane";

/// The decision span's name.
pub const DECISION_SPAN: &str = "route_decision";

/// The log target of the decision spans (kept apart so the log output
/// does not print them).
pub const TARGET: &str = "sglang_envoy_control_plane::trace";

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
#[error("--otlp-traces-endpoint {endpoint}: {reason}")]
pub struct TraceError {
    endpoint: String,
    reason: String,
}

/// The tracer provider exporting to `endpoint` (`host:port`, as
/// sglang-router takes it, or a URL). Must be made inside the tokio
/// runtime; spans are batched and sent every half second.
pub fn provider(endpoint: &str) -> Result<SdkTracerProvider, TraceError> {
    let url = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(url)
        .with_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| TraceError {
            endpoint: endpoint.to_string(),
            reason: e.to_string(),
        })?;
    let batches = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(Duration::from_millis(500))
                .build(),
        )
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(batches)
        .with_resource(Resource::builder().with_service_name(SERVICE_NAME).build())
        .build())
}

/// The tracing layer that turns spans into OpenTelemetry spans.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer(SERVICE_NAME))
}

/// A decision span, child of the request's `traceparent` when it has a
/// valid one (a new trace otherwise).
pub fn decision_span(path: &str, ticket: u64, traceparent: &str) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        DECISION_SPAN,
        "http.route" = path,
        ticket,
        worker = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    if !traceparent.is_empty() {
        let carrier =
            std::collections::HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
        let parent = TraceContextPropagator::new().extract(&carrier);
        // Not parented (a malformed header): the span starts its own trace.
        let _ = span.set_parent(parent);
    }
    span
}
