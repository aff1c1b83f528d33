use proxy_wasm::traits::HttpContext;
use proxy_wasm::types::Status;
use sglang_envoy_lifecycle::names::{ERROR_CODE_HEADER, ERROR_HEADER};
use sglang_envoy_lifecycle::LocalReply;

/// Ends the request with the router's own OpenAI-shaped JSON error.
pub fn send_reply(ctx: &dyn HttpContext, reply: &LocalReply) {
    ctx.send_http_response(
        u32::from(reply.status),
        headers(reply),
        Some(reply.json().as_bytes()),
    );
}

/// Ends the request of HTTP context `context` with `reply`, from another
/// context of the same VM (the root context's timer). Fails harmlessly
/// when that request has already gone.
pub fn send_reply_for(context: u32, reply: &LocalReply) -> Result<(), Status> {
    proxy_wasm::hostcalls::set_effective_context(context)?;
    proxy_wasm::hostcalls::send_http_response(
        u32::from(reply.status),
        headers(reply),
        Some(reply.json().as_bytes()),
    )
}

/// The headers of the router's own reply: its JSON, the marker Envoy's
/// `local_reply_config` keeps such replies by, and smg's error code.
fn headers(reply: &LocalReply) -> Vec<(&str, &str)> {
    let mut headers = vec![
        ("content-type", "application/json"),
        (ERROR_HEADER, reply.kind.as_str()),
    ];
    if !reply.code.is_empty() {
        headers.push((ERROR_CODE_HEADER, reply.code.as_str()));
    }
    headers
}
