//! ext_proc replies as Envoy wants them, built from what the lifecycle says.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderMap, HeaderValue, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::{
    processing_mode::{BodySendMode, HeaderSendMode},
    ProcessingMode,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation,
    HeadersResponse, ImmediateResponse, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{value, Duration as ProtoDuration, Struct, Value};
use sglang_envoy_lifecycle::names::{ENDPOINT_HEADER, ERROR_CODE_HEADER, ERROR_HEADER};
use sglang_envoy_lifecycle::{LocalReply, Release, Watch};

use super::MAX_PREFILL_WAIT;

/// The attribute map key Envoy files `response_attributes` under.
pub(super) const ATTRIBUTES_KEY: &str = "envoy.filters.http.ext_proc";

/// The attribute holding the client's address (`request_attributes`).
pub(super) const SOURCE_ADDRESS: &str = "source.address";

/// The attribute holding the worker Envoy finally used.
pub(super) const UPSTREAM_ADDRESS: &str = "upstream.address";

/// The attribute holding how many attempts Envoy made.
const ATTEMPT_COUNT: &str = "upstream.request_attempt_count";

/// The attribute saying where the response came from (`via_upstream`, or
/// why Envoy made it).
const CODE_DETAILS: &str = "response.code_details";

/// The metadata namespace of the picker protocol's destination (and of
/// the endpoint that served, which Envoy sends back under it).
pub(super) const LB_NAMESPACE: &str = "envoy.lb";

/// The key, in [`LB_NAMESPACE`] of the stream's metadata, of the endpoint
/// that served the request (the gateway may have retried down the list).
const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";

/// The destination as dynamic metadata, for gateways whose `override_host`
/// reads it there: `envoy.lb` / `x-gateway-destination-endpoint`, the same
/// text as the header (the protocol forbids the two to differ).
pub(super) fn destination(endpoints: &str) -> Struct {
    let inner = Struct {
        fields: HashMap::from([(ENDPOINT_HEADER.to_string(), text_value(endpoints))]),
    };
    Struct {
        fields: HashMap::from([(
            LB_NAMESPACE.to_string(),
            Value {
                kind: Some(value::Kind::StructValue(inner)),
            },
        )]),
    }
}

fn text_value(text: &str) -> Value {
    Value {
        kind: Some(value::Kind::StringValue(text.to_string())),
    }
}

/// The endpoint that served the request, when the gateway says
/// (`envoy.lb` / `x-gateway-destination-endpoint-served` in the stream's
/// metadata).
pub(super) fn served(metadata: Option<&Metadata>) -> Option<String> {
    let fields = &metadata?.filter_metadata.get(LB_NAMESPACE)?.fields;
    match fields.get(SERVED_KEY)?.kind.as_ref()? {
        value::Kind::StringValue(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        _ => None,
    }
}

/// The namespace and key of the picker protocol's subset hint, in the
/// stream's metadata: the endpoints a request may go to.
const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";

/// The gateway's subset hint, when it gives one: a list of `ip:port`
/// (a comma-separated text is taken too). Present but empty is a hint
/// nothing can meet.
pub(super) fn subset_hint(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    let fields = &metadata?.filter_metadata.get(SUBSET_NAMESPACE)?.fields;
    let endpoint = |text: &str| {
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_string())
    };
    Some(match fields.get(SUBSET_KEY)?.kind.as_ref()? {
        value::Kind::ListValue(list) => list
            .values
            .iter()
            .filter_map(|v| match v.kind.as_ref() {
                Some(value::Kind::StringValue(s)) => endpoint(s),
                _ => None,
            })
            .collect(),
        value::Kind::StringValue(s) => s.split(',').filter_map(endpoint).collect(),
        _ => Vec::new(),
    })
}

/// The headers of the router's own reply: its JSON, the marker Envoy's
/// `local_reply_config` keeps such replies by, and smg's error code.
fn reply_headers(reply: &LocalReply) -> Vec<HeaderValueOption> {
    let mut headers = vec![
        set_header("content-type", "application/json"),
        set_header(ERROR_HEADER, &reply.kind),
    ];
    if !reply.code.is_empty() {
        headers.push(set_header(ERROR_CODE_HEADER, &reply.code));
    }
    headers
}

/// The reply ending the request with the router's own error.
pub(super) fn immediate(reply: &LocalReply) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ImmediateResponse(
            ImmediateResponse {
                status: Some(HttpStatus {
                    code: i32::from(reply.status),
                }),
                headers: Some(HeaderMutation {
                    set_headers: reply_headers(reply),
                    ..Default::default()
                }),
                body: reply.json().into_bytes(),
                details: format!("sglang_router_{}", reply.status),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// The reply letting the answer's head go, asking Envoy for as much of
/// its body as the lifecycle must see (none once the answer has ended).
pub(super) fn release(release: Release, ended: bool) -> ProcessingResponse {
    let body_mode = match release.watch {
        _ if ended => BodySendMode::None,
        Watch::Nothing => BodySendMode::None,
        Watch::Chunks => BodySendMode::Streamed,
        Watch::Whole => BodySendMode::Buffered,
    };
    let mut mutation = HeaderMutation::default();
    if release.strip_length {
        mutation.remove_headers.push("content-length".to_string());
    }
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseHeaders(
            headers_response(mutation),
        )),
        mode_override: (body_mode != BodySendMode::None).then(|| ProcessingMode {
            response_body_mode: body_mode as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Asks Envoy to wait up to `limit` (at most [`MAX_PREFILL_WAIT`]) for the
/// answer to the message in flight.
pub(super) fn extend_timeout(limit: Duration) -> ProcessingResponse {
    let wait = limit.min(MAX_PREFILL_WAIT).max(Duration::from_secs(1));
    ProcessingResponse {
        override_message_timeout: Some(ProtoDuration {
            seconds: wait.as_secs() as i64,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// An inference request: its whole body, then its response headers. The
/// Envoy config skips response headers by default, so that replies Envoy
/// makes to requests never shown to us (a malformed request, HTTP/1.0) go
/// out at once instead of waiting on a processor that knows nothing of them.
pub(super) fn routed() -> ProcessingMode {
    ProcessingMode {
        request_header_mode: HeaderSendMode::Send as i32,
        request_body_mode: BodySendMode::Buffered as i32,
        request_trailer_mode: HeaderSendMode::Skip as i32,
        response_header_mode: HeaderSendMode::Send as i32,
        response_body_mode: BodySendMode::None as i32,
        response_trailer_mode: HeaderSendMode::Skip as i32,
    }
}

/// Nothing else of this request is sent to us: no body, no response.
pub(super) fn nothing_more() -> ProcessingMode {
    ProcessingMode {
        request_body_mode: BodySendMode::None as i32,
        response_header_mode: HeaderSendMode::Skip as i32,
        response_body_mode: BodySendMode::None as i32,
        response_trailer_mode: HeaderSendMode::Skip as i32,
        ..Default::default()
    }
}

/// A reply of one kind with nothing else in it.
pub(super) fn reply(response: processing_response::Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..Default::default()
    }
}

/// A response body chunk replaced (or cleared, to be held).
pub(super) fn body_reply(mutation: body_mutation::Mutation) -> ProcessingResponse {
    reply(processing_response::Response::ResponseBody(BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(mutation),
            }),
            ..Default::default()
        }),
    }))
}

pub(super) fn headers_response(mutation: HeaderMutation) -> HeadersResponse {
    HeadersResponse {
        response: Some(CommonResponse {
            header_mutation: Some(mutation),
            ..Default::default()
        }),
    }
}

pub(super) fn set_header(name: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: name.to_string(),
            raw_value: value.as_bytes().to_vec(),
            ..Default::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

/// `(name, value)` of each header; Envoy sends values in `raw_value`
/// (older versions in `value`).
pub(super) fn header_list(map: Option<&HeaderMap>) -> Vec<(String, String)> {
    map.map(|m| {
        m.headers
            .iter()
            .map(|h| {
                let value = if h.raw_value.is_empty() {
                    h.value.clone()
                } else {
                    String::from_utf8_lossy(&h.raw_value).into_owned()
                };
                (h.key.to_ascii_lowercase(), value)
            })
            .collect()
    })
    .unwrap_or_default()
}

/// What Envoy sends about the request and its answer with a message
/// (`request_attributes`, `response_attributes`).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Attributes {
    pub client_address: Option<String>,
    pub upstream_host: Option<String>,
    pub attempts: Option<u32>,
    pub code_details: Option<String>,
}

impl Attributes {
    pub(super) fn of(attributes: &HashMap<String, Struct>) -> Self {
        let Some(fields) = attributes.get(ATTRIBUTES_KEY).map(|s| &s.fields) else {
            return Attributes::default();
        };
        let text = |name: &str| match fields.get(name).and_then(|v| v.kind.as_ref()) {
            Some(value::Kind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
            _ => None,
        };
        let attempts = match fields.get(ATTEMPT_COUNT).and_then(|v| v.kind.as_ref()) {
            Some(value::Kind::NumberValue(n)) if *n >= 0.0 => Some(*n as u32),
            Some(value::Kind::StringValue(s)) => s.trim().parse().ok(),
            _ => None,
        };
        Attributes {
            client_address: text(SOURCE_ADDRESS),
            upstream_host: text(UPSTREAM_ADDRESS),
            attempts,
            code_details: text(CODE_DETAILS),
        }
    }
}
