//! Criterion benches of a whole routing decision (`Engine::route` with the
//! cache-aware policy: prefix match, load check, tree insert, fallbacks,
//! metrics) for each prompt size and worker count of `params.rs`, on an
//! engine whose tree already holds conversations (see `fixture.rs`).
//!
//! `SGLANG_BENCH_QUICK=1` selects the quick profile (smaller fills).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use sglang_envoy_bench::fixture::{self, Fixture};
use sglang_envoy_bench::params::{profile_from_env, EngineParams};
use sglang_envoy_control_plane::shared_tree::shared_tree;

/// The control plane's allocator (see its `main.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A group of decision benches, with the timing every one of them uses.
fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    group
}

/// The fixture of `workers` workers (a bench cannot go on without it).
fn fixture_of(p: &EngineParams, workers: usize) -> Fixture {
    match Fixture::cache_aware(p, workers) {
        Ok(fx) => fx,
        Err(e) => panic!("building the {workers}-worker fixture: {e:#}"),
    }
}

/// One bench per prompt size of `p`: `fx`'s engine deciding prompts of
/// that size that continue its stored conversations, named `name`/size.
fn each_size(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    p: &EngineParams,
    fx: &Fixture,
    name: &str,
) {
    for &size in &p.prompt_bytes {
        let mut prompts = fx.prompts(size);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new(name, size), &size, |b, _| {
            b.iter_batched(
                || fixture::request(prompts.next_prompt()),
                |req| fx.engine.route(&req),
                BatchSize::SmallInput,
            )
        });
    }
}

fn decision(c: &mut Criterion) {
    let p = profile_from_env().engine;
    let mut group = group(c, "decision");
    for &workers in &p.workers {
        let fx = fixture_of(&p, workers);
        each_size(&mut group, &p, &fx, &format!("{workers}w"));
    }
    group.finish();
}

/// The same decision with the tree's inserts shared (`--fleet-store-url`):
/// what sharing adds on the request path is the insert's queueing (a copy
/// of the text, a channel send); the queue is emptied by a thread, as the
/// sync task would, so that no insert is dropped.
fn decision_shared_tree(c: &mut Criterion) {
    let p = profile_from_env().engine;
    let mut group = group(c, "decision_shared_tree");
    // The engine goal's fleet (docs/benchmarks.md, scenario 3).
    let workers = if p.workers.contains(&64) {
        64
    } else {
        p.workers[0]
    };
    for shared in [false, true] {
        let mut fx = fixture_of(&p, workers);
        let stop = Arc::new(AtomicBool::new(false));
        let drainer = if shared {
            let (outbox, mut sync) = shared_tree("redis://127.0.0.1:1/0", "bench")
                .unwrap_or_else(|e| panic!("the shared tree's queue: {e}"));
            fx.engine = fx.engine.with_shared_tree(outbox);
            let stop = stop.clone();
            Some(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    sync.discard_queued();
                    std::thread::sleep(Duration::from_millis(1));
                }
            }))
        } else {
            None
        };
        let name = if shared { "shared" } else { "alone" };
        each_size(&mut group, &p, &fx, &format!("{workers}w {name}"));
        stop.store(true, Ordering::Relaxed);
        if let Some(d) = drainer {
            let _ = d.join();
        }
    }
    group.finish();
}

criterion_group!(benches, decision, decision_shared_tree);
criterion_main!(benches);
