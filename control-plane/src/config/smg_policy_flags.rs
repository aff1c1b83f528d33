//! smg 1.13.0's tuning flags of its `prefix_hash` and `least_load`
//! policies, under its names and with its defaults and bounds
//! (`validate.rs`); `policy_flags.rs` builds the policies from them.

use clap::Args;

/// prefix_hash's and least_load's flags.
#[derive(Debug, Clone, Args)]
pub struct SmgPolicyFlags {
    /// prefix_hash: tokens of the request's head that are hashed, counted
    /// as 4 bytes of routing text each (smg: tokens, or 4 characters each
    /// of an untokenized request).
    #[arg(long, default_value_t = 256)]
    pub prefix_token_count: usize,

    /// prefix_hash: a worker is overloaded, and its prefixes go to their
    /// next worker, when its load exceeds the mean times this (at least
    /// 1.0)...
    #[arg(long, default_value_t = 1.25)]
    pub prefix_hash_load_factor: f64,

    /// prefix_hash: ...and exceeds the mean by more than this many requests.
    #[arg(long, default_value_t = 10)]
    pub prefix_hash_balance_abs_threshold: usize,

    /// least_load (smg): weight, in seconds, of engine-reported KV pressure.
    /// Accepted and checked; least_load here compares requests running and
    /// waiting, not tokens or KV.
    #[arg(long, default_value_t = 0.15)]
    pub least_load_kv_pressure_weight: f64,

    /// least_load (smg): generation throughput (tokens/s) assumed for an
    /// engine that reports none. Accepted and checked; changes nothing here.
    #[arg(long, default_value_t = 2000.0)]
    pub least_load_default_throughput: f64,

    /// least_load (smg): mean prefill tokens of a request whose count is
    /// unknown, for its in-flight estimate. Accepted and checked; changes
    /// nothing here.
    #[arg(long, default_value_t = 1024)]
    pub least_load_mean_prefill_tokens: u32,

    /// least_load (smg): skip workers whose engine-reported waiting queue
    /// reached this (0: no cap). Accepted; changes nothing here.
    #[arg(long, default_value_t = 0)]
    pub least_load_max_waiting_requests: u32,
}
