//! The routing decision proper: which units, in which order, with which
//! fields, counted how. Questions and answers are the router's own types
//! (`sglang_envoy_lifecycle::{Question, Answer}`); the gRPC service
//! converts them at its edge, ext_proc uses them as they are.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sglang_envoy_body::{is_info_path, too_large, RequestBody, Route};
use sglang_envoy_lifecycle::{
    Answer, ClientKey, FollowPrefill, LocalReply, Mode, Question, Routed, Unrouted,
};
use tracing::debug;

use super::share::Shares;
use super::stopwatch::Stopwatch;
use super::{exact, Engine};
use crate::admission::class::Class;
use crate::admission::tenants::{tenant_key, Sender, TENANT_OVER_RATE};
use crate::admission::Caller;
use crate::pd::{self, PrefillJob};
use crate::policy::RouteInput;
use crate::retry;
use crate::routing_key::RoutingKey;
use crate::shared_tree::MAX_TEXT;
use crate::tickets::{Counted, PrefillHandle};
use crate::workers::{Role, Worker};

/// What the engine chose for one question: the units of `plan` in order
/// (the chosen one, then those Envoy retries on).
struct Choice {
    plan: Vec<Arc<Worker>>,
    /// The ticket its load is counted under (0: none, for info requests).
    ticket: u64,
    /// Fields to splice into the body.
    inject: Vec<(&'static str, String)>,
    /// The client asked for a stream (sets Envoy's per-try timeout).
    stream: bool,
    /// PD: the prefill half was sent.
    prefill: Option<FollowPrefill>,
    /// The cached tokens the chosen worker should report (KV events).
    predicted: Option<u64>,
    /// Ask for the report that the worker's prefill ended.
    report_prefilled: bool,
}

/// An error answer for the client.
fn rejected(status: u16, kind: &str, message: impl Into<String>) -> Unrouted {
    Unrouted::Rejected(LocalReply::new(status, kind, message))
}

fn no_unit() -> Unrouted {
    rejected(503, "service_unavailable", "no worker could be chosen")
}

impl Engine {
    /// Answers one routing question; with `--enable-trace`, inside a
    /// decision span that joins the request's trace.
    pub fn route(&self, q: &Question) -> Answer {
        let mut shares = Shares::default();
        let answer = self.route_noting(q, &mut shares);
        self.send_shares(shares, || {
            q.routing_text[..q.routing_text.len().min(MAX_TEXT)].to_vec()
        });
        answer
    }

    /// [`Engine::route`], noting in `shares` where the routing text goes
    /// for the other control planes (sent by the caller, after).
    pub(super) fn route_noting(&self, q: &Question, shares: &mut Shares) -> Answer {
        if !self.options.trace {
            return self.admit_and_answer(q, shares);
        }
        let span = crate::trace::decision_span(&q.path, q.ticket, &q.traceparent);
        let answer = span.in_scope(|| self.admit_and_answer(q, shares));
        match &answer {
            Ok(routed) => {
                span.record("worker", routed.worker.as_str());
            }
            Err(Unrouted::Rejected(reply)) => {
                span.record("status", reply.status);
            }
            Err(_) => {}
        }
        answer
    }

    /// Refuses what the flags forbid (bodies over `--max-payload-size`,
    /// inference without `--api-key`); then, with admission control, an
    /// inference request over the limit is queued (or refused) first, and a
    /// slot that does not end in a decision is freed at once.
    fn admit_and_answer(&self, q: &Question, shares: &mut Shares) -> Answer {
        // `--max-payload-size` stands whatever limit the front door has.
        if q.body_bytes > self.options.max_body_bytes as u64 {
            self.metrics.error("payload_too_large");
            return Err(Unrouted::Rejected(
                too_large(self.options.max_body_bytes).into(),
            ));
        }
        // `--api-key`, for inference requests: the front door checks it at
        // the request's head when it knows the key; this check stands when
        // it does not (a filter that has not heard from us yet).
        if let Some(key) = self.options.client_key {
            if Route::from_path(&q.path).is_some() && !key.admits(&q.authorization) {
                self.metrics.error("unauthorized");
                return Err(Unrouted::Rejected(ClientKey::refusal()));
            }
        }
        let Some(gate) = self
            .gate
            .as_ref()
            .filter(|_| q.ticket != 0 && Route::from_path(&q.path).is_some())
        else {
            return self.answer(q, shares);
        };
        if let Some(unrouted) = gate.check(q.ticket, &self.caller(q)) {
            if let Unrouted::Rejected(r) = &unrouted {
                self.metrics.error(if r.kind == TENANT_OVER_RATE {
                    "tenant_rate_limited"
                } else {
                    "queue_full"
                });
            }
            return Err(unrouted);
        }
        let answer = self.answer(q, shares);
        if let Err(Unrouted::Rejected(_)) = answer {
            gate.release(q.ticket);
        }
        answer
    }

    /// Who `q` is for, as smg resolves it: the API key it passed, else the
    /// tenant header when trusted, else the client's address.
    fn caller(&self, q: &Question) -> Caller {
        let authenticated = self
            .options
            .client_key
            .and_then(|_| ClientKey::presented(&q.authorization));
        let sender = Sender {
            authenticated: authenticated.as_ref(),
            header: &q.tenant,
            address: &q.client_address,
        };
        Caller {
            tenant: tenant_key(sender, self.options.tenant_header.is_some()),
            asked: Class::from_header(&q.priority),
        }
    }

    fn answer(&self, q: &Question, shares: &mut Shares) -> Answer {
        let c = self.decide_route(q, shares)?;
        let first = c.plan.first().ok_or_else(no_unit)?;
        Ok(Routed {
            ticket: c.ticket,
            endpoints: c.plan.iter().map(|w| w.endpoint_text.clone()).collect(),
            worker: first.url.clone(),
            inject: c
                .inject
                .into_iter()
                .map(|(key, value)| (key.to_string(), value))
                .collect(),
            request_headers: retry::request_headers(c.stream, &self.options.retry)
                .into_iter()
                .map(|h| (h.name, h.value))
                .collect(),
            prefill: c.prefill,
            report_cached_tokens: c.predicted.is_some(),
            report_prefilled: c.report_prefilled,
        })
    }

    /// Chooses the units for `req` and counts its load.
    fn decide_route(&self, req: &Question, shares: &mut Shares) -> Result<Choice, Unrouted> {
        let started = Stopwatch::start(self.options.decision_cpu);
        let serving_role = Role::serving(self.options.mode);
        let mut serving = self.registry.available(serving_role);
        if let Some(subset) = &req.subset {
            // The gateway's subset hint: only these endpoints, or none.
            let narrowed = serving
                .iter()
                .filter(|w| subset.iter().any(|e| *e == w.endpoint_text))
                .cloned()
                .collect();
            serving = Arc::new(narrowed);
            if serving.is_empty() {
                self.metrics.error("no_healthy_workers");
                return Err(rejected(
                    503,
                    "service_unavailable",
                    "no endpoint of the gateway's subset hint is ready",
                ));
            }
        }

        // Model and server info: any healthy worker, no load counted; the
        // list of several models, the registry's.
        if req.method == "GET" && is_info_path(&req.path) {
            if let Some(list) = self.model_list(&req.path) {
                return Err(Unrouted::Rejected(list));
            }
            if serving.is_empty() {
                return Err(self.no_workers(serving_role));
            }
            let index = self.info_turn.fetch_add(1, Ordering::Relaxed) % serving.len();
            return Ok(Choice {
                plan: retry::plan(&serving, index, &self.options.retry, req.destination),
                ticket: 0,
                inject: Vec::new(),
                stream: false,
                prefill: None,
                predicted: None,
                report_prefilled: false,
            });
        }
        let Some(route) = Route::from_path(&req.path) else {
            return Err(rejected(
                404,
                "not_found",
                "this route is not served by the router",
            ));
        };
        // Before the policies: they choose among the model's workers only.
        let serving = self.for_model(req, serving_role, serving)?;
        if self.options.mode == Mode::Pd {
            return self.route_pd(req, route, &serving, started, shares);
        }
        if serving.is_empty() {
            return Err(self.no_workers(Role::Regular));
        }
        let exact = self.exact_matches(req, &serving)?;
        let mut input = route_input(req);
        input.exact = exact.as_ref().map(|m| m.bytes.as_slice());
        let selection = self.policies.regular.select(&serving, &input);
        let worker = serving.get(selection.index).ok_or_else(no_unit)?;
        self.note_share(&*self.policies.regular, worker, input.text, shares);
        if let (Some(cache), Some(m)) = (&self.exact, &exact) {
            cache.note_routed(worker, m);
        }
        let plan = retry::plan(
            &serving,
            selection.index,
            &self.options.retry,
            req.destination,
        );
        let predicted = exact
            .as_ref()
            .and_then(|m| m.tokens.get(selection.index).copied().flatten())
            .map(|t| t as u64);
        self.count(
            &plan,
            req.ticket,
            selection.work,
            input.routing_key,
            None,
            predicted,
        );
        self.metrics
            .decided(route.path(), selection.cache, started.read());
        debug!(path = %req.path, worker = %worker.url, cache = ?selection.cache, "routed");
        Ok(Choice {
            inject: pd::dp_fields(worker),
            plan,
            ticket: req.ticket,
            stream: req.stream,
            prefill: None,
            predicted,
            // A stream's first bytes end its prefill; a whole answer's
            // come at its end, which is reported anyway.
            report_prefilled: req.stream
                && selection.work > 0
                && self.policies.regular.prices_queued_prefill(),
        })
    }

    /// PD mode: chooses a prefill and a decode unit, starts the prefill
    /// request, and sends the decode half back through Envoy.
    fn route_pd(
        &self,
        req: &Question,
        route: Route,
        decodes: &[Arc<Worker>],
        started: Stopwatch,
        shares: &mut Shares,
    ) -> Result<Choice, Unrouted> {
        if req.body.is_empty() {
            // The filter sends bodies only once asked; from then on it always does.
            return Err(Unrouted::NeedBody);
        }
        let invalid =
            |e: sglang_envoy_body::BodyError| rejected(400, "invalid_request_error", e.to_string());
        let body = RequestBody::parse(&req.body).map_err(invalid)?;
        let prefills =
            self.for_model(req, Role::Prefill, self.registry.available(Role::Prefill))?;
        if prefills.is_empty() {
            return Err(self.no_workers(Role::Prefill));
        }
        if decodes.is_empty() {
            return Err(self.no_workers(Role::Decode));
        }
        let exact = self.exact_matches(req, &prefills)?;
        let mut input = route_input(req);
        input.exact = exact.as_ref().map(|m| m.bytes.as_slice());
        let p = self.policies.prefill.select(&prefills, &input);
        input.exact = None;
        let d = self.policies.decode.select(decodes, &input);
        let (Some(prefill), Some(decode)) = (prefills.get(p.index), decodes.get(d.index)) else {
            return Err(no_unit());
        };
        self.note_share(&*self.policies.prefill, prefill, input.text, shares);
        self.note_share(&*self.policies.decode, decode, input.text, shares);
        if let (Some(cache), Some(m)) = (&self.exact, &exact) {
            cache.note_routed(prefill, m);
        }
        let pd_fields = pd::pd_fields(route, &body, prefill, decode, &self.rids);
        let prefill_body = body
            .with_fields(&pd::as_pairs(&pd_fields.prefill))
            .map_err(invalid)?;
        let want_logprobs = pd::wants_input_logprobs(route, &body);
        let plan = retry::plan(decodes, d.index, &self.options.retry, req.destination);
        let prefill_half = self.prefill.dispatch(PrefillJob {
            worker: prefill.clone(),
            path: req.path.clone(),
            headers: req.headers.clone(),
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
            // The decode worker's answer reports its own cache, not the
            // prefill's: nothing to check.
            None,
        );
        self.metrics.decided(route.path(), p.cache, started.read());
        debug!(path = %req.path, prefill = %prefill.url, decode = %decode.url, "routed PD pair");
        Ok(Choice {
            plan,
            ticket: req.ticket,
            inject: pd_fields.decode,
            stream: req.stream,
            prefill: Some(FollowPrefill {
                merge_input_logprobs: want_logprobs,
                // The session says so when it sends the outcome unasked.
                outcome_follows: false,
            }),
            predicted: None,
            // The prefill half's own end takes its work off its worker.
            report_prefilled: false,
        })
    }

    /// The exact cached prefixes of `req` over `workers`, when some of
    /// them publish KV events: `NeedBody` if the front door has not sent
    /// the body yet; `None` (the trees alone) when none publishes or the
    /// prompt's tokens cannot be known.
    fn exact_matches(
        &self,
        req: &Question,
        workers: &[Arc<Worker>],
    ) -> Result<Option<exact::Matches>, Unrouted> {
        let Some(cache) = &self.exact else {
            return Ok(None);
        };
        if !cache.covers(workers) {
            return Ok(None);
        }
        if req.body.is_empty() {
            if req.body_bytes > 0 {
                return Err(Unrouted::NeedBody);
            }
            return Ok(None);
        }
        match cache.matches(&req.path, &req.body, req.routing_text.len(), workers) {
            Ok(m) => {
                self.metrics.exact_cache("events");
                Ok(Some(m))
            }
            Err(e) => {
                self.metrics.exact_cache(exact::skip_reason(&e));
                debug!(path = %req.path, error = %e, "routed on the tree: no exact match");
                Ok(None)
            }
        }
    }

    /// Counts a request (its estimated `work`, its routing key) on the first
    /// unit of `plan`, with its PD prefill half if any and the cached
    /// tokens it should find, until `ticket` is reported finished.
    fn count(
        &self,
        plan: &[Arc<Worker>],
        ticket: u64,
        work: u64,
        key: Option<RoutingKey>,
        prefill: Option<PrefillHandle>,
        predicted: Option<u64>,
    ) {
        let Some(worker) = plan.first() else {
            prefill.inspect(PrefillHandle::stop);
            return;
        };
        let mut counted = Counted::start(worker.clone(), work, key)
            .with_plan(plan.to_vec())
            .with_prediction(predicted);
        if let Some(prefill) = prefill {
            counted = counted.with_prefill(prefill);
        }
        if ticket != 0 {
            // Released at once if the end came first.
            self.tickets.open(ticket, counted);
        }
        // Else no ticket to report the end with: released here, dropped.
    }

    pub(super) fn no_workers(&self, role: Role) -> Unrouted {
        self.metrics.error("no_healthy_workers");
        let what = match role {
            Role::Regular => "workers",
            Role::Prefill => "prefill workers",
            Role::Decode => "decode workers",
        };
        rejected(
            503,
            "service_unavailable",
            format!("no healthy {what} available (each is unhealthy or its circuit is open)"),
        )
    }
}

/// What the policies see of a question.
fn route_input(req: &Question) -> RouteInput<'_> {
    RouteInput {
        text: &req.routing_text,
        routing_key: RoutingKey::from_header(&req.routing_key),
        exact: None,
    }
}
