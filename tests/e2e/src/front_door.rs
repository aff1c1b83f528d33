//! Which way into the router the suite runs (`SGLANG_ENVOY_FRONT_DOOR`).

/// How requests get from Envoy to the control plane: the wasm filter
/// (`envoy/envoy.yaml`), Envoy's built-in ext_proc filter
/// (`envoy/envoy-ext-proc.yaml`), or that ext_proc filter configured the way
/// an InferencePool gateway configures its endpoint picker
/// ([`crate::gateway::picker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontDoor {
    /// The proxy-wasm filter (the default).
    Wasm,
    /// The `envoy.filters.http.ext_proc` filter.
    ExtProc,
    /// The ext_proc filter as a Gateway API Inference Extension gateway
    /// sets it up: full-duplex bodies both ways, the destination read from
    /// dynamic metadata.
    Picker,
}

impl FrontDoor {
    /// Chosen by `SGLANG_ENVOY_FRONT_DOOR` (`wasm`, the default, `ext_proc`
    /// or `picker`).
    pub fn current() -> FrontDoor {
        match std::env::var("SGLANG_ENVOY_FRONT_DOOR").as_deref() {
            Ok("ext_proc") | Ok("ext-proc") | Ok("extproc") => FrontDoor::ExtProc,
            Ok("picker") | Ok("gateway") => FrontDoor::Picker,
            _ => FrontDoor::Wasm,
        }
    }

    /// Envoy's ext_proc filter carries the requests (in either setup).
    pub fn is_ext_proc(self) -> bool {
        matches!(self, FrontDoor::ExtProc | FrontDoor::Picker)
    }

    /// The Envoy config template of this front door, relative to the repo.
    pub fn template(self) -> &'static str {
        match self {
            FrontDoor::Wasm => "envoy/envoy.yaml",
            FrontDoor::ExtProc | FrontDoor::Picker => "envoy/envoy-ext-proc.yaml",
        }
    }
}
