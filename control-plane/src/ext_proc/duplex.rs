//! `FULL_DUPLEX_STREAMED` bodies: the body mode gateways configure for an
//! endpoint picker (Gateway API Inference Extension). Envoy streams each
//! body to us as it arrives and forwards only what we stream back, so the
//! front door owns the bytes: the request body is gathered whole (the
//! decision needs it), then sent back — edited — after the held header
//! reply; the answer's chunks go back as they come, or are kept here while
//! the lifecycle holds them (PD: the head waits for the prefill, or a merge
//! waits for the first event), where Envoy would keep them in the other
//! modes. Envoy ignores `mode_override` in this mode, so every message of
//! the request and its answer comes here.

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse,
    ProcessingResponse, ProtocolConfiguration, StreamedBodyResponse,
};
use sglang_envoy_lifecycle::BodyStep;

/// The largest body chunk sent back in one message: under the 64 KiB Envoy
/// recommends, as the picker protocol's reference implementation does.
pub(super) const MAX_CHUNK: usize = 62_000;

/// Which way a body goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    /// The client's request, to the worker.
    Request,
    /// The worker's answer, to the client.
    Response,
}

/// Which bodies of this stream are full duplex, and the answer's bytes
/// kept back while the lifecycle holds them.
#[derive(Debug, Default)]
pub(super) struct Duplex {
    /// The request body is streamed to us and ours to send on.
    pub request: bool,
    /// The answer's body likewise.
    pub response: bool,
    /// Answer bytes received and not yet sent on.
    held: Vec<u8>,
    /// The answer's last chunk has come.
    pub response_end: bool,
}

impl Duplex {
    /// As Envoy describes its filter in the stream's first message.
    pub(super) fn of(config: &ProtocolConfiguration) -> Duplex {
        let full = BodySendMode::FullDuplexStreamed as i32;
        Duplex {
            request: config.request_body_mode == full,
            response: config.response_body_mode == full,
            ..Duplex::default()
        }
    }

    /// Carries out the lifecycle's `step` for an answer chunk: the replies
    /// sending on what may go (nothing while it is held).
    pub(super) fn answer_chunk(
        &mut self,
        step: BodyStep,
        chunk: Vec<u8>,
        end: bool,
    ) -> Vec<ProcessingResponse> {
        self.response_end |= end;
        match step {
            BodyStep::Hold => {
                self.held.extend_from_slice(&chunk);
                Vec::new()
            }
            BodyStep::Pass => {
                let mut out = std::mem::take(&mut self.held);
                if out.is_empty() {
                    out = chunk;
                } else {
                    out.extend_from_slice(&chunk);
                }
                streamed(Way::Response, &out, end)
            }
            // The replacement stands for everything held and this chunk.
            BodyStep::Replace(out) => {
                self.held.clear();
                streamed(Way::Response, &out, end)
            }
        }
    }

    /// Once the answer's head has gone: the held bytes (or `replace`,
    /// which stands for them), as replies. Nothing when there is nothing
    /// to send and the answer has not ended.
    pub(super) fn release_held(&mut self, replace: Option<Vec<u8>>) -> Vec<ProcessingResponse> {
        let held = std::mem::take(&mut self.held);
        let out = replace.unwrap_or(held);
        if out.is_empty() && !self.response_end {
            return Vec::new();
        }
        streamed(Way::Response, &out, self.response_end)
    }

    /// Answer bytes are held here.
    pub(super) fn holding(&self) -> bool {
        !self.held.is_empty()
    }
}

/// `body` streamed back in chunks of at most [`MAX_CHUNK`] bytes, the last
/// marked `end` (one empty chunk for an empty body).
pub(super) fn streamed(way: Way, body: &[u8], end: bool) -> Vec<ProcessingResponse> {
    let mut chunks: Vec<&[u8]> = body.chunks(MAX_CHUNK).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let last = chunks.len() - 1;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let response = BodyResponse {
                response: Some(CommonResponse {
                    body_mutation: Some(BodyMutation {
                        mutation: Some(body_mutation::Mutation::StreamedResponse(
                            StreamedBodyResponse {
                                body: chunk.to_vec(),
                                end_of_stream: end && i == last,
                                ..Default::default()
                            },
                        )),
                    }),
                    ..Default::default()
                }),
            };
            ProcessingResponse {
                response: Some(match way {
                    Way::Request => processing_response::Response::RequestBody(response),
                    Way::Response => processing_response::Response::ResponseBody(response),
                }),
                ..Default::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bodies(replies: &[ProcessingResponse]) -> Vec<(usize, bool)> {
        replies
            .iter()
            .map(|r| match &r.response {
                Some(processing_response::Response::ResponseBody(b))
                | Some(processing_response::Response::RequestBody(b)) => {
                    match b
                        .response
                        .as_ref()
                        .and_then(|c| c.body_mutation.as_ref())
                        .and_then(|m| m.mutation.as_ref())
                    {
                        Some(body_mutation::Mutation::StreamedResponse(s)) => {
                            (s.body.len(), s.end_of_stream)
                        }
                        other => panic!("not a streamed body: {other:?}"),
                    }
                }
                other => panic!("not a body reply: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_large_body_goes_back_in_chunks_under_the_limit_the_last_one_ending() {
        let body = vec![b'x'; 2 * MAX_CHUNK + 5];
        let out = bodies(&streamed(Way::Request, &body, true));
        assert_eq!(
            out,
            vec![(MAX_CHUNK, false), (MAX_CHUNK, false), (5, true)],
            "every byte, in order of size, only the last chunk ends"
        );
        assert_eq!(bodies(&streamed(Way::Request, b"", true)), vec![(0, true)]);
        assert_eq!(
            bodies(&streamed(Way::Response, b"abc", false)),
            vec![(3, false)]
        );
    }

    #[test]
    fn held_chunks_go_out_before_the_next_passing_one_or_not_at_all_when_replaced() {
        let mut d = Duplex::default();
        assert!(d
            .answer_chunk(BodyStep::Hold, b"ab".to_vec(), false)
            .is_empty());
        assert!(d.holding());
        assert_eq!(
            bodies(&d.answer_chunk(BodyStep::Pass, b"cd".to_vec(), false)),
            vec![(4, false)]
        );
        assert!(!d.holding());
        d.answer_chunk(BodyStep::Hold, b"ef".to_vec(), false);
        let replaced = d.answer_chunk(BodyStep::Replace(b"merged!".to_vec()), b"gh".to_vec(), true);
        assert_eq!(bodies(&replaced), vec![(7, true)]);
        assert!(!d.holding() && d.response_end);
    }

    #[test]
    fn releasing_sends_what_was_held_and_ends_an_ended_answer() {
        let mut d = Duplex::default();
        assert!(d.release_held(None).is_empty(), "nothing held, not ended");
        d.answer_chunk(BodyStep::Hold, b"{\"x\":1}".to_vec(), true);
        assert_eq!(bodies(&d.release_held(None)), vec![(7, true)]);
        let mut d = Duplex::default();
        d.answer_chunk(BodyStep::Hold, b"old".to_vec(), false);
        assert_eq!(
            bodies(&d.release_held(Some(b"new!".to_vec()))),
            vec![(4, false)]
        );
    }

    #[test]
    fn the_modes_come_from_the_protocol_configuration() {
        let d = Duplex::of(&ProtocolConfiguration {
            request_body_mode: BodySendMode::FullDuplexStreamed as i32,
            response_body_mode: BodySendMode::None as i32,
            ..Default::default()
        });
        assert!(d.request && !d.response);
        let d = Duplex::of(&ProtocolConfiguration {
            request_body_mode: BodySendMode::Buffered as i32,
            response_body_mode: BodySendMode::FullDuplexStreamed as i32,
            ..Default::default()
        });
        assert!(!d.request && d.response);
    }
}
