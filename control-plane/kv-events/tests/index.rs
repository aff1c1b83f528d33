//! The block index fed with events as SGLang emits them, queried with
//! prompt hashes computed by `hash::block_hashes`.

use sglang_envoy_kv_events::hash::{block_hashes, ChainStart};
use sglang_envoy_kv_events::{
    BlockRemoved, BlockStored, EventBatch, IndexLimits, KvEvent, KvIndex, PrefixMatch, SeqStatus,
    TokenIds, Untrusted,
};

const PAGE: usize = 4;

/// A BlockStored for `tokens`' full pages, chained from `parent`, with
/// hashes as SGLang computes them.
fn store(prefix: &[u64], tokens: &[u64], medium: Option<&str>) -> KvEvent {
    let all: Vec<u64> = prefix.iter().chain(tokens).copied().collect();
    let hashes = block_hashes(&all, PAGE, &ChainStart::plain()).unwrap();
    let skip = prefix.len() / PAGE;
    KvEvent::BlockStored(BlockStored {
        block_hashes: hashes[skip..].to_vec(),
        parent_block_hash: skip.checked_sub(1).map(|i| hashes[i]),
        token_ids: TokenIds::Flat(tokens.to_vec()),
        block_size: PAGE as u32,
        lora_id: None,
        medium: medium.map(str::to_owned),
        cache_salt: None,
        session_id: None,
        lora_name: None,
    })
}

fn remove(hashes: &[i64], medium: Option<&str>) -> KvEvent {
    KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: hashes.to_vec(),
        medium: medium.map(str::to_owned),
    })
}

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        ts: 0.0,
        events,
        attn_dp_rank: None,
    }
}

fn prompt() -> (Vec<u64>, Vec<i64>) {
    let tokens: Vec<u64> = (1..=14).collect();
    let hashes = block_hashes(&tokens, PAGE, &ChainStart::plain()).unwrap();
    (tokens, hashes)
}

#[test]
fn stored_prefix_is_found_and_removal_shortens_it() {
    let (tokens, hashes) = prompt();
    assert_eq!(hashes.len(), 3);
    let mut idx = KvIndex::<String>::new(IndexLimits::default());
    let w = "w1".to_string();
    // Two stores: the first two pages, then the third chained to them.
    let out = idx.apply(
        &w,
        0,
        0,
        &batch(vec![
            store(&[], &tokens[..8], Some("GPU")),
            store(&tokens[..8], &tokens[8..12], None),
        ]),
    );
    assert_eq!(out.seq, SeqStatus::First);
    assert_eq!(idx.cached_tokens("w1", 0, &hashes), Some(12));
    assert_eq!(idx.parent_of("w1", 0, hashes[2]), Some(Some(hashes[1])));
    assert_eq!(idx.parent_of("w1", 0, hashes[0]), Some(None));
    // A prompt diverging in its second page matches one page.
    let other = block_hashes(&[1, 2, 3, 4, 9, 9, 9, 9], PAGE, &ChainStart::plain()).unwrap();
    assert_eq!(idx.cached_tokens("w1", 0, &other), Some(4));
    // Evicting the middle page cuts the prefix there.
    idx.apply(&w, 0, 1, &batch(vec![remove(&hashes[1..2], Some("GPU"))]));
    assert_eq!(idx.cached_tokens("w1", 0, &hashes), Some(4));
    assert_eq!(idx.blocks("w1", 0), 2);
    assert_eq!(idx.total_blocks(), 2);
    // Unknown rank: no answer rather than a zero.
    assert_eq!(idx.cached_tokens("w1", 1, &hashes), None);
}

#[test]
fn host_tier_copy_survives_gpu_eviction() {
    let (tokens, hashes) = prompt();
    let mut idx = KvIndex::<&str>::new(IndexLimits::default());
    idx.apply_events(
        &"w",
        0,
        &[
            store(&[], &tokens[..12], Some("GPU")),
            store(&[], &tokens[..4], Some("CPU_PINNED")),
        ],
    );
    idx.apply_events(&"w", 0, &[remove(&hashes[..1], Some("GPU"))]);
    assert_eq!(
        idx.match_prefix(&"w", 0, &hashes),
        Some(PrefixMatch {
            device_tokens: 0,
            any_tier_tokens: 12
        })
    );
    idx.apply_events(&"w", 0, &[remove(&hashes[..1], Some("CPU_PINNED"))]);
    assert_eq!(
        idx.match_prefix(&"w", 0, &hashes),
        Some(PrefixMatch::default())
    );
    assert_eq!(idx.blocks(&"w", 0), 2);
}

#[test]
fn gap_untrusts_restart_and_clear_reset() {
    let (tokens, hashes) = prompt();
    let mut idx = KvIndex::<&str>::new(IndexLimits::default());
    idx.apply(&"w", 0, 7, &batch(vec![store(&[], &tokens[..12], None)]));
    // First seen mid-stream: still trusted (only removals can mislead).
    assert_eq!(idx.cached_tokens(&"w", 0, &hashes), Some(12));
    // The same seq again is a new process that numbered as far (PUB/SUB
    // never repeats a message): the rank is emptied, and its first 7
    // batches were missed.
    let again = idx.apply(&"w", 0, 7, &batch(vec![store(&[], &tokens[..4], None)]));
    assert_eq!(again.seq, SeqStatus::Restart { missed: 7 });
    assert_eq!(again.untrusted, Some(Untrusted::Gap));
    assert_eq!(idx.blocks(&"w", 0), 1);
    idx.apply(&"w", 0, 8, &batch(vec![KvEvent::AllBlocksCleared]));
    idx.apply(&"w", 0, 9, &batch(vec![store(&[], &tokens[..12], None)]));
    assert_eq!(idx.blocks(&"w", 0), 3);

    let gap = idx.apply(&"w", 0, 12, &batch(vec![]));
    assert_eq!(gap.seq, SeqStatus::Gap { missed: 2 });
    assert_eq!(gap.untrusted, Some(Untrusted::Gap));
    assert_eq!(idx.cached_tokens(&"w", 0, &hashes), None);
    let all = idx.match_all(&hashes);
    assert_eq!(all, vec![(&"w", 0, None)]);

    // The publisher restarts: seq back to 0, state emptied and trusted.
    let restart = idx.apply(&"w", 0, 0, &batch(vec![store(&[], &tokens[..4], None)]));
    assert_eq!(restart.seq, SeqStatus::Restart { missed: 0 });
    assert_eq!(restart.untrusted, None);
    assert_eq!(idx.cached_tokens(&"w", 0, &hashes), Some(4));
    assert_eq!(idx.total_blocks(), 1);

    // An unknown event untrusts; AllBlocksCleared trusts an empty rank again.
    idx.apply(
        &"w",
        0,
        1,
        &batch(vec![KvEvent::Unknown { tag: "X".into() }]),
    );
    assert_eq!(idx.untrusted(&"w", 0), Some(Untrusted::UnknownEvent));
    idx.apply(&"w", 0, 2, &batch(vec![KvEvent::AllBlocksCleared]));
    assert_eq!(idx.cached_tokens(&"w", 0, &hashes), Some(0));
    assert_eq!(idx.total_blocks(), 0);
}

#[test]
fn caps_refuse_new_blocks_and_untrust_the_rank() {
    let (tokens, hashes) = prompt();
    let limits = IndexLimits {
        max_blocks_per_rank: 2,
        max_blocks_total: 3,
    };
    let mut idx = KvIndex::<&str>::new(limits);
    idx.apply_events(&"a", 0, &[store(&[], &tokens[..12], None)]);
    assert_eq!(idx.blocks(&"a", 0), 2);
    assert_eq!(idx.untrusted(&"a", 0), Some(Untrusted::Overflow));
    assert_eq!(idx.cached_tokens(&"a", 0, &hashes), None);
    // The total cap binds another rank after one more block.
    idx.apply_events(&"b", 0, &[store(&[], &tokens[..8], None)]);
    assert_eq!(idx.blocks(&"b", 0), 1);
    assert_eq!(idx.total_blocks(), 3);
    assert_eq!(idx.untrusted(&"b", 0), Some(Untrusted::Overflow));
    // Re-storing a held block on another tier is not a new block.
    idx.clear_rank(&"b", 0);
    idx.apply_events(
        &"b",
        0,
        &[
            store(&[], &tokens[..4], None),
            store(&[], &tokens[..4], Some("CPU_PINNED")),
        ],
    );
    assert_eq!(idx.untrusted(&"b", 0), None);
    assert_eq!(idx.total_blocks(), 3);
    idx.remove_worker(&"a");
    assert_eq!(idx.total_blocks(), 1);
}

#[test]
fn match_all_reports_every_rank() {
    let (tokens, hashes) = prompt();
    let mut idx = KvIndex::<String>::new(IndexLimits::default());
    idx.apply_events(&"a".to_string(), 0, &[store(&[], &tokens[..8], None)]);
    idx.apply_events(&"a".to_string(), 1, &[store(&[], &tokens[..12], None)]);
    idx.apply_events(&"b".to_string(), 0, &[]);
    let mut all: Vec<(String, u32, Option<usize>)> = idx
        .match_all(&hashes)
        .into_iter()
        .map(|(w, r, m)| (w.clone(), r, m.map(|m| m.device_tokens)))
        .collect();
    all.sort();
    assert_eq!(
        all,
        vec![
            ("a".into(), 0, Some(8)),
            ("a".into(), 1, Some(12)),
            ("b".into(), 0, Some(0)),
        ]
    );
}
