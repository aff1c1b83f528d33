use proxy_wasm::traits::HttpContext;
use proxy_wasm::types::Status;
use sglang_envoy_body::{openai_error_json, Refusal};

/// The header that marks a reply as the router's own error. Envoy's
/// `local_reply_config` leaves replies carrying it as they are and turns
/// Envoy's own (text) replies into the same JSON shape.
pub const ERROR_HEADER: &str = "x-sglang-envoy-error";

/// Ends the request with an OpenAI-shaped JSON error.
pub fn send_error(ctx: &dyn HttpContext, status: u16, kind: &str, message: &str) {
    let body = openai_error_json(status, kind, message);
    ctx.send_http_response(
        u32::from(status),
        vec![("content-type", "application/json"), (ERROR_HEADER, kind)],
        Some(body.as_bytes()),
    );
}

/// Ends the request with the error a [`Refusal`] describes.
pub fn send_refusal(ctx: &dyn HttpContext, r: &Refusal) {
    send_error(ctx, r.status, r.kind, &r.message);
}

/// Ends the request of HTTP context `context` with an OpenAI-shaped JSON
/// error, from another context of the same VM (the root context's timer).
/// Fails harmlessly when that request has already gone.
pub fn send_error_for(context: u32, status: u16, kind: &str, message: &str) -> Result<(), Status> {
    proxy_wasm::hostcalls::set_effective_context(context)?;
    let body = openai_error_json(status, kind, message);
    proxy_wasm::hostcalls::send_http_response(
        u32::from(status),
        vec![("content-type", "application/json"), (ERROR_HEADER, kind)],
        Some(body.as_bytes()),
    )
}
