//! The sglang-envoy proxy-wasm HTTP filter.
//!
//! Per request (see `http/`): buffer the JSON body, validate it, ask the
//! control plane over gRPC which worker to use, splice in the fields the
//! decision requires, name the worker in the header Envoy's `override_host`
//! load-balancing policy reads, and resume. Questions, answers and the
//! request's end travel on one long-lived stream per VM (`session.rs`),
//! owned by the root context (`root.rs`), which hands each answer to the
//! request that asked (`contexts.rs`); while that stream is down, questions
//! take calls of their own and ends a batched report.
//!
//! While the control plane cannot be reached, requests keep flowing: the root
//! context polls the list of healthy workers (`fallback.rs`) and a stream
//! whose routing question fails picks one of them in turn. Once the
//! control plane refuses a call, requests stop calling it until a probe
//! finds it back (`reach.rs`).
//!
//! Nothing here may panic: a panic kills the wasm VM for every request that
//! follows on this Envoy worker thread.

// Public so that native builds (tests, clippy) see the code the wasm entry
// point uses; the entry point itself exists only on wasm32.
pub mod body_wait;
pub mod budget;
pub mod completions;
pub mod config;
pub mod contexts;
pub mod deadlines;
pub mod fallback;
pub mod holds;
pub mod host;
pub mod http;
pub mod reach;
pub mod reply;
pub mod root;
pub mod session;
pub mod stats;

pub use config::FilterConfig;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::Root::new(context_id))
    });
}}
