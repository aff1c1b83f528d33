//! Where several control planes share their worker list
//! (`crate::fleet_store`; README "Running several control planes").

use clap::Args;

/// The shared worker list's flags.
#[derive(Debug, Clone, Args)]
pub struct FleetStoreFlags {
    /// A Redis or Valkey server where control planes share the worker list
    /// (`redis://host:port/db`): a worker added or removed through any of
    /// them reaches every one within a second. Off the request path; while
    /// it is down each control plane routes on the list it has. (Not
    /// sglang-router's `--redis-url`, which stores conversation history.)
    #[arg(long, value_name = "URL")]
    pub fleet_store_url: Option<String>,
    /// Prefix of the keys in the fleet store: control planes with the same
    /// prefix share one worker list.
    #[arg(long, value_name = "PREFIX", default_value = "sglang-envoy")]
    pub fleet_store_key_prefix: String,
    /// Keep each control plane's approximate radix trees to its own
    /// choices: by default, with a fleet store, each one's tree inserts are
    /// shared with the others (a bounded Redis stream), so a prompt family
    /// routed through one replica is known to all.
    #[arg(long)]
    pub disable_shared_tree: bool,
    /// Route on each control plane's own requests in flight: by default,
    /// with a fleet store, each one's counts per worker (requests and
    /// their prefill work) are shared with the others every 50 ms, and
    /// every load-aware policy weighs the sum; an end reported to a control
    /// plane that did not count its request is passed on to the others.
    #[arg(long)]
    pub disable_shared_loads: bool,
}
