//! `bench-engine`: the parts of scenario 3 criterion cannot give — the
//! distribution of single decisions (p50/p99, each decision timed on its
//! own) and memory per stored character, measured with a counting global
//! allocator. Writes JSON (`--out`) that `sglang-envoy-bench report` reads.
//!
//! Parameters come from `params.rs` (`SGLANG_BENCH_QUICK=1` for the quick
//! profile).

use std::alloc::{GlobalAlloc, Layout};
use std::path::PathBuf;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use sglang_envoy_bench::fixture::{self, Fixture};
use sglang_envoy_bench::params::profile_from_env;
use sglang_envoy_bench::results::{DecisionCell, EngineFill, EngineResults, TreeMemory};
use sglang_envoy_bench::stats::Percentiles;
use sglang_envoy_control_plane::tree::Tree;

/// The control plane's allocator (mimalloc, as in its `main.rs`), counting
/// live heap bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to mimalloc; the
// counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = mimalloc::MiMalloc.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        mimalloc::MiMalloc.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = mimalloc::MiMalloc.alloc_zeroed(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = mimalloc::MiMalloc.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Measures single decisions and memory of the decision engine.
#[derive(Debug, Parser)]
struct Cli {
    /// Where to write the JSON results.
    #[arg(long)]
    out: PathBuf,
}

/// Tenants of the bare-tree memory measurement.
const TREE_TENANTS: u32 = 8;

fn tree_memory(chars_per_tenant: usize) -> TreeMemory {
    let before = live();
    let (tree, docs, n) = fixture::filled_tree(TREE_TENANTS, chars_per_tenant);
    let bytes = (live() - before).max(0) as usize;
    let stored_chars = tree.tenant_sizes().iter().map(|(_, s)| s).sum();
    drop(tree);
    // Distinct characters: the same documents held by a single tenant.
    let single = Tree::new();
    for i in 0..n {
        single.insert(&docs.doc(i), 0);
    }
    TreeMemory {
        tenants: TREE_TENANTS,
        stored_chars,
        unique_chars: single.tenant_size(0),
        bytes,
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let p = profile_from_env().engine;

    eprintln!("bench-engine: tree memory ({TREE_TENANTS} tenants)");
    let tree = tree_memory(p.fill_chars_per_worker);
    eprintln!(
        "  {} bytes for {} stored chars ({:.2} B/char), {} distinct chars",
        tree.bytes,
        tree.stored_chars,
        tree.bytes as f64 / tree.stored_chars.max(1) as f64,
        tree.unique_chars
    );

    let mut fills = Vec::new();
    let mut decisions = Vec::new();
    for &workers in &p.workers {
        let before = live();
        let t = Instant::now();
        let fx = Fixture::cache_aware(&p, workers)?;
        let fill = EngineFill {
            workers,
            routed_chars: fx.chars,
            bytes: (live() - before).max(0) as usize,
            seconds: t.elapsed().as_secs_f64(),
        };
        eprintln!(
            "  {workers} workers: filled {} chars in {:.1}s, {:.2} B/char",
            fill.routed_chars,
            fill.seconds,
            fill.bytes as f64 / fill.routed_chars.max(1) as f64
        );
        fills.push(fill);
        for &size in &p.prompt_bytes {
            let mut prompts = fx.prompts(size);
            // Warm up caches and code paths.
            for _ in 0..(p.timed_decisions / 10).max(100) {
                let r = fx.engine.route(&fixture::request(prompts.next_prompt()));
                let _ = std::hint::black_box(r);
            }
            let mut us = Vec::with_capacity(p.timed_decisions);
            for _ in 0..p.timed_decisions {
                let req = fixture::request(prompts.next_prompt());
                let t = Instant::now();
                let r = fx.engine.route(&req);
                let spent = t.elapsed();
                if !fixture::is_decision(&r) {
                    anyhow::bail!("the engine refused a request");
                }
                drop(std::hint::black_box(r));
                us.push(spent.as_secs_f64() * 1e6);
            }
            let cell = DecisionCell {
                workers,
                prompt_bytes: size,
                us: Percentiles::of(&mut us),
            };
            eprintln!(
                "    {size:>6} B: p50 {:.2} us  p99 {:.2} us  max {:.1} us",
                cell.us.p50, cell.us.p99, cell.us.max
            );
            decisions.push(cell);
        }
    }
    let results = EngineResults {
        tree,
        fills,
        decisions,
    };
    let json = serde_json::to_string_pretty(&results)?;
    std::fs::write(&cli.out, json).with_context(|| format!("writing {}", cli.out.display()))?;
    Ok(())
}
