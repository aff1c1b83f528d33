//! A body and fields to inject: `body \0 key \0 value \0 ...`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sglang_envoy_body_fuzz::check_inject(data);
});
