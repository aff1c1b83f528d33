//! Criterion benches of what routing on KV events adds to a decision: a
//! request's prompt tokens as SGLang computes them (the chat template
//! rendered and encoded, or text encoded), and its page hashes. Reported
//! per KB of prompt (docs/kv-events.md): `cargo bench -p
//! sglang-envoy-bench --bench prompt_tokens`.
//!
//! The tokenizer is the tests' byte-level BPE (`sglang_envoy_prompt::fixture`):
//! a real model's vocabulary is larger, its merges more, so treat these as
//! the floor of the cost.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sglang_envoy_kv_events::{block_hashes, ChainStart};
use sglang_envoy_prompt::{fixture, PromptTokenizer};

/// Prompt sizes in bytes.
const SIZES: &[usize] = &[1024, 4096, 16384];

fn text_of(size: usize) -> String {
    let words = [
        "the", "cache", "router", "sends", "each", "prompt", "where", "it", "starts", "soonest,",
    ];
    let mut s = String::with_capacity(size + 16);
    let mut i = 0;
    while s.len() < size {
        s.push_str(words[i % words.len()]);
        s.push(' ');
        i += 7;
    }
    s.truncate(size);
    s
}

fn prompt_tokens(c: &mut Criterion) {
    let Ok(t) = PromptTokenizer::from_files(fixture::model_files()) else {
        return;
    };
    let mut group = c.benchmark_group("prompt_tokens");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for &size in SIZES {
        let text = text_of(size);
        let chat = serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": text}, {"role": "user", "content": "and then?"}]})
        .to_string();
        let completion = serde_json::json!({"model": "m", "prompt": text}).to_string();
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("chat", size), &chat, |b, body| {
            b.iter(|| t.tokens("/v1/chat/completions", body.as_bytes()))
        });
        group.bench_with_input(
            BenchmarkId::new("completion", size),
            &completion,
            |b, body| b.iter(|| t.tokens("/v1/completions", body.as_bytes())),
        );
        let ids: Vec<u64> = t
            .tokens("/v1/chat/completions", chat.as_bytes())
            .map(|p| p.ids.iter().map(|&i| u64::from(i)).collect())
            .unwrap_or_default();
        group.bench_with_input(BenchmarkId::new("page_hashes_16", size), &ids, |b, ids| {
            b.iter(|| block_hashes(ids, 16, &ChainStart::plain()))
        });
    }
    group.finish();
}

criterion_group!(benches, prompt_tokens);
criterion_main!(benches);
