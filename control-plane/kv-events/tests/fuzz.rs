//! Property tests: the decoder answers Ok or Err on any bytes (a panic fails
//! the test), valid batches round-trip through both layouts, and every
//! truncation of a valid payload is an error.

use proptest::prelude::*;
use sglang_envoy_kv_events::frame::{parse_pub_message, parse_replay_reply};
use sglang_envoy_kv_events::{
    decode_batch, encode_batch, BlockRemoved, BlockStored, EventBatch, KvEvent, Layout, TokenIds,
};

fn opt_str() -> impl Strategy<Value = Option<String>> {
    proptest::option::of("[a-zA-Z_]{0,40}")
}

fn token_ids() -> impl Strategy<Value = TokenIds> {
    prop_oneof![
        proptest::collection::vec(0u64..=i64::MAX as u64, 0..20).prop_map(TokenIds::Flat),
        proptest::collection::vec(any::<[u32; 2]>(), 1..10).prop_map(|v| {
            TokenIds::Bigram(v.into_iter().map(|[a, b]| [a.into(), b.into()]).collect())
        }),
    ]
}

fn event(map_layout: bool) -> impl Strategy<Value = KvEvent> {
    let stored = (
        proptest::collection::vec(any::<i64>(), 0..8),
        any::<Option<i64>>(),
        token_ids(),
        any::<u32>(),
        any::<Option<i64>>(),
        opt_str(),
        opt_str(),
        opt_str(),
        opt_str(),
    )
        .prop_map(move |(h, p, t, s, l, m, salt, sess, name)| {
            KvEvent::BlockStored(BlockStored {
                block_hashes: h,
                parent_block_hash: p,
                token_ids: t,
                block_size: s,
                lora_id: l,
                medium: m,
                cache_salt: salt,
                // The array layout has no place for these two.
                session_id: sess.filter(|_| map_layout),
                lora_name: name.filter(|_| map_layout),
            })
        });
    let removed = (proptest::collection::vec(any::<i64>(), 0..8), opt_str()).prop_map(
        |(block_hashes, medium)| {
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes,
                medium,
            })
        },
    );
    prop_oneof![stored, removed, Just(KvEvent::AllBlocksCleared)]
}

fn batch(map_layout: bool) -> impl Strategy<Value = EventBatch> {
    (
        -1e12f64..1e12,
        proptest::collection::vec(event(map_layout), 0..6),
        any::<Option<i64>>(),
    )
        .prop_map(|(ts, events, attn_dp_rank)| EventBatch {
            ts,
            events,
            attn_dp_rank,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        // Ok or Err are both fine; re-encoding an Ok must decode to itself.
        // (Compared as bytes: a decoded float may be NaN, unequal to itself.)
        if let Ok(b) = decode_batch(&bytes) {
            let again = encode_batch(&b, Layout::Map);
            let twice = decode_batch(&again).map(|d| encode_batch(&d, Layout::Map));
            prop_assert_eq!(twice, Ok(again));
        }
    }

    #[test]
    fn random_frames_never_panic(frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..12), 0..5)) {
        let pub_ok = parse_pub_message(&frames).is_ok();
        prop_assert_eq!(pub_ok, frames.len() == 3 && frames[1].len() == 8 && frames[1][0] < 0x80);
        let _ = parse_replay_reply(&frames);
    }

    #[test]
    fn map_layout_round_trips(b in batch(true)) {
        let bytes = encode_batch(&b, Layout::Map);
        prop_assert_eq!(decode_batch(&bytes), Ok(b));
    }

    #[test]
    fn array_layout_round_trips(b in batch(false)) {
        let bytes = encode_batch(&b, Layout::Array);
        prop_assert_eq!(decode_batch(&bytes), Ok(b));
    }

    #[test]
    fn truncations_and_bit_flips_are_handled(b in batch(true), flip in any::<(usize, u8)>()) {
        let bytes = encode_batch(&b, Layout::Map);
        for cut in 0..bytes.len() {
            prop_assert!(decode_batch(&bytes[..cut]).is_err(), "prefix of {} bytes decoded", cut);
        }
        let mut flipped = bytes.clone();
        let i = flip.0 % flipped.len();
        flipped[i] ^= flip.1 | 1;
        // Must not panic; whatever decodes must re-encode to a decodable batch.
        if let Ok(d) = decode_batch(&flipped) {
            let again = encode_batch(&d, Layout::Map);
            let twice = decode_batch(&again).map(|d| encode_batch(&d, Layout::Map));
            prop_assert_eq!(twice, Ok(again));
        }
    }
}

#[test]
fn huge_container_headers_fail_fast_without_allocating() {
    // [ts, array32 of 2^32-1 events] and nothing behind it; and the same for
    // block_hashes inside an event. Both must be Truncated errors, quickly.
    let mut a = vec![
        0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff,
    ];
    assert!(decode_batch(&a).is_err());
    a.truncate(10);
    a.extend_from_slice(&[0x91, 0x92, 0xab]);
    a.extend_from_slice(b"BlockRemoved");
    a.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01]);
    assert!(decode_batch(&a).is_err());
}
