//! The streaming case of scenario 1: the SSE answer `bench-instant-worker`
//! sends for `"stream": true` (OpenAI chat-completion chunk events, then
//! `data: [DONE]`), how it tells a streamed request from the others, and
//! the client's count of the events it received.

/// The event that ends an OpenAI stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// The answer to a streamed chat completion: `chunks` chat-completion chunk
/// events (`data: {...}\n\n`, one generated token each; the last one says
/// `finish_reason` and carries the usage), then [`DONE`]. One entry per
/// event, so that the worker can write each on its own.
pub fn chat_events(chunks: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(chunks + 1);
    for i in 0..chunks {
        let tail = if i + 1 == chunks {
            format!(
                r#""finish_reason":"length"}}],"usage":{{"prompt_tokens":1,"completion_tokens":{chunks},"total_tokens":{},"prompt_tokens_details":{{"cached_tokens":0}}}}}}"#,
                chunks + 1
            )
        } else {
            r#""finish_reason":null}]}"#.to_string()
        };
        let role = if i == 0 { r#""role":"assistant","# } else { "" };
        out.push(
            format!(
                "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[{{\"index\":0,\"delta\":{{{role}\"content\":\" tok{i}\"}},{tail}\n\n"
            )
            .into_bytes(),
        );
    }
    out.push(DONE.to_vec());
    out
}

/// True when the JSON `body` has `"stream": true` at some level (a byte
/// search, no parse: the worker must stay cheap). A `"stream"` inside a
/// string value is escaped (`\"stream\"`) and does not match, nor does
/// `"stream_options"`.
pub fn wants_stream(body: &[u8]) -> bool {
    const KEY: &[u8] = b"\"stream\"";
    let mut from = 0;
    while let Some(at) = body[from..].windows(KEY.len()).position(|w| w == KEY) {
        let rest = &body[from + at + KEY.len()..];
        let rest = rest.trim_ascii_start();
        if let Some(value) = rest.strip_prefix(b":") {
            if value.trim_ascii_start().starts_with(b"true") {
                return true;
            }
        }
        from += at + 1;
    }
    false
}

/// Counts the events of an SSE stream fed in pieces of any size (an event
/// ends with a blank line, `\n\n`), and whether the stream ended with
/// [`DONE`].
#[derive(Debug, Clone, Default)]
pub struct EventCounter {
    events: u64,
    newline: bool,
    tail: Vec<u8>,
}

impl EventCounter {
    /// Reads the next piece of the stream.
    pub fn feed(&mut self, piece: &[u8]) {
        for &b in piece {
            if b == b'\n' {
                if self.newline {
                    self.events += 1;
                }
                self.newline = !self.newline;
            } else if b != b'\r' {
                self.newline = false;
            }
        }
        self.tail.extend_from_slice(piece);
        let keep = DONE.len();
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
    }

    /// True when the stream so far ends with [`DONE`].
    pub fn done(&self) -> bool {
        self.tail.ends_with(DONE)
    }

    /// Events before the `[DONE]` one (all events while not done).
    pub fn chunks(&self) -> u64 {
        self.events.saturating_sub(u64::from(self.done()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn answer_has_the_chunks_then_done() {
        let events = chat_events(1000);
        assert_eq!(events.len(), 1001);
        assert_eq!(events.last().unwrap().as_slice(), DONE);
        for (i, e) in events[..1000].iter().enumerate() {
            let text = std::str::from_utf8(e).unwrap();
            let json = text
                .strip_prefix("data: ")
                .and_then(|t| t.strip_suffix("\n\n"))
                .unwrap();
            let v: Value = serde_json::from_str(json).unwrap();
            assert_eq!(v["object"], "chat.completion.chunk");
            assert_eq!(v["choices"][0]["delta"]["content"], format!(" tok{i}"));
            let last = i == 999;
            assert_eq!(v["choices"][0]["finish_reason"].is_null(), !last);
            assert_eq!(
                v["usage"]["completion_tokens"].as_u64(),
                last.then_some(1000)
            );
        }
        // The client counts what the worker sends, however it is cut.
        let whole: Vec<u8> = events.concat();
        for piece in [1, 7, 100, 4096, whole.len()] {
            let mut c = EventCounter::default();
            whole.chunks(piece).for_each(|p| c.feed(p));
            assert!(c.done(), "piece {piece}");
            assert_eq!(c.chunks(), 1000, "piece {piece}");
        }
    }

    #[test]
    fn a_cut_stream_is_not_done() {
        let events = chat_events(10);
        let mut c = EventCounter::default();
        events[..5].iter().for_each(|e| c.feed(e));
        assert!(!c.done());
        assert_eq!(c.chunks(), 5);
        let mut crlf = EventCounter::default();
        crlf.feed(b"data: {}\r\n\r\ndata: [DONE]\n\n");
        assert_eq!((crlf.chunks(), crlf.done()), (1, true));
    }

    #[test]
    fn stream_flag_is_found_by_bytes() {
        assert!(wants_stream(br#"{"model":"m","stream":true}"#));
        assert!(wants_stream(br#"{"stream" : true, "x": 1}"#));
        assert!(!wants_stream(br#"{"model":"m","stream":false}"#));
        assert!(!wants_stream(br#"{"model":"m"}"#));
        assert!(!wants_stream(
            br#"{"messages":[{"content":"say \"stream\": true"}],"stream_options":{"include_usage":true}}"#
        ));
        let streamed = crate::workload::stream_bodies(1, 1024, 2, 8);
        assert!(streamed.iter().all(|b| wants_stream(b)));
        let plain = crate::workload::overhead_bodies(1, 1024, 2, 8);
        assert!(plain.iter().all(|b| !wants_stream(b)));
    }
}
