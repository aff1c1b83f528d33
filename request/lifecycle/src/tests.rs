//! Every transition of a request's lifecycle, natively. Bodies, answers and
//! decisions are made up here; what is checked is what the front doors are
//! told to do.

use std::borrow::Cow;

use sglang_envoy_proto::{AdmissionOutcome, PrefillOutcome, Rejection};

use crate::*;

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
        }),
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
    assert_eq!(f.await_prefill, pd);
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

// ---- the request, up to the decision ----

#[test]
fn unusable_heads_are_refused_and_never_reported() {
    for (method, path, eos, status) in [
        ("GET", "/generate", true, 405),
        ("POST", "/generate", true, 400),
        ("POST", "/flush_cache", false, 404),
    ] {
        let mut lc = Lifecycle::new(1, settings(false));
        let HeadStep::Reply(r) = lc.on_request_head(head(method, path, eos)) else {
            panic!("{method} {path} is refused");
        };
        assert_eq!(r.status, status, "{method} {path}");
        assert!(lc.replied());
        assert_eq!(lc.end(&EndFacts::default()), None, "nothing was counted");
    }
    let mut lc = Lifecycle::new(1, settings(false));
    let mut h = head("POST", "/generate", false);
    h.content_length = Some(101);
    assert!(matches!(lc.on_request_head(h), HeadStep::Reply(r) if r.status == 413));
}

#[test]
fn info_requests_are_asked_about_at_their_head() {
    let mut lc = Lifecycle::new(9, settings(false));
    let HeadStep::Ask(q) = lc.on_request_head(head("GET", "/v1/models", true)) else {
        panic!("info GETs are routed on their head");
    };
    assert_eq!(
        (q.path.as_str(), q.ticket, q.body.len()),
        ("/v1/models", 9, 0)
    );
    assert_eq!((q.request_id.as_str(), q.routing_key.as_str()), ("r1", "k"));
    let Step::Forward(f) = lc.on_answer(decision(false, false), &client()) else {
        panic!("forwarded");
    };
    assert_eq!(f.endpoints, "10.0.0.1:1,10.0.0.2:1");
    assert!(lc.forwarded());
}

#[test]
fn the_body_is_checked_then_asked_about_with_or_without_itself() {
    let mut lc = Lifecycle::new(3, settings(false));
    lc.on_request_head(head("POST", "/generate", false));
    assert_eq!(lc.on_body_progress(100), None);
    assert_eq!(lc.on_body_progress(101).map(|r| r.status), Some(413));
    assert!(lc.replied());

    let mut lc = Lifecycle::new(3, settings(false));
    lc.on_request_head(head("POST", "/v1/chat/completions", false));
    let bad = Client {
        body: b"{\"messages\": [".to_vec(),
    };
    assert!(matches!(lc.on_body(&bad, true), Step::Reply(r) if r.status == 400));
    assert!(!lc.asked(), "a refused body asks nothing");

    for attach in [false, true] {
        let mut lc = Lifecycle::new(3, settings(false));
        lc.on_request_head(head("POST", "/generate", false));
        let Step::Ask(q) = lc.on_body(&client(), attach) else {
            panic!("asked");
        };
        assert_eq!(q.routing_text, b"hello");
        assert_eq!(q.body_bytes as usize, BODY.len());
        assert_eq!(q.body.len(), if attach { BODY.len() } else { 0 });
        assert_eq!(q.headers.len(), usize::from(attach));
        assert!(lc.asked());
    }
}

#[test]
fn trailers_refuse_a_body_in_progress_only() {
    let mut lc = Lifecycle::new(3, settings(false));
    lc.on_request_head(head("POST", "/generate", false));
    assert_eq!(lc.on_request_trailers().map(|r| r.status), Some(400));
    let mut lc = forwarded(false, false, false);
    assert_eq!(lc.on_request_trailers(), None);
}

#[test]
fn a_decision_splices_its_fields_and_keeps_every_other_byte() {
    let mut lc = asked(false);
    let Step::Forward(f) = lc.on_answer(decision(false, false), &client()) else {
        panic!("forwarded");
    };
    let body = String::from_utf8(f.body.unwrap()).unwrap();
    assert!(body.contains(r#""temperature": 0.70"#), "{body}");
    assert!(body.contains(r#""rid":"gnt-1""#), "{body}");
    assert_eq!(lc.mode(), Mode::Regular);
}

#[test]
fn rejections_empty_decisions_and_junk_become_replies() {
    let mut empty = decision(false, false).unwrap();
    empty.endpoints.clear();
    let cases: [(Answer, u16); 2] = [
        (
            Err(Unrouted::Rejected(LocalReply::new(
                429,
                "rate_limited",
                "slow down",
            ))),
            429,
        ),
        (Ok(empty), 503),
    ];
    for (answer, status) in cases {
        let mut lc = asked(false);
        let Step::Reply(r) = lc.on_answer(answer, &client()) else {
            panic!("replied");
        };
        assert_eq!(r.status, status);
        // Asked: the end is reported even though the router replied.
        let c = lc.end(&EndFacts::default()).unwrap();
        assert_eq!(
            (c.http_status, c.local_reply, c.client_cancelled),
            (u32::from(status), true, false)
        );
    }
}

#[test]
fn a_request_for_the_body_is_answered_once() {
    let need = || Err(Unrouted::NeedBody);
    let mut lc = asked(false);
    let Step::Ask(q) = lc.on_answer(need(), &client()) else {
        panic!("asks again with the body");
    };
    assert_eq!(q.body, BODY.as_bytes());
    assert!(matches!(lc.on_answer(need(), &client()), Step::Reply(r) if r.status == 502));
}

#[test]
fn admission_queues_then_admits_or_refuses() {
    let queued = || Err(Unrouted::Queued { wait_ms: 500 });
    let mut lc = asked(false);
    assert_eq!(
        lc.on_answer(queued(), &client()),
        Step::AwaitAdmission { wait_ms: 500 }
    );
    let admitted = AdmissionOutcome {
        admitted: true,
        rejection: None,
    };
    assert!(
        matches!(lc.on_admission(admitted, &client(), true), Step::Ask(q) if !q.body.is_empty())
    );
    assert!(matches!(
        lc.on_answer(decision(false, false), &client()),
        Step::Forward(_)
    ));

    let mut lc = asked(false);
    lc.on_answer(queued(), &client());
    let timed_out = AdmissionOutcome {
        admitted: false,
        rejection: Some(Rejection {
            http_status: 408,
            error_type: "timeout".into(),
            message: "queued too long".into(),
        }),
    };
    assert!(
        matches!(lc.on_admission(timed_out, &client(), false), Step::Reply(r) if r.status == 408)
    );
    // An admission nobody waits for is a bug, not a second answer.
    assert!(matches!(
        lc.on_admission(AdmissionOutcome { admitted: true, rejection: None }, &client(), false),
        Step::Reply(r) if r.status == 500
    ));
}

#[test]
fn no_answer_falls_back_and_a_local_prefill_is_followed() {
    let mut lc = asked(false);
    assert_eq!(lc.on_no_answer(), Step::Fallback);
    lc.forwarded_locally(Some(false));
    assert_eq!(lc.mode(), Mode::Pd);
    assert_eq!(
        lc.on_response_head(ok_head(false), upstream),
        ResponseStep::Hold { grace: None }
    );
    assert!(matches!(
        lc.on_prefill(prefill_ok("")),
        PrefillStep::Release { replace: None, .. }
    ));
}

// ---- the answer ----

#[test]
fn a_failed_answer_is_reported_before_it_goes_on_unless_envoy_made_it() {
    let mut lc = forwarded(false, false, false);
    let ResponseStep::Continue { release, report } = lc.on_response_head(ok_head(false), upstream)
    else {
        panic!("regular answers go on");
    };
    assert_eq!((release.watch, report), (Watch::Nothing, None));

    let mut lc = forwarded(false, false, false);
    let failed = ResponseHead {
        status: 503,
        sse: false,
        end_of_stream: false,
    };
    let ResponseStep::Continue {
        report: Some(c), ..
    } = lc.on_response_head(failed, upstream)
    else {
        panic!("a worker's 503 is reported first");
    };
    assert!(c.outcome_only);
    assert_eq!(c.http_status, 503);

    let mut lc = forwarded(false, false, false);
    let envoys = EndFacts {
        code_details: Some("no_healthy_upstream".into()),
        ..Default::default()
    };
    assert!(matches!(
        lc.on_response_head(failed, || envoys.clone()),
        ResponseStep::Continue { report: None, .. }
    ));
}

#[test]
fn sse_is_watched_to_its_end_and_a_hang_up_is_a_cancel() {
    for finish in [true, false] {
        let mut lc = forwarded(false, false, false);
        let ResponseStep::Continue { release, .. } = lc.on_response_head(ok_head(true), upstream)
        else {
            panic!();
        };
        assert_eq!(release.watch, Watch::Chunks);
        assert_eq!(lc.on_response_body(b"data: {}\n\n", false), BodyStep::Pass);
        if finish {
            lc.on_response_body(b"data: [DONE]\n\n", true);
        }
        let c = lc.end(&upstream()).unwrap();
        assert_eq!(c.client_cancelled, !finish);
        assert_eq!(c.http_status, 200);
    }
    // Reset by the worker is not the client's doing.
    let mut lc = forwarded(false, false, false);
    let reset = EndFacts {
        code_details: Some("upstream_reset_before_response_started".into()),
        ..Default::default()
    };
    let c = lc.end(&reset).unwrap();
    assert!(!c.client_cancelled && !c.local_reply);
}

// ---- PD: the prefill's outcome and the answer's head, in every order ----

#[test]
fn prefill_success_before_the_head_lets_it_through() {
    let mut lc = forwarded(true, false, false);
    assert_eq!(lc.on_prefill(prefill_ok("")), PrefillStep::Nothing);
    let ResponseStep::Continue { release, report } = lc.on_response_head(ok_head(false), upstream)
    else {
        panic!();
    };
    assert_eq!((release.strip_length, report), (false, None));
}

#[test]
fn prefill_failure_before_the_head_is_the_clients_error() {
    let mut lc = forwarded(true, false, false);
    let PrefillStep::Reply(r) = lc.on_prefill(prefill_failed(500)) else {
        panic!();
    };
    // The prefill worker's own status.
    assert_eq!((r.status, r.kind.as_str()), (500, "prefill_failed"));
    // No status at all (connection refused): a bad gateway.
    let mut lc = forwarded(true, false, false);
    assert!(matches!(lc.on_prefill(prefill_failed(0)), PrefillStep::Reply(r) if r.status == 502));
    assert!(lc.replied());
    let c = lc.end(&EndFacts::default()).unwrap();
    assert!(c.local_reply && !c.client_cancelled);
}

#[test]
fn the_head_waits_for_the_prefill_then_goes_or_gives_way() {
    let mut lc = forwarded(true, false, false);
    assert_eq!(
        lc.on_response_head(ok_head(true), upstream),
        ResponseStep::Hold { grace: None }
    );
    let PrefillStep::Release { release, replace } = lc.on_prefill(prefill_ok("")) else {
        panic!();
    };
    assert_eq!((release.watch, replace), (Watch::Chunks, None));
    // Too late to matter.
    assert_eq!(lc.on_prefill(prefill_failed(500)), PrefillStep::Nothing);

    let mut lc = forwarded(true, false, false);
    lc.on_response_head(ok_head(false), upstream);
    // A client error of the prefill stays a client error.
    assert!(matches!(lc.on_prefill(prefill_failed(400)), PrefillStep::Reply(r) if r.status == 400));
}

#[test]
fn a_decode_error_waits_briefly_for_the_prefills() {
    let failed = ResponseHead {
        status: 500,
        sse: false,
        end_of_stream: false,
    };
    // The prefill's error comes within the grace: it is the client's.
    let mut lc = forwarded(true, true, false);
    assert_eq!(
        lc.on_response_head(failed, upstream),
        ResponseStep::Hold {
            grace: Some(names::DECODE_ERROR_GRACE)
        }
    );
    assert!(
        matches!(lc.on_prefill(prefill_failed(503)), PrefillStep::Reply(r) if r.message == "prefill exploded")
    );

    // It does not: the decode's error goes as it is, and is not reported
    // early (in PD mode the end tells whose failure it was).
    let mut lc = forwarded(true, true, false);
    lc.on_response_head(failed, upstream);
    let PrefillStep::Release { release, replace } = lc.on_prefill_unknown() else {
        panic!();
    };
    assert_eq!((release.strip_length, replace), (false, None));
    assert_eq!(lc.on_prefill(prefill_failed(503)), PrefillStep::Nothing);

    // The prefill succeeds: nothing is merged into an error.
    let mut lc = forwarded(true, true, false);
    lc.on_response_head(failed, upstream);
    assert!(matches!(
        lc.on_prefill(prefill_ok(LOGPROBS)),
        PrefillStep::Release {
            release: Release {
                strip_length: false,
                ..
            },
            replace: None
        }
    ));
}

#[test]
fn a_lost_prefill_outcome_lets_the_decode_answer_through() {
    let mut lc = forwarded(true, true, false);
    assert_eq!(lc.on_prefill_unknown(), PrefillStep::Nothing);
    assert!(matches!(
        lc.on_response_head(ok_head(false), upstream),
        ResponseStep::Continue {
            release: Release {
                strip_length: false,
                ..
            },
            report: None
        }
    ));
}

#[test]
fn an_answer_then_a_broken_stream_before_the_prefill_outcome_holds_nothing_for_ever() {
    // The decision came on the session; the stream broke before the
    // prefill's outcome: the outcome is unknown, the request went on.
    let mut lc = forwarded(true, true, true);
    assert_eq!(lc.held(), None, "the request went on with the decision");
    assert_eq!(lc.on_prefill_unknown(), PrefillStep::Nothing);
    assert!(matches!(
        lc.on_response_head(ok_head(false), upstream),
        ResponseStep::Continue { .. }
    ));
    assert_eq!(lc.held(), None);

    // The head arrived first and is held; the outcome never comes: the
    // deadline lets the decode answer through.
    let mut lc = forwarded(true, true, true);
    assert_eq!(
        lc.on_response_head(ok_head(true), upstream),
        ResponseStep::Hold { grace: None }
    );
    assert_eq!(lc.held(), Some(Held::AnswerHead));
    assert!(matches!(
        lc.on_overdue(),
        Overdue::Prefill(PrefillStep::Release { replace: None, .. })
    ));
    assert_eq!(lc.held(), None);
    assert_eq!(lc.on_overdue(), Overdue::Nothing);
    // A late outcome changes nothing.
    assert_eq!(lc.on_prefill(prefill_failed(500)), PrefillStep::Nothing);
}

#[test]
fn a_local_prefill_whose_outcome_is_lost_does_not_hold_the_answer_for_ever() {
    // The question was on the stream when it broke: the outage fallback
    // sends the prefill half itself, and its outcome is lost.
    let mut lc = asked(true);
    assert_eq!(lc.held(), Some(Held::Request));
    assert_eq!(lc.on_no_answer(), Step::Fallback);
    lc.forwarded_locally(Some(true));
    assert_eq!(lc.held(), None);
    assert_eq!(
        lc.on_response_head(ok_head(false), upstream),
        ResponseStep::Hold { grace: None }
    );
    assert_eq!(lc.on_response_body(b"{}", true), BodyStep::Hold);
    assert_eq!(lc.held(), Some(Held::AnswerHead));
    let Overdue::Prefill(PrefillStep::Release { release, replace }) = lc.on_overdue() else {
        panic!("the held answer must go on");
    };
    assert_eq!((release.watch, replace), (Watch::Nothing, None));
    let c = lc.end(&upstream()).unwrap();
    assert_eq!((c.http_status, c.client_cancelled), (200, false));
}

#[test]
fn a_question_or_admission_never_answered_takes_the_fallback() {
    let mut lc = asked(false);
    assert_eq!(lc.on_overdue(), Overdue::Request(Step::Fallback));
    lc.forwarded_locally(None);
    assert_eq!(lc.held(), None);

    let mut lc = asked(false);
    let queued = Err(Unrouted::Queued { wait_ms: 10 });
    assert_eq!(
        lc.on_answer(queued, &client()),
        Step::AwaitAdmission { wait_ms: 10 }
    );
    assert_eq!(lc.held(), Some(Held::Request));
    assert_eq!(lc.on_overdue(), Overdue::Request(Step::Fallback));

    // Nothing left to fall back on: the client gets the JSON 503 (the
    // front door's reply when the fallback finds no worker).
    let mut lc = asked(false);
    lc.refuse(LocalReply::unreachable());
    assert_eq!(lc.held(), None);
    assert_eq!(lc.on_overdue(), Overdue::Nothing);
}

#[test]
fn a_client_gone_while_the_prefill_runs_is_a_cancel() {
    let mut lc = forwarded(true, false, false);
    let c = lc.end(&EndFacts::default()).unwrap();
    assert!(c.client_cancelled);
    assert_eq!((c.ticket, c.http_status), (7, 0));
}

// ---- PD: merging the prefill's input logprobs ----

const JSON_ANSWER: &[u8] = br#"{"text":"x","meta_info":{"input_token_logprobs":[[-0.5,9,null]]}}"#;
const MERGED_JSON: &str =
    r#"{"text":"x","meta_info":{"input_token_logprobs":[[-1.0,1,null],[-0.5,9,null]]}}"#;

#[test]
fn a_json_answer_gets_the_logprobs_when_whole() {
    for body_while_head_held in [false, true] {
        let mut lc = forwarded(true, true, body_while_head_held);
        lc.on_prefill(prefill_ok(LOGPROBS));
        let ResponseStep::Continue { release, .. } = lc.on_response_head(ok_head(false), upstream)
        else {
            panic!();
        };
        assert_eq!(
            release,
            Release {
                strip_length: true,
                watch: Watch::Whole
            }
        );
        let (a, b) = JSON_ANSWER.split_at(10);
        assert_eq!(lc.on_response_body(a, false), BodyStep::Hold);
        let BodyStep::Replace(out) = lc.on_response_body(b, true) else {
            panic!();
        };
        assert_eq!(String::from_utf8(out).unwrap(), MERGED_JSON);
        assert_eq!(lc.on_response_body(b"", true), BodyStep::Pass);
    }
}

#[test]
fn an_answer_with_nothing_to_merge_into_goes_unchanged() {
    let mut lc = forwarded(true, true, false);
    lc.on_prefill(prefill_ok(LOGPROBS));
    lc.on_response_head(ok_head(false), upstream);
    assert_eq!(
        lc.on_response_body(b"[1,2]", true),
        BodyStep::Replace(b"[1,2]".to_vec())
    );
}

#[test]
fn the_first_sse_event_gets_the_logprobs_in_either_framing() {
    for blank in ["\n\n", "\r\n\r\n"] {
        let first = format!("data: {{\"meta_info\":{{}}}}{blank}");
        let mut lc = forwarded(true, true, false);
        lc.on_prefill(prefill_ok(LOGPROBS));
        lc.on_response_head(ok_head(true), upstream);
        let (a, b) = first.as_bytes().split_at(8);
        assert_eq!(lc.on_response_body(a, false), BodyStep::Hold);
        let BodyStep::Replace(out) = lc.on_response_body(b, false) else {
            panic!("the first event is complete with {blank:?}");
        };
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("data: {{\"meta_info\":{{\"input_token_logprobs\":{LOGPROBS}}}}}{blank}")
        );
        assert_eq!(lc.on_response_body(b"data: {}\n\n", false), BodyStep::Pass);
    }
}

#[test]
fn ext_proc_releases_a_held_head_to_merge_as_the_body_comes() {
    let mut lc = forwarded(true, true, false);
    lc.on_response_head(ok_head(true), upstream);
    let PrefillStep::Release { release, replace } = lc.on_prefill(prefill_ok(LOGPROBS)) else {
        panic!();
    };
    assert_eq!(
        (release, replace),
        (
            Release {
                strip_length: true,
                watch: Watch::Chunks
            },
            None
        )
    );
    assert!(matches!(
        lc.on_response_body(b"data: {}\n\n", false),
        BodyStep::Replace(_)
    ));
}

#[test]
fn the_filter_holds_the_head_until_the_held_body_is_merged() {
    // The whole first event was held with the head: merged at once.
    let mut lc = forwarded(true, true, true);
    lc.on_response_head(ok_head(true), upstream);
    assert_eq!(
        lc.on_response_body(b"data: {\"meta_info\":{}}\n\n", false),
        BodyStep::Hold
    );
    let PrefillStep::Release {
        release,
        replace: Some(out),
    } = lc.on_prefill(prefill_ok(LOGPROBS))
    else {
        panic!();
    };
    assert!(release.strip_length);
    assert!(String::from_utf8(out).unwrap().contains(LOGPROBS));

    // Only part of it: the head stays held until the rest comes.
    let mut lc = forwarded(true, true, true);
    lc.on_response_head(ok_head(true), upstream);
    lc.on_response_body(b"data: {\"meta", false);
    assert_eq!(
        lc.on_prefill(prefill_ok(LOGPROBS)),
        PrefillStep::KeepHolding
    );
    assert!(
        matches!(lc.on_response_body(b"_info\":{}}\n\n", false), BodyStep::Replace(out) if out.starts_with(b"data: {\"meta_info\":{\"input_token_logprobs\""))
    );

    // A short JSON answer held whole, end included.
    let mut lc = forwarded(true, true, true);
    lc.on_response_head(ok_head(false), upstream);
    lc.on_response_body(JSON_ANSWER, true);
    let PrefillStep::Release {
        replace: Some(out), ..
    } = lc.on_prefill(prefill_ok(LOGPROBS))
    else {
        panic!("nothing more will come: merge now");
    };
    assert_eq!(String::from_utf8(out).unwrap(), MERGED_JSON);
}

#[test]
fn tickets_are_distinct_and_never_zero() {
    let t = TicketSource::new(u64::MAX - 1);
    let got: Vec<u64> = (0..3).map(|_| t.next()).collect();
    assert_eq!(got, [u64::MAX, 1, 2]);
}

#[test]
fn the_end_is_reported_once() {
    let mut lc = forwarded(false, false, false);
    assert!(lc.end(&EndFacts::default()).is_some());
    assert_eq!(lc.end(&EndFacts::default()), None, "already reported");
    assert!(lc.asked(), "still a request the control plane counted");
}
