//! The request, up to the decision; tickets and the end's report.

use super::*;

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
        assert_eq!(lc.end(EndFacts::default), None, "nothing was counted");
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
        let c = lc.end(EndFacts::default).unwrap();
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
            ..Default::default()
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

#[test]
fn tickets_are_distinct_and_never_zero() {
    let t = TicketSource::new(u64::MAX - 1);
    let got: Vec<u64> = (0..3).map(|_| t.next()).collect();
    assert_eq!(got, [u64::MAX, 1, 2]);
}

#[test]
fn the_end_is_reported_once() {
    let mut lc = forwarded(false, false, false);
    assert!(lc.end(EndFacts::default).is_some());
    assert_eq!(lc.end(EndFacts::default), None, "already reported");
    assert!(lc.asked(), "still a request the control plane counted");
}

#[test]
fn a_refused_question_is_asked_again_the_same() {
    for attach in [false, true] {
        let mut lc = Lifecycle::new(5, settings(false));
        lc.on_request_head(head("POST", "/generate", false));
        let Step::Ask(first) = lc.on_body(&client(), attach) else {
            panic!("asked");
        };
        let Step::Ask(again) = lc.on_refused(&client()) else {
            panic!("asked again");
        };
        assert_eq!(again, first, "attach {attach}");
        // Its answer is taken as the first question's would have been.
        assert!(matches!(
            lc.on_answer(decision(false, false), &client()),
            Step::Forward(_)
        ));
    }
    // An info request's bare question, too.
    let mut lc = Lifecycle::new(9, settings(false));
    let HeadStep::Ask(first) = lc.on_request_head(head("GET", "/v1/models", true)) else {
        panic!("asked at its head");
    };
    assert!(matches!(lc.on_refused(&client()), Step::Ask(q) if q == first));
    // Nothing asked: nothing to ask again.
    let mut lc = forwarded(false, false, false);
    assert!(matches!(lc.on_refused(&client()), Step::Reply(r) if r.status == 503));
}
