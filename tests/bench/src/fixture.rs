//! Fixtures of the decision-engine benches: an [`Engine`] with N healthy
//! workers and the cache-aware policy, its tree filled with conversations,
//! and route requests of a given prompt size.
//!
//! Only the control plane's public API is used: `Registry`, `WorkerAddress`,
//! `CacheAware`, `Metrics` and `Engine::route`. The cache-aware policy's tree
//! is private, so the engine is filled by routing documents through it (as
//! traffic would) and its per-worker sizes cannot be read back; the tree
//! benches use a `Tree` of their own for that.

use std::sync::Arc;

use anyhow::Context;
use sglang_envoy_control_plane::engine::{Engine, EngineOptions, Policies};
use sglang_envoy_control_plane::metrics::Metrics;
use sglang_envoy_control_plane::policy::{CacheAware, CacheAwareConfig, Policy};
use sglang_envoy_control_plane::tree::Tree;
use sglang_envoy_control_plane::workers::{Registry, WorkerAddress, WorkerSpec};
use sglang_envoy_lifecycle::{Answer, Question};

use crate::params::{engine_docs, EngineParams, SEED};
use crate::workload::{Documents, Prompts};

/// The cache-aware settings of the control plane's defaults (its flags'
/// defaults, which are sglang-router's); the tree is never trimmed during
/// a bench (trimming is the background upkeep's job).
pub fn cache_aware_config() -> CacheAwareConfig {
    CacheAwareConfig {
        cache_threshold: 0.3,
        balance_abs_threshold: 64,
        balance_rel_threshold: 1.5,
        max_tree_size: usize::MAX,
    }
}

/// An engine over `workers` healthy workers with `policy`.
pub fn engine(workers: usize, policy: Arc<dyn Policy>) -> anyhow::Result<Engine> {
    let registry = Arc::new(Registry::default());
    for i in 0..workers {
        let port = 20_000 + i as u16;
        let address = WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        let units = registry
            .add(address, WorkerSpec::REGULAR, None)
            .context("adding a worker")?;
        for w in &units {
            registry.set_healthy(w, true);
        }
    }
    Ok(Engine::new(
        registry,
        Policies::same(policy),
        Arc::new(Metrics::default()),
        EngineOptions::default(),
    ))
}

/// A chat completion route request carrying `text` (ticket 0: the load is
/// released at once, as if the request had ended).
pub fn request(text: Vec<u8>) -> Question {
    Question {
        path: "/v1/chat/completions".into(),
        method: "POST".into(),
        body_bytes: text.len() as u64 + 64,
        routing_text: text,
        ticket: 0,
        ..Default::default()
    }
}

/// True when `r` is a decision (not a rejection).
pub fn is_decision(r: &Answer) -> bool {
    r.is_ok()
}

/// Documents routed per worker count so that each worker holds about
/// `fill_chars_per_worker` (capped by `fill_chars_total_max`).
pub fn fill_docs(p: &EngineParams, workers: usize) -> usize {
    let per_worker = p
        .fill_chars_per_worker
        .min(p.fill_chars_total_max / workers.max(1));
    (per_worker * workers).div_ceil(engine_docs::DOC_CHARS)
}

/// A filled engine ready for decisions.
pub struct Fixture {
    /// The engine.
    pub engine: Engine,
    /// The documents it was filled with.
    pub docs: Documents,
    /// How many documents were routed.
    pub stored: usize,
    /// Characters routed in total.
    pub chars: usize,
}

impl Fixture {
    /// `workers` workers, cache-aware, filled per `p`.
    pub fn cache_aware(p: &EngineParams, workers: usize) -> anyhow::Result<Fixture> {
        let policy: Arc<dyn Policy> = Arc::new(CacheAware::new(cache_aware_config()));
        let engine = engine(workers, policy)?;
        let docs = Documents::new(SEED);
        let stored = fill_docs(p, workers);
        let mut chars = 0;
        for i in 0..stored {
            let d = docs.doc(i);
            chars += d.len();
            if !is_decision(&engine.route(&request(d))) {
                anyhow::bail!("filling: the engine refused a request");
            }
        }
        Ok(Fixture {
            engine,
            docs,
            stored,
            chars,
        })
    }

    /// Prompts of `size` bytes continuing stored conversations.
    pub fn prompts(&self, size: usize) -> Prompts {
        Prompts::new(&self.docs, self.stored, size)
    }
}

/// A bare tree with `tenants` tenants, each holding `chars_per_tenant`
/// characters of documents (documents dealt round-robin).
pub fn filled_tree(tenants: u32, chars_per_tenant: usize) -> (Tree, Documents, usize) {
    let tree = Tree::new();
    let docs = Documents::new(SEED);
    let n = (chars_per_tenant * tenants as usize).div_ceil(engine_docs::DOC_CHARS);
    for i in 0..n {
        tree.insert(&docs.doc(i), (i % tenants.max(1) as usize) as u32);
    }
    (tree, docs, n)
}
