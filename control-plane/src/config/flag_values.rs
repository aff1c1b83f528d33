//! The values of the flags that pick one of a few ways of doing a thing:
//! `--destination-endpoints` and `--wire-profile`.

use clap::ValueEnum;

/// `--destination-endpoints`: what the ext_proc front door writes in a
/// destination (`x-gateway-destination-endpoint` and `envoy.lb` metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum DestinationFlag {
    /// The chosen endpoint alone: what every InferencePool gateway takes
    /// (an `ORIGINAL_DST` cluster reading the header takes nothing else).
    One,
    /// The chosen endpoint, then distinct fallbacks to retry on: only for
    /// a gateway whose cluster reads the destination with `override_host`.
    List,
}

impl From<DestinationFlag> for sglang_envoy_lifecycle::Destination {
    fn from(flag: DestinationFlag) -> Self {
        match flag {
            DestinationFlag::One => sglang_envoy_lifecycle::Destination::One,
            DestinationFlag::List => sglang_envoy_lifecycle::Destination::List,
        }
    }
}

/// `--wire-profile`: which spelling of SGLang's DP and PD fields to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum WireProfileFlag {
    /// Each worker's own, from the `version` of its `/server_info` (read
    /// with `--dp-aware`): legacy before SGLang 0.5.10, upstream from then on
    /// and when the version is not known.
    Auto,
    /// `data_parallel_rank` / `data_parallel_rank_decode`, as SGLang before
    /// 0.5.10 (and the design notes); `seeds`, its first name, is accepted.
    #[value(alias = "seeds")]
    Legacy,
    /// `routed_dp_rank` / `disagg_prefill_dp_rank` and rooms aligned to the
    /// prefill's rank, as SGLang 0.5.10 and later.
    Upstream,
}

impl WireProfileFlag {
    /// The profile forced on every worker; `None` for auto.
    pub fn forced(self) -> Option<sglang_envoy_body::WireProfile> {
        match self {
            WireProfileFlag::Auto => None,
            WireProfileFlag::Legacy => Some(sglang_envoy_body::WireProfile::Legacy),
            WireProfileFlag::Upstream => Some(sglang_envoy_body::WireProfile::Upstream),
        }
    }
}
