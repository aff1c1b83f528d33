//! Counters the filter keeps in Envoy's own stats: Envoy names them
//! `wasmcustom.<name>` on its admin `/stats` (and its Prometheus page), so
//! what the filter does without the control plane, which the control
//! plane never sees, can be counted there rather than read from a log line
//! per request.

use std::cell::Cell;
use std::rc::Rc;

use log::warn;
use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

/// Requests the filter routed itself (the outage fallback).
pub const LOCAL_FALLBACKS: &str = "sglang_router_local_fallbacks";

/// One counter, shared by a VM's contexts; counts nothing until defined.
#[derive(Clone, Default)]
pub struct Counter(Rc<Cell<Option<u32>>>);

impl Counter {
    /// Asks Envoy for the counter `name` (every VM's `name` is one stat).
    pub fn define(&self, name: &str) {
        match hostcalls::define_metric(MetricType::Counter, name) {
            Ok(id) => self.0.set(Some(id)),
            Err(e) => warn!("cannot define the counter {name}: {e:?}"),
        }
    }

    /// Adds one.
    pub fn increment(&self) {
        if let Some(id) = self.0.get() {
            // A counter that cannot be moved is not worth failing a
            // request for.
            let _ = hostcalls::increment_metric(id, 1);
        }
    }
}
