//! The handle the SDK holds for one HTTP stream. The request itself is
//! shared (`Rc<RefCell<..>>`) so the root context can act for it when its
//! answer comes on the session stream; every Envoy callback is passed on.

use std::cell::RefCell;
use std::rc::Rc;

use log::error;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::{Request, Shared};

/// What the SDK calls for one HTTP stream.
pub struct RequestContext {
    request: Rc<RefCell<Request>>,
    context_id: u32,
    shared: Shared,
}

impl RequestContext {
    /// HTTP context `context_id` with its `ticket`, registered so the
    /// root context can find it.
    pub fn open(shared: &Shared, context_id: u32, ticket: u64) -> Self {
        let request = Rc::new(RefCell::new(Request::new(shared, context_id, ticket)));
        shared.contexts.add(context_id, &request);
        RequestContext {
            request,
            context_id,
            shared: shared.clone(),
        }
    }

    /// Runs `f` on the request. Envoy defers what a callback's host calls
    /// set off until the VM returns, so the request is never borrowed
    /// twice; if it were, the callback is skipped rather than trapping the
    /// VM (`or` is what Envoy is told then).
    fn with<T>(&self, or: T, f: impl FnOnce(&mut Request) -> T) -> T {
        match self.request.try_borrow_mut() {
            Ok(mut request) => f(&mut request),
            Err(_) => {
                error!("request {} re-entered; callback skipped", self.context_id);
                or
            }
        }
    }
}

impl Drop for RequestContext {
    fn drop(&mut self) {
        self.shared.contexts.remove(self.context_id);
    }
}

impl Context for RequestContext {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, trailers: usize) {
        self.with((), |r| {
            r.on_http_call_response(token, headers, body, trailers)
        });
    }

    fn on_grpc_call_response(&mut self, token: u32, status_code: u32, size: usize) {
        self.with((), |r| r.on_grpc_call_response(token, status_code, size));
    }
}

impl HttpContext for RequestContext {
    fn on_http_request_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |r| {
            r.on_http_request_headers(headers, end_of_stream)
        })
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |r| {
            r.on_http_request_body(size, end_of_stream)
        })
    }

    fn on_http_request_trailers(&mut self, trailers: usize) -> Action {
        self.with(Action::Continue, |r| r.on_http_request_trailers(trailers))
    }

    fn on_http_response_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |r| {
            r.on_http_response_headers(headers, end_of_stream)
        })
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |r| {
            r.on_http_response_body(size, end_of_stream)
        })
    }

    fn on_http_response_trailers(&mut self, trailers: usize) -> Action {
        self.with(Action::Continue, |r| r.on_http_response_trailers(trailers))
    }

    fn on_log(&mut self) {
        self.with((), |r| r.on_log());
        self.shared.contexts.remove(self.context_id);
    }
}
