//! PD: the prefill's outcome and the answer's head, in every order.

use super::*;

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
    let c = lc.end(EndFacts::default).unwrap();
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
fn a_prefill_the_replica_asked_does_not_know_is_an_unknown_outcome_not_a_failure() {
    let unknown = PrefillOutcome {
        unknown_ticket: true,
        ..prefill_failed(503)
    };
    // Before the head: nothing to do, and the head goes on when it comes.
    let mut lc = forwarded(true, false, false);
    assert_eq!(lc.on_prefill(unknown.clone()), PrefillStep::Nothing);
    assert!(!lc.replied());
    assert!(matches!(
        lc.on_response_head(ok_head(false), upstream),
        ResponseStep::Continue { .. }
    ));
    // After it: the held head is let go as it is.
    let mut lc = forwarded(true, false, false);
    lc.on_response_head(ok_head(true), upstream);
    assert!(matches!(
        lc.on_prefill(unknown),
        PrefillStep::Release { replace: None, .. }
    ));
    assert!(!lc.replied());
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
    let c = lc.end(upstream).unwrap();
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
    let c = lc.end(EndFacts::default).unwrap();
    assert!(c.client_cancelled);
    assert_eq!((c.ticket, c.http_status), (7, 0));
}
