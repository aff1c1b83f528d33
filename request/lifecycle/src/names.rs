//! Names and limits that the wasm filter, the ext_proc front door, the
//! control plane and the Envoy configurations must agree on.

use std::time::Duration;

/// The request header the worker clusters' `override_host` load balancing
/// reads: the chosen `ip:port`, then the ones to retry on, comma-separated.
/// A client's own value is always removed.
pub const ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";

/// The Envoy cluster of prefill workers (PD mode), published over EDS.
pub const PREFILL_CLUSTER: &str = "sglang_prefill_workers";

/// The header marking a reply as the router's own error: Envoy's
/// `local_reply_config` leaves such replies as they are and rewrites its
/// own (text) replies into the same OpenAI JSON shape.
pub const ERROR_HEADER: &str = "x-sglang-envoy-error";

/// smg's header naming an error's code (`model_not_found`), sent with the
/// router's replies that have one, for clients written against smg.
pub const ERROR_CODE_HEADER: &str = "x-smg-error-code";

/// The largest request body the wasm filter accepts by default.
/// sglang-router's `--max-payload-size` default is 512 MiB (0.3.2); a wasm VM per
/// Envoy thread holding that much is not sensible, and 32 MiB is already
/// far beyond any real prompt.
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// PD: how long a decode worker's error answer waits for the prefill half
/// still running. A dead prefill makes its decode fail at once, and the
/// prefill's error is the cause the client should see; past this the
/// decode's own error goes out as it is.
pub const DECODE_ERROR_GRACE: Duration = Duration::from_millis(250);
