//! The routing policies the flags ask for, tuned by them.

use std::sync::Arc;
use std::time::Duration;

use sglang_envoy_core::policy::{
    Bucket, BucketConfig, CacheAware, CacheAwareConfig, ConsistentHashing, CostAware,
    CostAwareConfig, LeastLoad, Manual, ManualConfig, Policy, PolicyKind, PowerOfTwo, PrefixHash,
    PrefixHashConfig, Random, RoundRobin, MIN_MATCH,
};

use crate::config::Args;

/// A policy of `kind`, tuned by the flags.
pub fn build(kind: PolicyKind, args: &Args) -> Arc<dyn Policy> {
    match kind {
        PolicyKind::Random => Arc::new(Random),
        PolicyKind::RoundRobin => Arc::new(RoundRobin::default()),
        PolicyKind::PowerOfTwo => Arc::new(PowerOfTwo),
        PolicyKind::CacheAware => Arc::new(CacheAware::new(CacheAwareConfig {
            cache_threshold: args.cache_threshold,
            balance_abs_threshold: args.balance_abs_threshold,
            balance_rel_threshold: args.balance_rel_threshold,
            max_tree_size: args.max_tree_size,
        })),
        PolicyKind::CostAware => Arc::new(CostAware::new(CostAwareConfig {
            per_request_cost: args.cost_per_request,
            max_tree_size: args.max_tree_size,
            min_match: MIN_MATCH,
            queue_weight: args.cost_queue_weight,
            spill_gate: args.cost_spill_gate,
            prefill_progress: args.cost_prefill_progress,
        })),
        PolicyKind::Bucket => Arc::new(Bucket::new(BucketConfig {
            adjust_every: Duration::from_secs(args.bucket_adjust_interval_secs),
            balance_abs_threshold: args.balance_abs_threshold,
            balance_rel_threshold: args.balance_rel_threshold,
        })),
        PolicyKind::Manual => Arc::new(Manual::new(ManualConfig {
            max_idle: Duration::from_secs(args.max_idle_secs),
            assignment: args.assignment_mode,
        })),
        // smg's least_load flags weigh the engines' token and KV reports,
        // which it does not read (see LEAST_LOAD_ENGINE_FLAGS): nothing to tune.
        PolicyKind::LeastLoad => Arc::new(LeastLoad),
        PolicyKind::PrefixHash => Arc::new(PrefixHash::new(PrefixHashConfig {
            prefix_token_count: args.smg_policies.prefix_token_count,
            load_factor: args.smg_policies.prefix_hash_load_factor,
            balance_abs_threshold: args.smg_policies.prefix_hash_balance_abs_threshold,
        })),
        PolicyKind::ConsistentHashing => Arc::new(ConsistentHashing),
    }
}
