//! What the lifecycle says to do, done with host calls.

use log::debug;
use proxy_wasm::traits::HttpContext;
use proxy_wasm::types::Action;
use sglang_envoy_lifecycle::{Forward, LocalReply, PrefillStep, ResponseStep, Step};

use super::{Flow, Request};
use crate::holds::Hold;

impl Request {
    /// Carries out a step of the request's way to its worker.
    pub(super) fn run(&mut self, step: Step) -> Flow {
        match step {
            Step::Ask(question) => self.ask(*question),
            Step::AwaitAdmission { wait_ms } => self.await_admission(wait_ms),
            Step::Forward(forward) => self.forward(forward),
            Step::Reply(reply) => {
                self.reply(reply);
                Flow::Wait
            }
            Step::Fallback => {
                if self.route_locally() {
                    Flow::Go
                } else {
                    self.reply(LocalReply::unreachable());
                    Flow::Wait
                }
            }
        }
    }

    /// Carries out a step from a callback that is not Envoy's request
    /// callback (an answer from the control plane): going on means resuming.
    pub(super) fn run_resuming(&mut self, step: Step) {
        if self.run(step) == Flow::Go {
            self.unhold();
            self.resume_http_request();
        }
    }

    /// Sends the request on, edited as the decision says.
    fn forward(&mut self, f: Forward) -> Flow {
        if let Some(follow) = f.prefill {
            if self.await_prefill(follow) == Flow::Wait {
                return Flow::Wait;
            }
        }
        if let Some(body) = &f.body {
            self.set_http_request_body(0, self.lc.body_bytes(), body);
            self.set_http_request_header("content-length", Some(&body.len().to_string()));
        }
        self.set_http_request_header(&self.shared.config.endpoint_header, Some(&f.endpoints));
        // How many of them Envoy tries, and how long a stream may take to
        // start (Envoy drops clients' own x-envoy-* headers; ours count).
        for (name, value) in &f.headers {
            self.set_http_request_header(name, Some(value));
        }
        debug!("{} -> {} ({})", self.lc.path(), f.worker, f.endpoints);
        Flow::Go
    }

    /// Carries out what the lifecycle says about the answer's head.
    pub(super) fn response_head_step(&mut self, step: ResponseStep) -> Action {
        match step {
            ResponseStep::Continue { release, report } => {
                if release.strip_length {
                    self.set_http_response_header("content-length", None);
                }
                // A failed answer waits until the control plane counted it.
                let flow = report.map_or(Flow::Go, |c| self.report_failure(c));
                if flow == Flow::Wait {
                    Action::Pause
                } else {
                    Action::Continue
                }
            }
            ResponseStep::Hold { grace: None } => {
                self.hold_head_for_prefill();
                Action::Pause
            }
            ResponseStep::Hold { grace: Some(grace) } => {
                if !self.await_prefill_for(grace) {
                    // The outcome cannot be asked for: the head goes on
                    // (`on_prefill_unknown` releases a held head).
                    self.lc.on_prefill_unknown();
                    return Action::Continue;
                }
                self.hold(Hold::AnswerHead, grace);
                Action::Pause
            }
        }
    }

    /// Carries out what the lifecycle says after the prefill's outcome
    /// (the answer's head may be held).
    pub(super) fn prefill_step(&mut self, step: PrefillStep) {
        match step {
            PrefillStep::Nothing => {}
            PrefillStep::Reply(reply) => self.reply(reply),
            PrefillStep::KeepHolding => {
                // Held from now on for the rest of the answer, which
                // Envoy brings: the filter waits for nothing else.
                self.unhold();
                self.set_http_response_header("content-length", None)
            }
            PrefillStep::Release { release, replace } => {
                self.unhold();
                if release.strip_length {
                    self.set_http_response_header("content-length", None);
                }
                if let Some(body) = replace {
                    self.set_http_response_body(0, self.response_held, &body);
                }
                self.response_held = 0;
                self.resume_http_response();
            }
        }
    }
}
