//! PD: merging the prefill's input logprobs.

use super::*;

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
