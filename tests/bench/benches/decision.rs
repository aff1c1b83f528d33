//! Criterion benches of a whole routing decision (`Engine::route` with the
//! cache-aware policy: prefix match, load check, tree insert, fallbacks,
//! metrics) for each prompt size and worker count of `params.rs`, on an
//! engine whose tree already holds conversations (see `fixture.rs`).
//!
//! `SGLANG_BENCH_QUICK=1` selects the quick profile (smaller fills).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use sglang_envoy_bench::fixture::{self, Fixture};
use sglang_envoy_bench::params::profile_from_env;

/// The control plane's allocator (see its `main.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn decision(c: &mut Criterion) {
    let p = profile_from_env().engine;
    let mut group = c.benchmark_group("decision");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for &workers in &p.workers {
        let fx = match Fixture::cache_aware(&p, workers) {
            Ok(fx) => fx,
            Err(e) => panic!("building the {workers}-worker fixture: {e:#}"),
        };
        for &size in &p.prompt_bytes {
            let mut prompts = fx.prompts(size);
            group.throughput(Throughput::Bytes(size as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("{workers}w"), size),
                &size,
                |b, _| {
                    b.iter_batched(
                        || fixture::request(prompts.next_prompt()),
                        |req| fx.engine.route(&req),
                        BatchSize::SmallInput,
                    )
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, decision);
criterion_main!(benches);
