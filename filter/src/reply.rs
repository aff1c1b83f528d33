use proxy_wasm::traits::HttpContext;
use sglang_envoy_body::openai_error_json;

/// Ends the request with an OpenAI-shaped JSON error.
pub fn send_error(ctx: &dyn HttpContext, status: u16, kind: &str, message: &str) {
    let body = openai_error_json(status, kind, message);
    ctx.send_http_response(
        u32::from(status),
        vec![
            ("content-type", "application/json"),
            ("x-sglang-envoy-error", kind),
        ],
        Some(body.as_bytes()),
    );
}
