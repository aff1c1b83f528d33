//! The routing decision proper: which units, in which order, with which
//! fields, counted how. Decisions are the engine's own values ([`Routed`],
//! [`Rejected`]); they become the wire's `RouteResponse` in one place.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use sglang_envoy_body::{is_info_path, RequestBody, Route};
use sglang_envoy_lifecycle::Mode;
use sglang_envoy_proto::{
    route_response, BodyField, Decision, NeedBody, Rejection, RouteRequest, RouteResponse,
};
use tracing::debug;

use super::Engine;
use crate::pd::{self, PrefillJob};
use crate::policy::RouteInput;
use crate::retry;
use crate::routing_key::RoutingKey;
use crate::tickets::{Held, PrefillHandle};
use crate::workers::{Role, Worker};

/// A decision: the request goes to the units of `plan` in order (the
/// chosen one, then those Envoy retries on).
pub(super) struct Routed {
    plan: Vec<Arc<Worker>>,
    /// The ticket its load is counted under (0: none, for info requests).
    ticket: u64,
    /// Fields to splice into the body.
    inject: Vec<(&'static str, String)>,
    /// The client asked for a stream (sets Envoy's per-try timeout).
    stream: bool,
    /// Regular, or PD with the prefill half sent: follow it, and merge its
    /// input logprobs when `merge_input_logprobs`.
    mode: Mode,
    merge_input_logprobs: bool,
}

/// Why a question gets no decision (yet).
pub(super) enum Rejected {
    /// An error for the client.
    Error {
        status: u32,
        kind: &'static str,
        message: String,
    },
    /// PD: ask again with the body (the filter sends bodies only once asked;
    /// from then on it always does).
    NeedBody,
}

impl Rejected {
    fn error(status: u32, kind: &'static str, message: impl Into<String>) -> Self {
        Rejected::Error {
            status,
            kind,
            message: message.into(),
        }
    }

    fn no_unit() -> Self {
        Rejected::error(503, "service_unavailable", "no worker could be chosen")
    }
}

impl Engine {
    /// Answers one routing question. With admission control, an inference
    /// request over the limit is queued (or refused) first, and a slot that
    /// does not end in a decision is freed at once.
    pub fn route(&self, req: &RouteRequest) -> RouteResponse {
        let Some(gate) = self
            .gate
            .as_ref()
            .filter(|_| req.ticket != 0 && Route::from_path(&req.path).is_some())
        else {
            return self.answer(req);
        };
        if let Some(answer) = gate.check(req.ticket) {
            if let Some(route_response::Outcome::Rejection(_)) = &answer.outcome {
                self.metrics.error("queue_full");
            }
            return answer;
        }
        let answer = self.answer(req);
        if let Some(route_response::Outcome::Rejection(_)) = &answer.outcome {
            gate.release(req.ticket);
        }
        answer
    }

    /// The decision for `req`, as the wire carries it.
    fn answer(&self, req: &RouteRequest) -> RouteResponse {
        let outcome = match self.decide_route(req) {
            Ok(routed) => self.to_decision(routed),
            Err(Rejected::NeedBody) => route_response::Outcome::NeedBody(NeedBody {}),
            Err(Rejected::Error {
                status,
                kind,
                message,
            }) => route_response::Outcome::Rejection(Rejection {
                http_status: status,
                error_type: kind.to_string(),
                message,
            }),
        };
        RouteResponse {
            outcome: Some(outcome),
        }
    }

    fn to_decision(&self, r: Routed) -> route_response::Outcome {
        let Some(first) = r.plan.first() else {
            return route_response::Outcome::Rejection(Rejection {
                http_status: 503,
                error_type: "service_unavailable".into(),
                message: "no worker could be chosen".into(),
            });
        };
        route_response::Outcome::Decision(Decision {
            ticket: r.ticket,
            endpoints: r.plan.iter().map(|w| w.endpoint_text.clone()).collect(),
            worker_url: first.url.clone(),
            inject: r
                .inject
                .into_iter()
                .map(|(key, json_value)| BodyField {
                    key: key.to_string(),
                    json_value,
                })
                .collect(),
            await_prefill: r.mode == Mode::Pd,
            merge_input_logprobs: r.merge_input_logprobs,
            request_headers: retry::request_headers(&r.plan, r.stream, &self.options.retry),
        })
    }

    /// Chooses the units for `req` and counts its load.
    fn decide_route(&self, req: &RouteRequest) -> Result<Routed, Rejected> {
        let started = Instant::now();
        let serving_role = Role::serving(self.options.mode);
        let serving = self.registry.available(serving_role);

        // Model and server info: any healthy worker, no load counted.
        if req.method == "GET" && is_info_path(&req.path) {
            if serving.is_empty() {
                return Err(self.no_workers(serving_role));
            }
            let index = self.info_turn.fetch_add(1, Ordering::Relaxed) % serving.len();
            return Ok(Routed {
                plan: retry::plan(&serving, index, &self.options.retry),
                ticket: 0,
                inject: Vec::new(),
                stream: false,
                mode: Mode::Regular,
                merge_input_logprobs: false,
            });
        }
        let Some(route) = Route::from_path(&req.path) else {
            return Err(Rejected::error(
                404,
                "not_found",
                "this route is not served by the router",
            ));
        };
        if self.options.mode == Mode::Pd {
            return self.route_pd(req, route, &serving, started);
        }
        if serving.is_empty() {
            return Err(self.no_workers(Role::Regular));
        }
        let input = route_input(req);
        let selection = self.policies.regular.select(&serving, &input);
        let worker = serving.get(selection.index).ok_or_else(Rejected::no_unit)?;
        let plan = retry::plan(&serving, selection.index, &self.options.retry);
        self.count(&plan, req.ticket, selection.work, input.routing_key, None);
        self.metrics
            .decided(route.path(), selection.cache, elapsed(started));
        debug!(path = %req.path, worker = %worker.url, cache = ?selection.cache, "routed");
        Ok(Routed {
            inject: pd::dp_fields(worker),
            plan,
            ticket: req.ticket,
            stream: req.stream,
            mode: Mode::Regular,
            merge_input_logprobs: false,
        })
    }

    /// PD mode: chooses a prefill and a decode unit, starts the prefill
    /// request, and sends the decode half back through Envoy.
    fn route_pd(
        &self,
        req: &RouteRequest,
        route: Route,
        decodes: &[Arc<Worker>],
        started: Instant,
    ) -> Result<Routed, Rejected> {
        if req.body.is_empty() {
            return Err(Rejected::NeedBody);
        }
        let invalid = |e: sglang_envoy_body::BodyError| {
            Rejected::error(400, "invalid_request_error", e.to_string())
        };
        let body = RequestBody::parse(&req.body).map_err(invalid)?;
        let prefills = self.registry.available(Role::Prefill);
        if prefills.is_empty() {
            return Err(self.no_workers(Role::Prefill));
        }
        if decodes.is_empty() {
            return Err(self.no_workers(Role::Decode));
        }
        let input = route_input(req);
        let p = self.policies.prefill.select(&prefills, &input);
        let d = self.policies.decode.select(decodes, &input);
        let (Some(prefill), Some(decode)) = (prefills.get(p.index), decodes.get(d.index)) else {
            return Err(Rejected::no_unit());
        };
        let pd_fields = pd::pd_fields(route, &body, prefill, decode, &self.rids);
        let prefill_body = body
            .with_fields(&pd::as_pairs(&pd_fields.prefill))
            .map_err(invalid)?;
        let want_logprobs = pd::wants_input_logprobs(route, &body);
        let plan = retry::plan(decodes, d.index, &self.options.retry);
        let prefill_half = self.prefill.dispatch(PrefillJob {
            worker: prefill.clone(),
            path: req.path.clone(),
            headers: req
                .headers
                .iter()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
            body: prefill_body,
            want_logprobs,
            work: p.work,
            routing_key: input.routing_key,
        });
        // One record: the decode's load and the prefill half, released
        // and stopped together when the request ends.
        self.count(
            &plan,
            req.ticket,
            d.work,
            input.routing_key,
            Some(prefill_half),
        );
        self.metrics
            .decided(route.path(), p.cache, elapsed(started));
        debug!(path = %req.path, prefill = %prefill.url, decode = %decode.url, "routed PD pair");
        Ok(Routed {
            plan,
            ticket: req.ticket,
            inject: pd_fields.decode,
            stream: req.stream,
            mode: Mode::Pd,
            merge_input_logprobs: want_logprobs,
        })
    }

    /// Counts a request (its estimated `work`, its routing key) on the first
    /// unit of `plan`, with its PD prefill half if any, until `ticket` is
    /// reported finished.
    fn count(
        &self,
        plan: &[Arc<Worker>],
        ticket: u64,
        work: u64,
        key: Option<RoutingKey>,
        prefill: Option<PrefillHandle>,
    ) {
        let Some(worker) = plan.first() else {
            prefill.inspect(PrefillHandle::stop);
            return;
        };
        let mut held = Held::start(worker.clone(), work, key).with_plan(plan.to_vec());
        if let Some(prefill) = prefill {
            held = held.with_prefill(prefill);
        }
        if ticket == 0 {
            // No ticket to report the end with.
            held.release();
        } else {
            // Released at once if the end came first.
            self.tickets.open(ticket, held);
        }
    }

    fn no_workers(&self, role: Role) -> Rejected {
        self.metrics.error("no_healthy_workers");
        let what = match role {
            Role::Regular => "workers",
            Role::Prefill => "prefill workers",
            Role::Decode => "decode workers",
        };
        Rejected::error(
            503,
            "service_unavailable",
            format!("no healthy {what} available (each is unhealthy or its circuit is open)"),
        )
    }
}

/// What the policies see of a question.
fn route_input(req: &RouteRequest) -> RouteInput<'_> {
    RouteInput {
        text: &req.routing_text,
        routing_key: RoutingKey::from_header(&req.routing_key),
    }
}

fn elapsed(started: Instant) -> f64 {
    started.elapsed().as_secs_f64()
}
