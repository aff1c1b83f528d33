//! Criterion benches of a whole routing decision (`Engine::route` with the
//! cache-aware policy: prefix match, load check, tree insert, fallbacks,
//! metrics) for each prompt size and worker count of `params.rs`, on an
//! engine whose tree already holds conversations (see `fixture.rs`).
//!
//! `SGLANG_BENCH_QUICK=1` selects the quick profile (smaller fills).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Where the tree's inserts go in each variant of
/// [`decision_shared_tree`].
#[derive(Clone, Copy, PartialEq)]
enum Sharing {
    /// Not shared (one control plane).
    Alone,
    /// Queued for the others and thrown away: the request path's own
    /// share (the text moved into the outbox, a channel send).
    Queued,
    /// Queued, and applied back to the trees by another thread, as if
    /// another replica had made the same choice: the others' inserts
    /// applied on a thread of their own.
    OtherThread,
    /// The same, applied by the deciding thread between decisions (what
    /// `shared_tree.rs` does: on the gRPC port's runtime).
    DecidingThread,
}

impl Sharing {
    fn name(self) -> &'static str {
        match self {
            Sharing::Alone => "alone",
            Sharing::Queued => "queued",
            Sharing::OtherThread => "applied by another thread",
            Sharing::DecidingThread => "applied by the deciding thread",
        }
    }
}

/// The same decision with the tree's inserts shared (`--fleet-store-url`),
/// in each [`Sharing`] variant: what sharing adds to a decision, as the
/// front doors ask it (`Engine::route_owned`). Each
/// decision's insert comes back once (as from one other replica making the
/// same choices), so every insert walks the nodes the decisions walk.
fn decision_shared_tree(c: &mut Criterion) {
    let p = profile_from_env().engine;
    let mut group = group(c, "decision_shared_tree");
    // The engine goal's fleet (docs/benchmarks.md, scenario 3).
    let workers = if p.workers.contains(&64) {
        64
    } else {
        p.workers[0]
    };
    for sharing in [
        Sharing::Alone,
        Sharing::Queued,
        Sharing::OtherThread,
        Sharing::DecidingThread,
    ] {
        let mut fx = fixture_of(&p, workers);
        let mut sync = None;
        if sharing != Sharing::Alone {
            let (outbox, s) = shared_tree("redis://127.0.0.1:1/0", "bench", "bench")
                .unwrap_or_else(|e| panic!("the shared tree's queue: {e}"));
            fx.engine = fx.engine.with_shared_tree(outbox);
            sync = Some(s);
        }
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let (engine, stop) = (&fx.engine, &stop);
            // The queue's reader: a thread of its own, or the deciding
            // thread before each decision (criterion's untimed setup).
            let mut inline = None;
            if let Some(mut s) = sync.take() {
                match sharing {
                    Sharing::DecidingThread => inline = Some(s),
                    _ => {
                        scope.spawn(move || {
                            while !stop.load(Ordering::Relaxed) {
                                if sharing == Sharing::OtherThread {
                                    s.apply_queued(engine);
                                } else {
                                    s.discard_queued();
                                }
                                std::thread::sleep(Duration::from_millis(1));
                            }
                        });
                    }
                }
            }
            let inline = RefCell::new(inline);
            for &size in &p.prompt_bytes {
                let mut prompts = fx.prompts(size);
                group.throughput(Throughput::Bytes(size as u64));
                let id = BenchmarkId::new(format!("{workers}w {}", sharing.name()), size);
                group.bench_with_input(id, &size, |b, _| {
                    b.iter_batched(
                        || {
                            if let Some(s) = inline.borrow_mut().as_mut() {
                                s.apply_queued(engine);
                            }
                            fixture::request(prompts.next_prompt())
                        },
                        |req| engine.route_owned(req),
                        BatchSize::SmallInput,
                    )
                });
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
    group.finish();
}

criterion_group!(benches, decision, decision_shared_tree);
criterion_main!(benches);
