//! PD mode: the prefill worker computes the prompt's logprobs, the decode
//! worker the rest. Like sglang-router, the router puts the prefill's
//! `meta_info.input_token_logprobs` in front of the decode's in what the
//! client gets. Only the one nested field is rewritten; every other byte of
//! the decode answer is kept.

use serde_json::value::RawValue;

use crate::RequestBody;

/// The prefill's input logprobs (JSON text of an array) in one object of
/// its answer (the whole body, or one streamed event), if it has them.
pub fn prefill_input_logprobs(answer: &serde_json::Value) -> Option<String> {
    answer
        .pointer("/meta_info/input_token_logprobs")
        .map(|v| v.to_string())
}

/// `response` (a JSON object with `meta_info`) with the prefill's input
/// logprobs (`prefill`, a JSON array) put before its own. `None` when there
/// is nothing to merge into (not an object, no `meta_info`) or `prefill` is
/// not an array.
pub fn merge_input_logprobs(response: &[u8], prefill: &str) -> Option<Vec<u8>> {
    let prefill_items: Vec<&RawValue> = serde_json::from_str(prefill).ok()?;
    let body = RequestBody::parse(response).ok()?;
    let meta_raw = body.get("meta_info")?;
    let meta = RequestBody::parse(meta_raw.get().as_bytes()).ok()?;
    let decode_items: Vec<&RawValue> = meta
        .get("input_token_logprobs")
        .and_then(|v| serde_json::from_str(v.get()).ok())
        .unwrap_or_default();
    let merged: Vec<&str> = prefill_items
        .iter()
        .chain(decode_items.iter())
        .map(|v| v.get())
        .collect();
    let merged = format!("[{}]", merged.join(","));
    let new_meta = meta
        .with_fields(&[("input_token_logprobs", &merged)])
        .ok()?;
    let new_meta = String::from_utf8(new_meta).ok()?;
    body.with_fields(&[("meta_info", &new_meta)]).ok()
}

/// Progress of merging into the first event of a streamed (SSE) answer.
#[derive(Debug, PartialEq, Eq)]
pub enum SseMerge {
    /// The first event is not complete yet: wait for more bytes.
    NeedMore,
    /// Done: the bytes to send instead (unchanged when the first event had
    /// nothing to merge into).
    Done(Vec<u8>),
}

/// Merges the prefill's input logprobs into the first `data:` event of
/// `buffered` (everything received so far), leaving the rest as it is.
pub fn merge_first_sse_event(buffered: &[u8], prefill: &str, end_of_stream: bool) -> SseMerge {
    let Some(end) = first_event_end(buffered) else {
        return if end_of_stream {
            SseMerge::Done(buffered.to_vec())
        } else {
            SseMerge::NeedMore
        };
    };
    let event = &buffered[..end];
    let Some(data_at) = find(event, b"data:") else {
        return SseMerge::Done(buffered.to_vec());
    };
    let mut payload_at = data_at + 5;
    if event.get(payload_at) == Some(&b' ') {
        payload_at += 1;
    }
    match merge_input_logprobs(&event[payload_at..], prefill) {
        Some(merged) => {
            let mut out = Vec::with_capacity(buffered.len() + prefill.len());
            out.extend_from_slice(&buffered[..payload_at]);
            out.extend_from_slice(&merged);
            out.extend_from_slice(&buffered[end..]);
            SseMerge::Done(out)
        }
        None => SseMerge::Done(buffered.to_vec()),
    }
}

/// Where the first SSE event of `buffered` ends: the start of the blank line
/// after it, whichever line ending the stream uses (`\n`, `\r\n`, `\r`).
fn first_event_end(buffered: &[u8]) -> Option<usize> {
    [&b"\n\n"[..], b"\r\n\r\n", b"\r\r"]
        .into_iter()
        .filter_map(|blank| find(buffered, blank))
        .min()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_logprobs_go_first_and_other_bytes_stay() {
        let decode =
            br#"{"text":"hi","meta_info":{"id":"x","input_token_logprobs":[[-0.5,9,null]],"p":0.7}}"#;
        let merged = merge_input_logprobs(decode, "[[-1.0,1,null],[-2.0,2,null]]").unwrap();
        assert_eq!(
            std::str::from_utf8(&merged).unwrap(),
            r#"{"text":"hi","meta_info":{"id":"x","input_token_logprobs":[[-1.0,1,null],[-2.0,2,null],[-0.5,9,null]],"p":0.7}}"#
        );
    }

    #[test]
    fn missing_decode_logprobs_take_the_prefill_ones_and_junk_is_left_alone() {
        let merged = merge_input_logprobs(br#"{"meta_info":{}}"#, "[[-1.0,1,null]]").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&merged).unwrap();
        assert_eq!(v["meta_info"]["input_token_logprobs"][0][1], 1);
        assert!(merge_input_logprobs(br#"{"text":"x"}"#, "[]").is_none());
        assert!(merge_input_logprobs(b"[1]", "[]").is_none());
        assert!(merge_input_logprobs(br#"{"meta_info":{}}"#, "{}").is_none());
    }

    #[test]
    fn only_the_first_sse_event_changes() {
        let first = b"data: {\"meta_info\":{\"input_token_logprobs\":[]}}\n\n";
        assert_eq!(
            merge_first_sse_event(&first[..20], "[[-1,1,null]]", false),
            SseMerge::NeedMore
        );
        let mut stream = first.to_vec();
        stream.extend_from_slice(b"data: {\"meta_info\":{\"input_token_logprobs\":[]}}\n\n");
        let SseMerge::Done(out) = merge_first_sse_event(&stream, "[[-1,1,null]]", false) else {
            panic!("expected the merge to finish");
        };
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "data: {\"meta_info\":{\"input_token_logprobs\":[[-1,1,null]]}}\n\ndata: {\"meta_info\":{\"input_token_logprobs\":[]}}\n\n"
        );
        let crlf = b"data: {\"meta_info\":{}}\r\n\r\ndata: {}\r\n\r\n";
        let SseMerge::Done(out) = merge_first_sse_event(crlf, "[[-1,1,null]]", false) else {
            panic!("a CRLF-framed first event is complete");
        };
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "data: {\"meta_info\":{\"input_token_logprobs\":[[-1,1,null]]}}\r\n\r\ndata: {}\r\n\r\n"
        );
        assert_eq!(
            merge_first_sse_event(b"data: [DONE]\n\n", "[]", false),
            SseMerge::Done(b"data: [DONE]\n\n".to_vec())
        );
    }
}
