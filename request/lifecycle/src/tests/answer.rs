//! The answer: failure reports, SSE ends and hang-ups.

use super::*;

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
        let c = lc.end(upstream).unwrap();
        assert_eq!(c.client_cancelled, !finish);
        assert_eq!(c.http_status, 200);
    }
    // Reset by the worker is not the client's doing.
    let mut lc = forwarded(false, false, false);
    let reset = EndFacts {
        code_details: Some("upstream_reset_before_response_started".into()),
        ..Default::default()
    };
    let c = lc.end(|| reset).unwrap();
    assert!(!c.client_cancelled && !c.local_reply);
}

#[test]
fn the_first_bytes_of_a_stream_report_its_prefill_done_once_when_asked() {
    // (asked, head): whether a report comes with the first bytes.
    let failed = ResponseHead {
        status: 503,
        ..ok_head(true)
    };
    for (asked, head, reports) in [
        (true, ok_head(true), true),
        (false, ok_head(true), false),
        // A whole JSON answer's bytes come at its end: the end tells.
        (true, ok_head(false), false),
        (true, failed, false),
    ] {
        let mut lc = asked_lifecycle(asked);
        let _ = lc.on_response_head(head, upstream);
        assert_eq!(lc.on_response_bytes(0), None, "no bytes yet");
        let first = lc.on_response_bytes(17);
        assert_eq!(first.is_some(), reports, "asked {asked} head {head:?}");
        if let Some(c) = first {
            assert_eq!((c.ticket, c.prefilled, c.outcome_only), (7, true, false));
        }
        assert_eq!(lc.on_response_bytes(30), None, "once");
        // The end still comes, and releases the load.
        let end = lc.end(upstream).unwrap();
        assert!(!end.prefilled);
    }
}

/// A request sent on by a decision that did or did not ask for the
/// prefill's end.
fn asked_lifecycle(report_prefilled: bool) -> Lifecycle {
    let mut lc = asked(false);
    let mut d = decision(false, false);
    if let Ok(r) = &mut d {
        r.report_prefilled = report_prefilled;
    }
    assert!(matches!(lc.on_answer(d, &client()), Step::Forward(_)));
    lc
}

#[test]
fn the_cached_tokens_reported_go_with_the_end_when_asked_for() {
    for (want, sse) in [(true, false), (true, true), (false, false)] {
        let mut lc = asked(false);
        let mut d = decision(false, false);
        if let Ok(r) = &mut d {
            r.report_cached_tokens = want;
        }
        assert!(matches!(lc.on_answer(d, &client()), Step::Forward(_)));
        let ResponseStep::Continue { release, .. } = lc.on_response_head(ok_head(sse), upstream)
        else {
            panic!();
        };
        // Asked: the JSON answer is shown too, to read its usage.
        assert_eq!(release.watch == Watch::Chunks, want || sse);
        assert_eq!(lc.needs_response_bytes(), want);
        let usage = br#"{"usage":{"prompt_tokens_details":{"cached_tokens":48}}}"#;
        if sse {
            lc.on_response_body(b"data: ", false);
            lc.on_response_body(usage, false);
            lc.on_response_body(b"\n\ndata: [DONE]\n\n", true);
        } else {
            lc.on_response_body(&usage[..10], false);
            lc.on_response_body(&usage[10..], true);
        }
        let c = lc.end(upstream).unwrap();
        assert_eq!(
            c.cached_tokens,
            want.then_some(48),
            "asked {want} sse {sse}"
        );
    }
}
