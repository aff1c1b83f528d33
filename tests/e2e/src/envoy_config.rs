//! The Envoy config a stack runs: the front door's template rendered by
//! envoy/render.sh (what the quick start and docker compose run), or one a
//! test builds itself from the stack's ports, e.g. in the shape a gateway's
//! control plane generates from a deploy/ recipe ([`crate::gateway`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};

use crate::repo_root;
use crate::stack::{FrontDoor, StackOptions};
use crate::tls::envoy_tls_env;

/// Where the stack's parts listen, for a config built by a test.
#[derive(Debug, Clone)]
pub struct EnvoyEnv {
    /// The stack's directory (logs, configs).
    pub dir: PathBuf,
    /// Envoy's client listener (loopback).
    pub listen_port: u16,
    /// Envoy's admin interface (loopback).
    pub admin_port: u16,
    /// The control plane's gRPC port (filter calls, ext_proc, EDS).
    pub cp_grpc_port: u16,
    /// The control plane's admin API.
    pub cp_admin_port: u16,
    /// The built wasm filter.
    pub wasm: PathBuf,
    /// `host:port` of the workers Envoy sends requests to (the decode
    /// workers in PD mode), as the control plane names them.
    pub workers: Vec<String>,
}

/// Builds Envoy's config from the stack's [`EnvoyEnv`].
type Build = dyn Fn(&EnvoyEnv) -> anyhow::Result<String> + Send + Sync;

/// A config a test builds instead of the rendered template.
#[derive(Clone)]
pub struct EnvoyConfig(pub Arc<Build>);

impl EnvoyConfig {
    /// Wraps the function building the config.
    pub fn new(
        build: impl Fn(&EnvoyEnv) -> anyhow::Result<String> + Send + Sync + 'static,
    ) -> Self {
        EnvoyConfig(Arc::new(build))
    }
}

impl std::fmt::Debug for EnvoyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnvoyConfig(..)")
    }
}

/// Renders the front door's template with envoy/render.sh, the quick
/// start's and docker compose's renderer, into `config_path`.
pub(crate) fn render_template(
    opts: &StackOptions,
    config_path: &Path,
    wasm: &Path,
    [port, envoy_admin, grpc_port, admin_port]: [u16; 4],
) -> anyhow::Result<()> {
    // The same renderer as the quick start and docker compose.
    let shape = opts.picker_shape();
    let template_path = match shape {
        Some(_) => FrontDoor::Picker.template(),
        None => FrontDoor::current().template(),
    };
    let rendered = std::process::Command::new("sh")
        .arg(repo_root().join("envoy/render.sh"))
        .arg(config_path)
        .env("ENVOY_TEMPLATE", repo_root().join(template_path))
        .env("LISTEN_HOST", "127.0.0.1")
        .env("LISTEN_PORT", port.to_string())
        .env("ENVOY_ADMIN_PORT", envoy_admin.to_string())
        .env("CONTROL_PLANE_HOST", "127.0.0.1")
        .env("CONTROL_PLANE_GRPC_PORT", grpc_port.to_string())
        .env("CONTROL_PLANE_ADMIN_PORT", admin_port.to_string())
        .env("MAX_BODY_BYTES", opts.max_body_bytes.to_string())
        .env("FILTER_WASM", wasm.display().to_string())
        .env("ADMIN_ROUTES", if opts.admin_routes { "on" } else { "off" })
        .env("FILTER_OPTIONS", &opts.filter_options)
        .env(
            "MAX_CONNECTIONS",
            opts.max_connections.unwrap_or(10_000).to_string(),
        )
        // Envoy trusts and presents what the control plane does.
        .envs(envoy_tls_env(&opts.cp_args))
        .env("CORS_ALLOWED_ORIGINS", cors_origins(&opts.cp_args))
        .env("OTLP_TRACES_ENDPOINT", otlp_endpoint(&opts.cp_args))
        .env(
            "LISTEN_TLS_CERT",
            flag_value(&opts.cp_args, "--tls-cert-path"),
        )
        .env(
            "LISTEN_TLS_KEY",
            flag_value(&opts.cp_args, "--tls-key-path"),
        )
        .output()
        .context("running envoy/render.sh")?;
    if !rendered.status.success() {
        bail!(
            "envoy/render.sh failed for {template_path}: {}",
            String::from_utf8_lossy(&rendered.stderr)
        );
    }
    if let Some(shape) = shape {
        let text = std::fs::read_to_string(config_path)?;
        std::fs::write(config_path, crate::gateway::picker::config(&text, shape)?)?;
    }
    if !opts.more_control_planes.is_empty() {
        let text = std::fs::read_to_string(config_path)?;
        let config = with_more_control_planes(&text, &opts.more_control_planes)?;
        std::fs::write(config_path, config)?;
    }
    Ok(())
}

/// `config` with the loopback gRPC `ports` of more control planes added to
/// its cluster `sglang_control_plane`, as a DNS name with several
/// addresses would add them.
fn with_more_control_planes(config: &str, ports: &[u16]) -> anyhow::Result<String> {
    let mut doc: serde_yaml::Value = serde_yaml::from_str(config)?;
    let clusters = doc["static_resources"]["clusters"]
        .as_sequence_mut()
        .context("no clusters")?;
    let cluster = clusters
        .iter_mut()
        .find(|c| c["name"] == "sglang_control_plane")
        .context("no sglang_control_plane cluster")?;
    let endpoints = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        .as_sequence_mut()
        .context("no lb_endpoints in sglang_control_plane")?;
    for port in ports {
        let endpoint = format!(
            "endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}"
        );
        endpoints.push(serde_yaml::from_str(&endpoint)?);
    }
    Ok(serde_yaml::to_string(&doc)?)
}

/// `CORS_ALLOWED_ORIGINS` from the control plane's `--cors-allowed-origins`,
/// as scripts/lib.sh's `cors_from_flags` derives it.
pub fn cors_origins(cp_args: &[String]) -> String {
    let mut origins = Vec::new();
    let mut in_origins = false;
    for arg in cp_args {
        match arg.as_str() {
            "--cors-allowed-origins" => in_origins = true,
            flag if flag.starts_with("--") => in_origins = false,
            origin if in_origins => origins.push(origin),
            _ => {}
        }
    }
    origins.join(" ")
}

/// `OTLP_TRACES_ENDPOINT` from the control plane's `--enable-trace` and
/// `--otlp-traces-endpoint`, as scripts/lib.sh's `tracing_from_flags`
/// derives it.
pub fn otlp_endpoint(cp_args: &[String]) -> String {
    if !cp_args.iter().any(|a| a == "--enable-trace") {
        return String::new();
    }
    cp_args
        .iter()
        .position(|a| a == "--otlp-traces-endpoint")
        .and_then(|i| cp_args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| "localhost:4317".into())
}

/// The value after `flag` in the control plane's flags (empty when absent),
/// as scripts/lib.sh's `listen_tls_from_flags` reads `--tls-cert-path`.
pub fn flag_value(cp_args: &[String], flag: &str) -> String {
    cp_args
        .iter()
        .position(|a| a == flag)
        .and_then(|i| cp_args.get(i + 1))
        .cloned()
        .unwrap_or_default()
}
