//! Criterion benches of the radix tree alone: `match_prefix` and `insert` of
//! prompts continuing stored conversations, for each prompt size of
//! `params.rs`, on a tree of 64 tenants holding the profile's fill each.
//!
//! `SGLANG_BENCH_QUICK=1` selects the quick profile (smaller fills).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use sglang_envoy_bench::fixture;
use sglang_envoy_bench::params::profile_from_env;
use sglang_envoy_bench::workload::Prompts;

/// The control plane's allocator (see its `main.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Tenants of the benched tree.
const TENANTS: u32 = 64;

fn tree(c: &mut Criterion) {
    let p = profile_from_env().engine;
    let per_tenant = p
        .fill_chars_per_worker
        .min(p.fill_chars_total_max / TENANTS as usize);
    let (tree, docs, stored) = fixture::filled_tree(TENANTS, per_tenant);
    let mut group = c.benchmark_group("tree");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for &size in &p.prompt_bytes {
        group.throughput(Throughput::Bytes(size as u64));
        let mut prompts = Prompts::new(&docs, stored, size);
        group.bench_with_input(BenchmarkId::new("match_prefix", size), &size, |b, _| {
            b.iter_batched(
                || prompts.next_prompt(),
                |text| tree.match_prefix(&text),
                BatchSize::SmallInput,
            )
        });
        let mut prompts = Prompts::new(&docs, stored, size);
        let mut tenant = 0u32;
        group.bench_with_input(BenchmarkId::new("insert", size), &size, |b, _| {
            b.iter_batched(
                || {
                    tenant = (tenant + 1) % TENANTS;
                    (prompts.next_prompt(), tenant)
                },
                |(text, t)| tree.insert(&text, t),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, tree);
criterion_main!(benches);
