//! Arbitrary bytes as a request body (and as a path / error message).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sglang_envoy_body_fuzz::check_parse(data);
    sglang_envoy_body_fuzz::check_text(data);
});
