//! Every transition of a request's lifecycle, natively. Bodies, answers and
//! decisions are made up here; what is checked is what the front doors are
//! told to do.

use std::borrow::Cow;

use sglang_envoy_proto::{AdmissionOutcome, PrefillOutcome, Rejection};

use crate::*;

mod answer;
mod merge;
mod pd;
mod request;

struct Client {
    body: Vec<u8>,
}

impl Source for Client {
    fn body_len(&self) -> usize {
        self.body.len()
    }
    fn body(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.body)
    }
    fn headers(&self) -> Vec<(String, String)> {
        vec![("traceparent".into(), "00-1".into())]
    }
}

const BODY: &str = r#"{"text":"hello", "temperature": 0.70}"#;

fn client() -> Client {
    Client {
        body: BODY.as_bytes().to_vec(),
    }
}

fn settings(body_while_head_held: bool) -> Settings {
    Settings {
        max_body_bytes: 100,
        body_while_head_held,
        client_key: None,
    }
}

fn head<'a>(method: &'a str, path: &'a str, end_of_stream: bool) -> RequestHead<'a> {
    RequestHead {
        method,
        path,
        end_of_stream,
        content_length: None,
        request_id: "r1",
        routing_key: "k",
        authorization: "",
        traceparent: "",
        tenant: "",
        priority: "",
        client_address: "",
    }
}

fn decision(pd: bool, merge: bool) -> Answer {
    Ok(Routed {
        ticket: 7,
        endpoints: vec!["10.0.0.1:1".into(), "10.0.0.2:1".into()],
        worker: "http://10.0.0.1:1".into(),
        inject: vec![("rid".into(), "\"gnt-1\"".into())],
        request_headers: Vec::new(),
        prefill: pd.then_some(FollowPrefill {
            merge_input_logprobs: merge,
            outcome_follows: false,
        }),
        report_cached_tokens: false,
        report_prefilled: false,
    })
}

/// A POST /generate whose question went out.
fn asked(body_while_head_held: bool) -> Lifecycle {
    let mut lc = Lifecycle::new(7, settings(body_while_head_held));
    assert_eq!(
        lc.on_request_head(head("POST", "/generate", false)),
        HeadStep::ReadBody
    );
    assert!(matches!(lc.on_body(&client(), false), Step::Ask(_)));
    lc
}

/// A request sent on by a decision (`pd`: with a prefill to follow).
fn forwarded(pd: bool, merge: bool, body_while_head_held: bool) -> Lifecycle {
    let mut lc = asked(body_while_head_held);
    let Step::Forward(f) = lc.on_answer(decision(pd, merge), &client()) else {
        panic!("a decision forwards");
    };
    assert_eq!(f.prefill.is_some(), pd);
    lc
}

fn ok_head(sse: bool) -> ResponseHead {
    ResponseHead {
        status: 200,
        sse,
        end_of_stream: false,
    }
}

fn upstream() -> EndFacts {
    EndFacts {
        code_details: Some("via_upstream".into()),
        ..Default::default()
    }
}

fn prefill_ok(logprobs: &str) -> PrefillOutcome {
    PrefillOutcome {
        ok: true,
        http_status: 200,
        input_token_logprobs: logprobs.into(),
        ..Default::default()
    }
}

fn prefill_failed(status: u32) -> PrefillOutcome {
    PrefillOutcome {
        ok: false,
        http_status: status,
        message: "prefill exploded".into(),
        error_type: "prefill_failed".into(),
        ..Default::default()
    }
}

const LOGPROBS: &str = "[[-1.0,1,null]]";
