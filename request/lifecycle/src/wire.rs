//! The lifecycle's questions and answers as the gRPC contract carries them
//! (`proto/router.proto`): the one place they are converted.

use sglang_envoy_proto::{
    route_response::Outcome, BodyField, Decision, Header, NeedBody, Queued, Rejection,
    RouteRequest, RouteResponse,
};

use crate::question::{Answer, Destination, FollowPrefill, Question, Routed, Unrouted};
use crate::reply::LocalReply;

impl From<RouteRequest> for Question {
    fn from(r: RouteRequest) -> Self {
        Question {
            path: r.path,
            method: r.method,
            request_id: r.request_id,
            routing_key: r.routing_key,
            authorization: r.authorization,
            traceparent: r.traceparent,
            model: r.model,
            tenant: r.tenant,
            priority: r.priority,
            client_address: r.client_address,
            routing_text: r.routing_text,
            stream: r.stream,
            body_bytes: r.body_bytes,
            ticket: r.ticket,
            headers: r.headers.into_iter().map(|h| (h.name, h.value)).collect(),
            body: r.body,
            // The filter's questions carry none.
            subset: None,
            // The filter's Envoy configs walk a list (override_host).
            destination: Destination::List,
        }
    }
}

impl From<Question> for RouteRequest {
    fn from(q: Question) -> Self {
        RouteRequest {
            path: q.path,
            method: q.method,
            request_id: q.request_id,
            routing_key: q.routing_key,
            authorization: q.authorization,
            traceparent: q.traceparent,
            model: q.model,
            tenant: q.tenant,
            priority: q.priority,
            client_address: q.client_address,
            routing_text: q.routing_text,
            stream: q.stream,
            body_bytes: q.body_bytes,
            ticket: q.ticket,
            headers: q
                .headers
                .into_iter()
                .map(|(name, value)| Header { name, value })
                .collect(),
            body: q.body,
            // Set by the filter when the question goes on its session.
            prefill_follows: false,
        }
    }
}

/// The answer a `RouteResponse` carries; an unreadable one is a 502.
pub fn answer_of(response: RouteResponse) -> Answer {
    match response.outcome {
        Some(Outcome::Decision(d)) => Ok(Routed {
            ticket: d.ticket,
            endpoints: d.endpoints,
            worker: d.worker_url,
            inject: d
                .inject
                .into_iter()
                .map(|f| (f.key, f.json_value))
                .collect(),
            request_headers: d
                .request_headers
                .into_iter()
                .map(|h| (h.name, h.value))
                .collect(),
            prefill: d.await_prefill.then_some(FollowPrefill {
                merge_input_logprobs: d.merge_input_logprobs,
                outcome_follows: d.prefill_follows,
            }),
            report_cached_tokens: d.report_cached_tokens,
            report_prefilled: d.report_prefilled,
        }),
        Some(Outcome::Rejection(r)) => Err(Unrouted::Rejected(
            LocalReply::new(status_of(r.http_status), &r.error_type, r.message)
                .with_code(&r.error_code)
                .with_body(r.body),
        )),
        Some(Outcome::Queued(q)) => Err(Unrouted::Queued { wait_ms: q.wait_ms }),
        Some(Outcome::NeedBody(_)) => Err(Unrouted::NeedBody),
        None => Err(Unrouted::Rejected(LocalReply::unreadable())),
    }
}

/// `answer` as a `RouteResponse`.
pub fn response_of(answer: Answer) -> RouteResponse {
    let outcome = match answer {
        Ok(r) => Outcome::Decision(Decision {
            ticket: r.ticket,
            endpoints: r.endpoints,
            worker_url: r.worker,
            inject: r
                .inject
                .into_iter()
                .map(|(key, json_value)| BodyField { key, json_value })
                .collect(),
            await_prefill: r.prefill.is_some(),
            merge_input_logprobs: r.prefill.is_some_and(|p| p.merge_input_logprobs),
            request_headers: r
                .request_headers
                .into_iter()
                .map(|(name, value)| Header { name, value })
                .collect(),
            report_cached_tokens: r.report_cached_tokens,
            report_prefilled: r.report_prefilled,
            prefill_follows: r.prefill.is_some_and(|p| p.outcome_follows),
        }),
        Err(Unrouted::Rejected(reply)) => Outcome::Rejection(Rejection {
            http_status: u32::from(reply.status),
            error_type: reply.kind,
            message: reply.message,
            error_code: reply.code,
            body: reply.body,
        }),
        Err(Unrouted::Queued { wait_ms }) => Outcome::Queued(Queued { wait_ms }),
        Err(Unrouted::NeedBody) => Outcome::NeedBody(NeedBody {}),
    };
    RouteResponse {
        outcome: Some(outcome),
    }
}

/// An HTTP status from the wire; 503 when it is not one.
pub fn status_of(code: u32) -> u16 {
    u16::try_from(code)
        .ok()
        .filter(|s| (100..=599).contains(s))
        .unwrap_or(503)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_survive_the_wire() {
        let answers: Vec<Answer> = vec![
            Ok(Routed {
                ticket: 9,
                endpoints: vec!["10.0.0.1:1".into(), "10.0.0.2:1".into()],
                worker: "http://10.0.0.1:1".into(),
                inject: vec![("rid".into(), "\"x\"".into())],
                request_headers: vec![("x-envoy-max-retries".into(), "1".into())],
                prefill: Some(FollowPrefill {
                    merge_input_logprobs: true,
                    outcome_follows: true,
                }),
                report_cached_tokens: true,
                report_prefilled: true,
            }),
            Err(Unrouted::Rejected(LocalReply::new(
                429,
                "rate_limited",
                "slow",
            ))),
            Err(Unrouted::Rejected(LocalReply::model_not_found("x"))),
            Err(Unrouted::Rejected(LocalReply::answer("list", "{}".into()))),
            Err(Unrouted::Queued { wait_ms: 7 }),
            Err(Unrouted::NeedBody),
        ];
        for a in answers {
            assert_eq!(answer_of(response_of(a.clone())), a);
        }
        assert_eq!(
            answer_of(RouteResponse { outcome: None }),
            Err(Unrouted::Rejected(LocalReply::unreadable()))
        );
        let odd = RouteResponse {
            outcome: Some(Outcome::Rejection(Rejection {
                http_status: 70_000,
                ..Default::default()
            })),
        };
        assert!(matches!(answer_of(odd), Err(Unrouted::Rejected(r)) if r.status == 503));
    }

    #[test]
    fn questions_survive_the_wire() {
        let q = Question {
            path: "/generate".into(),
            headers: vec![("traceparent".into(), "00-1".into())],
            body: b"{}".to_vec(),
            ticket: 4,
            model: "alpha".into(),
            ..Default::default()
        };
        assert_eq!(Question::from(RouteRequest::from(q.clone())), q);
    }
}
