//! Reading the cached tokens a worker reports in its answer, for the
//! control plane's self-check of its KV-event predictions: OpenAI's
//! `usage.prompt_tokens_details.cached_tokens` (SGLang's
//! `--enable-cache-report`) or SGLang's native `meta_info.cached_tokens`.
//!
//! Memory stays bounded whatever the answer: a JSON answer is kept whole
//! only up to [`MAX_JSON`] (usage comes at its end, so a longer one is not
//! read), a stream only its last [`STREAM_TAIL`] bytes, where its final
//! events are. Parsing is serde_json's, whose depth limit holds for any
//! bytes a worker sends.

use serde_json::Value;

/// Longest JSON answer kept to read.
const MAX_JSON: usize = 256 * 1024;
/// Bytes of a stream's end kept to read.
const STREAM_TAIL: usize = 16 * 1024;

/// The answer's bytes as far as they are needed.
#[derive(Debug, Clone)]
pub(crate) struct CachedTokensWatch {
    stream: bool,
    bytes: Vec<u8>,
    /// A JSON answer grew past [`MAX_JSON`]: nothing to read.
    overflow: bool,
}

impl CachedTokensWatch {
    /// A watch of an SSE stream (`stream`) or a JSON answer.
    pub(crate) fn new(stream: bool) -> Self {
        CachedTokensWatch {
            stream,
            bytes: Vec::new(),
            overflow: false,
        }
    }

    /// A chunk of the answer.
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        if self.overflow {
            return;
        }
        self.bytes.extend_from_slice(chunk);
        if self.stream {
            if self.bytes.len() > STREAM_TAIL {
                let cut = self.bytes.len() - STREAM_TAIL;
                self.bytes.drain(..cut);
            }
        } else if self.bytes.len() > MAX_JSON {
            self.overflow = true;
            self.bytes = Vec::new();
        }
    }

    /// The cached tokens the answer reported, if it did.
    pub(crate) fn read(&self) -> Option<u64> {
        if self.overflow {
            return None;
        }
        if !self.stream {
            return serde_json::from_slice::<Value>(&self.bytes)
                .ok()
                .and_then(|v| cached_tokens(&v));
        }
        // The last event that says (the usage chunk, or the native
        // stream's last `meta_info`); the tail's first line may be cut.
        self.bytes
            .split(|&b| b == b'\n')
            .rev()
            .filter_map(|line| line.strip_prefix(b"data:"))
            .map(|data| data.trim_ascii())
            .filter(|data| *data != b"[DONE]")
            .find_map(|data| {
                serde_json::from_slice::<Value>(data)
                    .ok()
                    .and_then(|v| cached_tokens(&v))
            })
    }
}

fn cached_tokens(v: &Value) -> Option<u64> {
    v.pointer("/usage/prompt_tokens_details/cached_tokens")
        .or_else(|| v.pointer("/meta_info/cached_tokens"))
        .and_then(Value::as_u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_json_usage_and_native_meta_info() {
        let mut w = CachedTokensWatch::new(false);
        w.feed(br#"{"id":"x","usage":{"prompt_tokens":40,"#);
        w.feed(br#""prompt_tokens_details":{"cached_tokens":32}}}"#);
        assert_eq!(w.read(), Some(32));
        let mut n = CachedTokensWatch::new(false);
        n.feed(br#"{"text":"a","meta_info":{"prompt_tokens":9,"cached_tokens":0}}"#);
        assert_eq!(n.read(), Some(0));
        let mut none = CachedTokensWatch::new(false);
        none.feed(br#"{"usage":{"prompt_tokens":9}}"#);
        assert_eq!(none.read(), None);
    }

    #[test]
    fn reads_the_last_event_of_a_stream_that_says() {
        let mut w = CachedTokensWatch::new(true);
        w.feed(b"data: {\"choices\":[]}\n\n");
        w.feed(&vec![b'x'; STREAM_TAIL]);
        w.feed(b"\n\ndata: {\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n");
        w.feed(b"data: [DONE]\n\n");
        assert_eq!(w.read(), Some(16));
        assert!(w.bytes.len() <= STREAM_TAIL);
    }

    #[test]
    fn a_huge_or_hostile_answer_reads_as_nothing_and_holds_no_memory() {
        let mut w = CachedTokensWatch::new(false);
        for _ in 0..(MAX_JSON / 1024 + 2) {
            w.feed(&[b'['; 1024]);
        }
        assert!(w.bytes.is_empty());
        assert_eq!(w.read(), None);
        let mut deep = CachedTokensWatch::new(false);
        deep.feed(&[b'['; 100_000]);
        assert_eq!(deep.read(), None);
    }
}
