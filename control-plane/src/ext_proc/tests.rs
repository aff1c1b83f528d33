//! The ext_proc front door against a real engine, message by message.
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request, BodyResponse, CommonResponse, HttpBody, HttpHeaders, ProcessingRequest,
    ProcessingResponse, ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::{value, Struct};
use sglang_envoy_lifecycle::names::ENDPOINT_HEADER;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::messages::{nothing_more, Attributes, ATTRIBUTES_KEY, UPSTREAM_ADDRESS};
use super::Exchange;
use crate::body_budget::BodyBudget;
use crate::engine::tests::engine_with;
use crate::engine::Engine;
use crate::engine::EngineOptions;
use crate::workers::WorkerSpec;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Out;
use processing_request::Request as In;

mod picker;

/// `workers` healthy loopback servers of two DP ranks each.
fn engine(workers: u16) -> Arc<Engine> {
    let servers: Vec<_> = (1..=workers)
        .map(|port| (port, WorkerSpec::REGULAR, Some(2)))
        .collect();
    Arc::new(engine_with(EngineOptions::default(), &servers))
}

/// One ext_proc stream against `engine`: send Envoy's messages, read
/// the answers.
struct Stream {
    to: Option<mpsc::Sender<Result<ProcessingRequest, Status>>>,
    from: mpsc::Receiver<Result<ProcessingResponse, Status>>,
    done: tokio::task::JoinHandle<()>,
}

impl Stream {
    fn open(engine: &Arc<Engine>, max_body_bytes: usize) -> Stream {
        Stream::open_with(engine, max_body_bytes, BodyBudget::new(usize::MAX))
    }

    /// A stream sharing `budget` with others.
    fn open_with(engine: &Arc<Engine>, max_body_bytes: usize, budget: Arc<BodyBudget>) -> Stream {
        let exchange = Exchange::new(
            engine.clone(),
            rand::random::<u64>() | 1,
            max_body_bytes,
            budget,
        );
        let (to, inbound) = mpsc::channel(4);
        let (tx, from) = mpsc::channel(4);
        let done = tokio::spawn(exchange.run(ReceiverStream::new(inbound), tx));
        Stream {
            to: Some(to),
            from,
            done,
        }
    }

    async fn ask(&mut self, request: In) -> ProcessingResponse {
        self.send(request).await;
        self.from.recv().await.unwrap().unwrap()
    }

    async fn send(&mut self, request: In) {
        let message = ProcessingRequest {
            request: Some(request),
            ..Default::default()
        };
        self.to.as_ref().unwrap().send(Ok(message)).await.unwrap();
    }

    /// Envoy ends the stream (cleanly or with a reset).
    async fn end(mut self, reset: bool) {
        if reset {
            let _ = self
                .to
                .as_ref()
                .unwrap()
                .send(Err(Status::internal("reset")))
                .await;
        }
        self.to = None;
        self.done.await.unwrap();
    }
}

fn headers(list: &[(&str, &str)], end_of_stream: bool) -> HttpHeaders {
    HttpHeaders {
        headers: Some(HeaderMap {
            headers: list
                .iter()
                .map(|(k, v)| HeaderValue {
                    key: k.to_string(),
                    raw_value: v.as_bytes().to_vec(),
                    ..Default::default()
                })
                .collect(),
        }),
        end_of_stream,
        ..Default::default()
    }
}

fn post(path: &str) -> In {
    In::RequestHeaders(headers(
        &[
            (":method", "POST"),
            (":path", path),
            ("x-request-id", "r1"),
            (ENDPOINT_HEADER, "10.0.0.1:1"),
        ],
        false,
    ))
}

/// `GET /v1/models`: routed at its head.
fn models() -> In {
    In::RequestHeaders(headers(
        &[(":method", "GET"), (":path", "/v1/models")],
        true,
    ))
}

fn body(text: &str) -> In {
    In::RequestBody(HttpBody {
        body: text.as_bytes().to_vec(),
        end_of_stream: true,
        ..Default::default()
    })
}

fn common(r: &ProcessingResponse) -> &CommonResponse {
    match &r.response {
        Some(Out::RequestHeaders(h)) | Some(Out::ResponseHeaders(h)) => {
            h.response.as_ref().unwrap()
        }
        Some(Out::RequestBody(b)) | Some(Out::ResponseBody(b)) => b.response.as_ref().unwrap(),
        other => panic!("not a common response: {other:?}"),
    }
}

fn set(r: &ProcessingResponse, name: &str) -> Option<String> {
    common(r)
        .header_mutation
        .as_ref()?
        .set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == name)
        .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
}

fn immediate(r: &ProcessingResponse) -> (i32, serde_json::Value) {
    match &r.response {
        Some(Out::ImmediateResponse(i)) => (
            i.status.as_ref().unwrap().code,
            serde_json::from_slice(&i.body).unwrap(),
        ),
        other => panic!("not an immediate response: {other:?}"),
    }
}

fn total_load(e: &Engine) -> u64 {
    e.registry().all().iter().map(|w| w.load() as u64).sum()
}

fn metrics(e: &Engine) -> String {
    e.metrics().render(&e.registry().all(), None)
}

#[tokio::test]
async fn routes_on_the_body_injects_the_rank_and_releases_the_load() {
    let e = engine(2);
    let mut s = Stream::open(&e, 1 << 20);
    let r = s.ask(post("/generate?x=1")).await;
    assert_eq!(
        common(&r).header_mutation.as_ref().unwrap().remove_headers,
        [ENDPOINT_HEADER],
        "a client's endpoint header is dropped"
    );
    let client_body = r#"{"text":"hello", "temperature": 0.70}"#;
    let r = s.ask(body(client_body)).await;
    let endpoints = set(&r, ENDPOINT_HEADER).unwrap();
    assert_eq!(
        endpoints, "127.0.0.1:1",
        "the chosen endpoint alone: what every gateway takes"
    );
    assert_eq!(set(&r, "x-envoy-max-retries").as_deref(), Some("4"));
    let Some(body_mutation::Mutation::Body(new_body)) = common(&r)
        .body_mutation
        .as_ref()
        .and_then(|m| m.mutation.clone())
    else {
        panic!("the rank is injected: {r:?}");
    };
    let text = String::from_utf8(new_body).unwrap();
    assert!(text.contains(r#""temperature": 0.70"#), "{text}");
    assert!(text.contains(r#""routed_dp_rank":0"#), "{text}");
    assert_eq!(set(&r, "content-length"), Some(text.len().to_string()));
    assert_eq!(total_load(&e), 1);

    let r = s
        .ask(In::ResponseHeaders(headers(
            &[(":status", "200"), ("content-type", "application/json")],
            false,
        )))
        .await;
    assert!(r.mode_override.is_none(), "JSON bodies are not sent to us");
    s.end(true).await;
    assert_eq!(total_load(&e), 0);
    assert_eq!(e.in_flight(), 0);
    assert!(!metrics(&e).contains("client_cancelled"));
}

#[tokio::test]
async fn sse_is_followed_to_its_last_chunk_and_a_hang_up_counts_as_cancelled() {
    let e = engine(1);
    for finish in [true, false] {
        let mut s = Stream::open(&e, 1 << 20);
        s.ask(post("/v1/completions")).await;
        s.ask(body(r#"{"prompt":"p","stream":true}"#)).await;
        let r = s
            .ask(In::ResponseHeaders(headers(
                &[(":status", "200"), ("content-type", "text/event-stream")],
                false,
            )))
            .await;
        assert_eq!(
            r.mode_override.as_ref().map(|m| m.response_body_mode),
            Some(BodySendMode::Streamed as i32)
        );
        let chunk = |end| {
            In::ResponseBody(HttpBody {
                body: b"data: {}\n\n".to_vec(),
                end_of_stream: end,
                ..Default::default()
            })
        };
        let r = s.ask(chunk(false)).await;
        assert_eq!(
            r.response,
            Some(Out::ResponseBody(BodyResponse::default())),
            "chunks pass unchanged"
        );
        if finish {
            s.ask(chunk(true)).await;
        }
        assert_eq!(total_load(&e), 1);
        s.end(false).await;
        assert_eq!(total_load(&e), 0);
        assert_eq!(metrics(&e).contains("client_cancelled"), !finish);
    }
}

#[tokio::test]
async fn unusable_requests_get_openai_errors_and_count_nothing() {
    let e = engine(1);
    let cases: Vec<(Vec<In>, i32, &str)> = vec![
        (
            vec![In::RequestHeaders(headers(
                &[(":method", "GET"), (":path", "/generate")],
                true,
            ))],
            405,
            "POST",
        ),
        (
            vec![In::RequestHeaders(headers(
                &[(":method", "POST"), (":path", "/generate")],
                true,
            ))],
            400,
            "body is required",
        ),
        (
            vec![In::RequestHeaders(headers(
                &[
                    (":method", "POST"),
                    (":path", "/generate"),
                    ("content-length", "101"),
                ],
                false,
            ))],
            413,
            "limit of 100 bytes",
        ),
        (
            vec![post("/generate"), body(&"x".repeat(101))],
            413,
            "limit of 100 bytes",
        ),
        (
            vec![post("/v1/chat/completions"), body("{\"messages\": [")],
            400,
            "not valid JSON",
        ),
    ];
    for (messages, status, part) in cases {
        let mut s = Stream::open(&e, 100);
        let mut last = None;
        for m in messages {
            last = Some(s.ask(m).await);
        }
        let (code, error) = immediate(&last.unwrap());
        assert_eq!(code, status);
        assert_eq!(error["error"]["code"], status);
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(part), "{message}");
        s.end(true).await;
    }
    assert_eq!(total_load(&e), 0);
    assert_eq!(e.in_flight(), 0);
}

#[tokio::test]
async fn no_worker_is_a_503_and_info_routes_are_routed_at_the_headers() {
    let e = engine(0);
    let mut s = Stream::open(&e, 100);
    s.ask(post("/generate")).await;
    let (code, _) = immediate(&s.ask(body(r#"{"text":"x"}"#)).await);
    assert_eq!(code, 503);
    s.end(true).await;

    let e = engine(1);
    let mut s = Stream::open(&e, 100);
    let r = s.ask(models()).await;
    assert_eq!(set(&r, ENDPOINT_HEADER).as_deref(), Some("127.0.0.1:1"));
    assert_eq!(r.mode_override, Some(nothing_more()));
    s.end(false).await;
    assert_eq!(e.in_flight(), 0);

    // Paths the router does not serve never reach a worker.
    for (method, path) in [("POST", "/flush_cache"), ("GET", "/_sim/requests")] {
        let mut s = Stream::open(&e, 100);
        let r = s
            .ask(In::RequestHeaders(headers(
                &[(":method", method), (":path", path)],
                false,
            )))
            .await;
        assert_eq!(immediate(&r).0, 404, "{path}");
        s.end(false).await;
    }
    assert_eq!(e.in_flight(), 0);
}

#[tokio::test]
async fn a_stream_cut_before_the_response_releases_the_load() {
    let e = engine(2);
    let mut s = Stream::open(&e, 1 << 20);
    s.ask(post("/generate")).await;
    s.ask(body(r#"{"text":"x"}"#)).await;
    assert_eq!(total_load(&e), 1);
    s.end(true).await;
    assert_eq!(total_load(&e), 0);
    assert!(metrics(&e).contains("client_cancelled"));
}

#[test]
fn upstream_address_comes_from_the_response_attributes() {
    let mut fields = std::collections::HashMap::new();
    fields.insert(
        UPSTREAM_ADDRESS.to_string(),
        envoy_types::pb::google::protobuf::Value {
            kind: Some(value::Kind::StringValue("10.0.0.2:30000".into())),
        },
    );
    let mut attributes = std::collections::HashMap::new();
    attributes.insert(ATTRIBUTES_KEY.to_string(), Struct { fields });
    assert_eq!(
        Attributes::of(&attributes).upstream_host.as_deref(),
        Some("10.0.0.2:30000")
    );
    assert_eq!(Attributes::of(&Default::default()), Attributes::default());
}

#[tokio::test]
async fn a_body_declared_over_the_free_budget_is_refused_at_its_head() {
    // In BUFFERED mode Envoy gathers the whole body before the control
    // plane sees a byte of it: one that cannot fit is refused at its head,
    // before its upload (the CI run of 2026-11-26 had 20 MB uploads waiting
    // over 20 s for a refusal that came after them).
    let e = engine(1);
    let budget = BodyBudget::new(100);
    let post_of = |len: &str| {
        In::RequestHeaders(headers(
            &[
                (":method", "POST"),
                (":path", "/generate"),
                ("content-length", len),
            ],
            false,
        ))
    };
    let mut holder = Stream::open_with(&e, 1000, budget.clone());
    let r = holder.ask(post_of("60")).await;
    assert!(matches!(r.response, Some(Out::RequestHeaders(_))), "{r:?}");
    assert_eq!(budget.used(), 60);

    let mut late = Stream::open_with(&e, 1000, budget.clone());
    let (code, error) = immediate(&late.ask(post_of("50")).await);
    assert_eq!(code, 503);
    assert_eq!(error["error"]["code"], 503);
    assert_eq!(budget.used(), 60);
    late.end(true).await;

    // The holder's body arriving in parts keeps its one hold.
    holder
        .send(In::RequestBody(HttpBody {
            body: vec![b' '; 30],
            end_of_stream: false,
            ..Default::default()
        }))
        .await;
    holder.end(true).await;
    assert_eq!(budget.used(), 0);

    let mut after = Stream::open_with(&e, 1000, budget.clone());
    let r = after.ask(post_of("50")).await;
    assert!(matches!(r.response, Some(Out::RequestHeaders(_))), "{r:?}");
    after.end(true).await;
    assert_eq!(budget.used(), 0);
    assert_eq!(e.in_flight(), 0);
}
