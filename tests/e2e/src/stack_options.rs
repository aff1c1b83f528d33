//! What a test's [`crate::Stack`] starts: its workers, flags and Envoy.

use std::path::PathBuf;

use crate::envoy_config::EnvoyConfig;
use crate::front_door::FrontDoor;
use crate::tls::WorkerTls;

/// What to start.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// Simulated workers registered at start.
    pub workers: usize,
    /// `--policy` of the control plane.
    pub policy: String,
    /// Extra control-plane flags.
    pub cp_args: Vec<String>,
    /// Extra flags of every simulated worker.
    pub worker_args: Vec<String>,
    /// The filter's body limit.
    pub max_body_bytes: usize,
    /// Prefill/decode disaggregation instead of `workers` regular workers.
    pub pd: Option<PdOptions>,
    /// Route the admin API through Envoy's client port (`ADMIN_ROUTES`).
    pub admin_routes: bool,
    /// More members of the wasm filter's JSON configuration, with a
    /// leading comma (`FILTER_OPTIONS`).
    pub filter_options: String,
    /// Envoy's limit on client connections (`MAX_CONNECTIONS`).
    pub max_connections: Option<usize>,
    /// The simulated workers (regular, prefill and decode) serve HTTPS with
    /// these files and are registered as `https://`. The control plane's
    /// TLS flags are `cp_args`; Envoy gets the same ones.
    pub worker_tls: Option<WorkerTls>,
    /// Run Envoy with this config instead of the rendered template (a
    /// gateway-shaped config, see [`crate::gateway`]).
    pub envoy_config: Option<EnvoyConfig>,
    /// Run the control plane in a mount namespace of its own whose
    /// `/etc/hosts` is this file (needs `unshare` and the right to mount,
    /// see [`hosts_file_supported`]): tests of workers named by DNS rewrite
    /// it to move a name.
    pub cp_hosts_file: Option<PathBuf>,
    /// Environment variables of the control plane (`KUBECONFIG`, say).
    pub cp_env: Vec<(String, String)>,
    /// Envoy's worker threads (`--concurrency`); each runs a filter VM.
    pub envoy_concurrency: usize,
    /// Run through the picker setup of this gateway shape, whatever
    /// `SGLANG_ENVOY_FRONT_DOOR` says (`None`: as it says).
    pub picker: Option<crate::gateway::picker::Shape>,
    /// The control plane's gRPC port (`None`: a free one), for a test
    /// whose other stacks' Envoys reach it too.
    pub cp_grpc_port: Option<u16>,
    /// gRPC ports of more control planes on this host: Envoy's cluster
    /// `sglang_control_plane` lists them after this stack's own, as it
    /// would list a DNS name's several addresses.
    pub more_control_planes: Vec<u16>,
}

/// A PD fleet of simulated workers.
#[derive(Debug, Clone)]
pub struct PdOptions {
    /// Prefill workers, each serving KV on its own bootstrap port.
    pub prefills: usize,
    /// Decode workers.
    pub decodes: usize,
    /// Register prefills with `none` instead of their bootstrap port; the
    /// decode workers then default to the first prefill's port.
    pub bootstrap_none: bool,
    /// Extra flags of the prefill workers.
    pub prefill_args: Vec<String>,
    /// Extra flags of the decode workers.
    pub decode_args: Vec<String>,
}

impl Default for PdOptions {
    fn default() -> Self {
        PdOptions {
            prefills: 1,
            decodes: 1,
            bootstrap_none: false,
            prefill_args: Vec::new(),
            decode_args: Vec::new(),
        }
    }
}

/// How long a simulated PD worker waits for its peer (KV handshake).
pub const KV_TIMEOUT_MS: u64 = 3000;

impl StackOptions {
    /// The picker setup this stack runs through, if any: its own, or the
    /// suite's under `SGLANG_ENVOY_FRONT_DOOR=picker` (a config a test
    /// builds itself is its own business).
    pub fn picker_shape(&self) -> Option<crate::gateway::picker::Shape> {
        if self.envoy_config.is_some() {
            return None;
        }
        self.picker.or_else(|| {
            (FrontDoor::current() == FrontDoor::Picker)
                .then_some(crate::gateway::picker::Shape::SUITE)
        })
    }
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions {
            workers: 2,
            policy: "cache_aware".into(),
            cp_args: Vec::new(),
            // Fast simulated GPUs keep the suite quick.
            worker_args: vec![
                "--prefill-us-per-token".into(),
                "1".into(),
                "--decode-us-per-token".into(),
                "100".into(),
            ],
            max_body_bytes: 33_554_432,
            pd: None,
            admin_routes: true,
            filter_options: String::new(),
            max_connections: None,
            worker_tls: None,
            envoy_config: None,
            cp_hosts_file: None,
            cp_env: Vec::new(),
            envoy_concurrency: 1,
            picker: None,
            cp_grpc_port: None,
            more_control_planes: Vec::new(),
        }
    }
}
