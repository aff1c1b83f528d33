//! The picker protocol through the ext_proc front door: the destination in
//! metadata, full-duplex bodies, the subset hint and the served endpoint.

use super::*;

/// The destination in the dynamic metadata (`envoy.lb`), if any.
fn metadata_destination(r: &ProcessingResponse) -> Option<String> {
    let lb = r.dynamic_metadata.as_ref()?.fields.get("envoy.lb")?;
    let Some(value::Kind::StructValue(lb)) = &lb.kind else {
        return None;
    };
    match &lb.fields.get(ENDPOINT_HEADER)?.kind {
        Some(value::Kind::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

/// A streamed body reply's bytes and end flag.
fn streamed(r: &ProcessingResponse) -> (Vec<u8>, bool) {
    match common(r)
        .body_mutation
        .as_ref()
        .and_then(|m| m.mutation.as_ref())
    {
        Some(body_mutation::Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
        other => panic!("not a streamed body: {other:?}"),
    }
}

#[test]
fn the_envoy_config_may_say_its_cluster_walks_a_list() {
    use super::super::destination_said;
    use sglang_envoy_lifecycle::Destination;
    assert_eq!(destination_said(None, Destination::One), Destination::One);
    assert_eq!(
        destination_said(Some(" list "), Destination::One),
        Destination::List
    );
    assert_eq!(
        destination_said(Some("one"), Destination::List),
        Destination::One
    );
    assert_eq!(
        destination_said(Some("many"), Destination::One),
        Destination::One,
        "an unknown word leaves the flag's choice"
    );
}

#[tokio::test]
async fn the_destination_is_in_the_header_and_identical_in_the_metadata() {
    let e = engine(2);
    let mut s = Stream::open(&e, 1 << 20);
    s.ask(post("/generate")).await;
    let r = s.ask(body(r#"{"text":"x"}"#)).await;
    let header = set(&r, ENDPOINT_HEADER).unwrap();
    assert_eq!(metadata_destination(&r), Some(header));
    s.end(false).await;

    let mut s = Stream::open(&e, 100);
    let r = s.ask(models()).await;
    assert_eq!(metadata_destination(&r), set(&r, ENDPOINT_HEADER));
    assert!(metadata_destination(&r).is_some());
    s.end(false).await;
}

/// Gateways stream both bodies to an endpoint picker in full duplex: the
/// head's reply waits for the whole body, then the body comes back, edited,
/// in chunks under 64 KiB; the answer comes back chunk by chunk.
#[tokio::test]
async fn full_duplex_bodies_are_gathered_decided_and_streamed_back() {
    let e = engine(2);
    let mut s = Stream::open(&e, 1 << 20);
    let duplex = BodySendMode::FullDuplexStreamed as i32;
    let first = ProcessingRequest {
        request: Some(post("/generate")),
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: duplex,
            response_body_mode: duplex,
            ..Default::default()
        }),
        ..Default::default()
    };
    s.to.as_ref().unwrap().send(Ok(first)).await.unwrap();
    let text = "y".repeat(100_000);
    let client_body = format!(r#"{{"text":"{text}", "temperature": 0.70}}"#);
    let (a, b) = client_body.as_bytes().split_at(70_000);
    for (part, end) in [(a, false), (b, true)] {
        s.send(In::RequestBody(HttpBody {
            body: part.to_vec(),
            end_of_stream: end,
            ..Default::default()
        }))
        .await;
    }
    // Nothing is answered before the body's end: the head's reply first.
    let head = s.from.recv().await.unwrap().unwrap();
    assert!(
        matches!(head.response, Some(Out::RequestHeaders(_))),
        "{head:?}"
    );
    assert!(common(&head).clear_route_cache);
    let endpoints = set(&head, ENDPOINT_HEADER).unwrap();
    assert_eq!(metadata_destination(&head), Some(endpoints));
    let mut sent = Vec::new();
    loop {
        let r = s.from.recv().await.unwrap().unwrap();
        assert!(matches!(r.response, Some(Out::RequestBody(_))), "{r:?}");
        let (bytes, end) = streamed(&r);
        assert!(
            !bytes.is_empty() && bytes.len() <= 62_000,
            "{}",
            bytes.len()
        );
        sent.extend(bytes);
        if end {
            break;
        }
    }
    let sent = String::from_utf8(sent).unwrap();
    assert!(
        sent.contains(r#""routed_dp_rank":0"#),
        "the rank is injected"
    );
    assert!(sent.contains(&text) && sent.contains(r#""temperature": 0.70"#));
    assert_eq!(set(&head, "content-length"), Some(sent.len().to_string()));
    assert_eq!(total_load(&e), 1);

    s.ask(In::ResponseHeaders(headers(
        &[(":status", "200"), ("content-type", "application/json")],
        false,
    )))
    .await;
    for (chunk, end) in [(&b"{\"text\":"[..], false), (&b"\"ok\"}"[..], true)] {
        let r = s
            .ask(In::ResponseBody(HttpBody {
                body: chunk.to_vec(),
                end_of_stream: end,
                ..Default::default()
            }))
            .await;
        assert_eq!(streamed(&r), (chunk.to_vec(), end), "answer chunks pass");
    }
    s.end(false).await;
    assert_eq!(total_load(&e), 0);
}

#[tokio::test]
async fn full_duplex_trailers_while_the_body_is_read_are_refused() {
    let e = engine(1);
    let mut s = Stream::open(&e, 1 << 20);
    let first = ProcessingRequest {
        request: Some(post("/generate")),
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: BodySendMode::FullDuplexStreamed as i32,
            ..Default::default()
        }),
        ..Default::default()
    };
    s.to.as_ref().unwrap().send(Ok(first)).await.unwrap();
    s.send(In::RequestBody(HttpBody {
        body: br#"{"text":"x"}"#.to_vec(),
        end_of_stream: false,
        ..Default::default()
    }))
    .await;
    let r = s.ask(In::RequestTrailers(Default::default())).await;
    assert_eq!(immediate(&r).0, 400);
    s.end(false).await;
    assert_eq!(total_load(&e), 0);
    assert_eq!(e.in_flight(), 0);
}

#[test]
fn the_served_endpoint_comes_from_the_gateways_metadata() {
    use envoy_types::pb::envoy::config::core::v3::Metadata;
    let lb = Struct {
        fields: [(
            "x-gateway-destination-endpoint-served".to_string(),
            envoy_types::pb::google::protobuf::Value {
                kind: Some(value::Kind::StringValue("10.0.0.3:8000".into())),
            },
        )]
        .into(),
    };
    let metadata = Metadata {
        filter_metadata: [("envoy.lb".to_string(), lb)].into(),
        ..Default::default()
    };
    assert_eq!(
        crate::ext_proc::messages::served(Some(&metadata)).as_deref(),
        Some("10.0.0.3:8000")
    );
    assert_eq!(crate::ext_proc::messages::served(None), None);
    assert_eq!(
        crate::ext_proc::messages::served(Some(&Metadata::default())),
        None
    );
}

#[tokio::test]
async fn the_subset_hint_in_the_streams_metadata_narrows_the_choice() {
    use envoy_types::pb::envoy::config::core::v3::Metadata;
    use envoy_types::pb::google::protobuf::{ListValue, Value};
    let text = |s: &str| Value {
        kind: Some(value::Kind::StringValue(s.to_string())),
    };
    let hint = |endpoints: Vec<Value>| Metadata {
        filter_metadata: [(
            "envoy.lb.subset_hint".to_string(),
            Struct {
                fields: [(
                    "x-gateway-destination-endpoint-subset".to_string(),
                    Value {
                        kind: Some(value::Kind::ListValue(ListValue { values: endpoints })),
                    },
                )]
                .into(),
            },
        )]
        .into(),
        ..Default::default()
    };
    let e = engine(3);
    for (metadata, expect) in [
        (hint(vec![text("127.0.0.1:2")]), Some("127.0.0.1:2")),
        (hint(vec![]), None),
        (hint(vec![text("10.1.1.1:80")]), None),
    ] {
        let mut s = Stream::open(&e, 1 << 20);
        let first = ProcessingRequest {
            request: Some(post("/generate")),
            metadata_context: Some(metadata),
            ..Default::default()
        };
        s.to.as_ref().unwrap().send(Ok(first)).await.unwrap();
        s.from.recv().await.unwrap().unwrap();
        let r = s.ask(body(r#"{"text":"x"}"#)).await;
        match expect {
            Some(endpoint) => {
                let endpoints = set(&r, ENDPOINT_HEADER).unwrap();
                assert!(endpoints.split(',').all(|e| e == endpoint), "{endpoints}");
            }
            None => assert_eq!(immediate(&r).0, 503),
        }
        s.end(false).await;
    }
    assert_eq!(total_load(&e), 0);
}
