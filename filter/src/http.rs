use std::rc::Rc;
use std::time::{Duration, SystemTime};

use log::{debug, warn};
use prost::Message;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use sglang_envoy_body::{is_info_path, RequestBody, Route};
use sglang_envoy_proto::{
    route_response, Completion, Decision, RouteRequest, RouteResponse, SERVICE_NAME,
};

use crate::completions::CompletionQueue;
use crate::config::FilterConfig;
use crate::reply::send_error;

/// One HTTP stream passing through the filter.
pub struct Request {
    config: Rc<FilterConfig>,
    queue: CompletionQueue,
    ticket: u64,
    /// The inference route, for POSTs whose body we route on.
    route: Option<Route>,
    path: String,
    method: String,
    started: Option<SystemTime>,
    /// Set once a `Route` call was dispatched: from then on the control plane
    /// may have counted load under our ticket, so `on_log` must report it.
    asked: bool,
    /// The response reached its end (as opposed to a hang-up or reset).
    response_done: bool,
}

impl Request {
    /// A stream with its `ticket`, reporting its end into `queue`.
    pub fn new(config: Rc<FilterConfig>, queue: CompletionQueue, ticket: u64) -> Self {
        Request {
            config,
            queue,
            ticket,
            route: None,
            path: String::new(),
            method: String::new(),
            started: None,
            asked: false,
            response_done: false,
        }
    }

    /// Sends the routing question; the answer arrives in `on_grpc_call_response`.
    fn ask(&mut self, routing_text: Vec<u8>, stream: bool, body_bytes: usize) -> Action {
        let question = RouteRequest {
            path: self.path.clone(),
            method: self.method.clone(),
            routing_text,
            stream,
            request_id: self
                .get_http_request_header("x-request-id")
                .unwrap_or_default(),
            body_bytes: body_bytes as u64,
            ticket: self.ticket,
        }
        .encode_to_vec();
        match self.dispatch_grpc_call(
            &self.config.control_plane_cluster,
            SERVICE_NAME,
            "Route",
            vec![],
            Some(&question),
            Duration::from_millis(self.config.route_timeout_ms),
        ) {
            Ok(_) => {
                self.asked = true;
                Action::Pause
            }
            Err(status) => {
                warn!("cannot reach the control plane: {status:?}");
                send_error(
                    self,
                    503,
                    "service_unavailable",
                    "the router's control plane cannot be reached",
                );
                Action::Pause
            }
        }
    }

    /// Applies a decision: injected body fields, then the worker endpoints.
    fn apply(&mut self, decision: Decision) {
        if decision.endpoints.is_empty() {
            send_error(self, 503, "service_unavailable", "no worker was chosen");
            return;
        }
        if !decision.inject.is_empty() {
            if let Err(message) = self.inject(&decision) {
                send_error(self, 500, "internal_error", &message);
                return;
            }
        }
        let endpoints = decision.endpoints.join(",");
        self.set_http_request_header(&self.config.endpoint_header, Some(&endpoints));
        debug!("{} -> {} ({endpoints})", self.path, decision.worker_url);
        self.resume_http_request();
    }

    /// Splices the decision's fields into the buffered body.
    fn inject(&mut self, decision: &Decision) -> Result<(), String> {
        let body = self
            .get_http_request_body(0, self.config.max_body_bytes)
            .unwrap_or_default();
        let parsed = RequestBody::parse(&body).map_err(|e| e.to_string())?;
        let fields: Vec<(&str, &str)> = decision
            .inject
            .iter()
            .map(|f| (f.key.as_str(), f.json_value.as_str()))
            .collect();
        let new_body = parsed.with_fields(&fields).map_err(|e| e.to_string())?;
        self.set_http_request_body(0, body.len(), &new_body);
        self.set_http_request_header("content-length", Some(&new_body.len().to_string()));
        Ok(())
    }

    fn elapsed_us(&self) -> u64 {
        let now = self.get_current_time();
        self.started
            .and_then(|s| now.duration_since(s).ok())
            .map_or(0, |d| d.as_micros() as u64)
    }
}

impl Context for Request {
    fn on_grpc_call_response(&mut self, _token: u32, status_code: u32, size: usize) {
        if status_code != 0 {
            warn!(
                "control plane answered grpc status {status_code} for {}",
                self.path
            );
            send_error(
                self,
                503,
                "service_unavailable",
                &format!("the router's control plane did not answer (grpc status {status_code})"),
            );
            return;
        }
        let bytes = self
            .get_grpc_call_response_body(0, size)
            .unwrap_or_default();
        match RouteResponse::decode(bytes.as_slice()).map(|r| r.outcome) {
            Ok(Some(route_response::Outcome::Decision(d))) => self.apply(d),
            Ok(Some(route_response::Outcome::Rejection(r))) => {
                let status = u16::try_from(r.http_status).unwrap_or(503);
                send_error(self, status, &r.error_type, &r.message);
            }
            Ok(None) | Err(_) => send_error(
                self,
                502,
                "bad_gateway",
                "the router's control plane sent an unreadable answer",
            ),
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        self.started = Some(self.get_current_time());
        // Only the control plane chooses the worker: a client must not.
        self.set_http_request_header(&self.config.endpoint_header, None);
        self.path = self.get_http_request_header(":path").unwrap_or_default();
        self.method = self.get_http_request_header(":method").unwrap_or_default();

        if let Some(route) = Route::from_path(&self.path) {
            if self.method != "POST" {
                send_error(
                    self,
                    405,
                    "invalid_request_error",
                    "use POST for this route",
                );
                return Action::Pause;
            }
            if end_of_stream {
                send_error(
                    self,
                    400,
                    "invalid_request_error",
                    "request body is required",
                );
                return Action::Pause;
            }
            if let Some(len) = self
                .get_http_request_header("content-length")
                .and_then(|v| v.parse::<usize>().ok())
            {
                if len > self.config.max_body_bytes {
                    return self.too_large();
                }
            }
            self.route = Some(route);
            // Wait for the body (needs `allow_on_headers_stop_iteration`).
            return Action::Pause;
        }
        if self.method == "GET" && is_info_path(&self.path) {
            return self.ask(Vec::new(), false, 0);
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(route) = self.route else {
            return Action::Continue;
        };
        if body_size > self.config.max_body_bytes {
            return self.too_large();
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let body = self.get_http_request_body(0, body_size).unwrap_or_default();
        let parsed = match RequestBody::parse(&body) {
            Ok(p) => p,
            Err(e) => {
                send_error(self, 400, "invalid_request_error", &e.to_string());
                return Action::Pause;
            }
        };
        let text = parsed.routing_text(route).into_bytes();
        let stream = parsed.is_stream();
        self.ask(text, stream, body.len())
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        self.response_done |= end_of_stream;
        Action::Continue
    }

    fn on_http_response_body(&mut self, _size: usize, end_of_stream: bool) -> Action {
        self.response_done |= end_of_stream;
        Action::Continue
    }

    fn on_log(&mut self) {
        if !self.asked {
            return;
        }
        let http_status = self
            .get_property(vec!["response", "code"])
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map_or(0, |b| u64::from_le_bytes(b) as u32);
        let details = self
            .get_property(vec!["response", "code_details"])
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        let upstream_host = self
            .get_property(vec!["upstream", "address"])
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        self.queue.push(Completion {
            ticket: self.ticket,
            http_status,
            // Unfinished and not reset by the worker: the client hung up.
            client_cancelled: !self.response_done && !details.starts_with("upstream"),
            upstream_host,
            duration_us: self.elapsed_us(),
        });
    }
}

impl Request {
    fn too_large(&mut self) -> Action {
        let max = self.config.max_body_bytes;
        send_error(
            self,
            413,
            "invalid_request_error",
            &format!("request body is larger than the router's limit of {max} bytes"),
        );
        Action::Pause
    }
}
