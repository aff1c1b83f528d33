//! Where the KV-event subscriber finds each worker's publisher, beyond what
//! the worker advertises (SGLang's `--kv-events-config` keys), and its off
//! switch. docs/kv-events.md says what they do.

use clap::Args;

use crate::kv_events::{KvEventsOptions, Overrides};

/// The KV-event subscriber's flags.
#[derive(Debug, Clone, Args)]
pub struct KvEventsFlags {
    /// Do not subscribe to any worker's KV cache events (docs/kv-events.md).
    #[arg(long)]
    pub disable_kv_events: bool,
    /// TCP port of every worker's KV-event PUB socket for DP rank 0 (rank r
    /// publishes on this + r), overriding `endpoint_port_base` of the
    /// `kv_events` object SGLang advertises in `/server_info`; with it,
    /// workers that advertise nothing are subscribed too, at their URL's
    /// host. SGLang's `--kv-events-config` key: `endpoint`.
    #[arg(long, value_name = "PORT")]
    pub kv_events_endpoint_port: Option<u16>,
    /// TCP port of every worker's replay ROUTER for DP rank 0 (rank r adds
    /// r), overriding the advertised `replay_endpoint_port_base`; asked for
    /// missed batches when a sequence gap shows. SGLang's key:
    /// `replay_endpoint`.
    #[arg(long, value_name = "PORT")]
    pub kv_events_replay_endpoint_port: Option<u16>,
    /// ZMQ topic to subscribe to (a prefix of the publisher's topic),
    /// overriding the advertised `topic`. SGLang's key: `topic`.
    #[arg(long, value_name = "TOPIC")]
    pub kv_events_topic: Option<String>,
}

impl KvEventsFlags {
    /// How the KV-event subscriber runs; `None` with `--disable-kv-events`.
    pub fn options(&self) -> Option<KvEventsOptions> {
        (!self.disable_kv_events).then(|| KvEventsOptions {
            overrides: Overrides {
                endpoint_port: self.kv_events_endpoint_port,
                replay_endpoint_port: self.kv_events_replay_endpoint_port,
                topic: self.kv_events_topic.clone(),
            },
            ..KvEventsOptions::default()
        })
    }
}
