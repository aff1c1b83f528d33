//! Golden payloads written by msgspec 0.22 with SGLang's struct definitions
//! (0.5.23 map layout; 0.5.10 / 0.5.18 array layout), decoded and re-encoded.
//!
//! Generated with `msgspec.msgpack.Encoder().encode(KVEventBatch(...)).hex()`
//! after declaring the structs exactly as in each release's
//! `sglang/srt/disaggregation/kv_events.py`; the values are listed beside
//! each constant.

use sglang_envoy_kv_events::{
    decode_batch, encode_batch, BlockRemoved, BlockStored, DecodeError, EventBatch, KvEvent,
    Layout, TokenIds,
};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn stored(hashes: &[i64], parent: Option<i64>, tokens: &[u64], size: u32) -> BlockStored {
    BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: TokenIds::Flat(tokens.to_vec()),
        block_size: size,
        lora_id: None,
        medium: None,
        cache_salt: None,
        session_id: None,
        lora_name: None,
    }
}

/// 0.5.23: KVEventBatch(ts=1700000000.5, attn_dp_rank=2, events=[
///   BlockStored([-5, 300], None, [1, 2, 70000, 4], 2, None, medium="GPU"),
///   BlockStored([7], 300, [5, 6], 2, 3, medium="CPU_PINNED", cache_salt="s",
///               session_id="sess", lora_name="ad"),
///   BlockRemoved([i64::MIN, i64::MAX], medium="GPU"),
///   BlockRemoved([1]),
///   AllBlocksCleared()])
const CURRENT: &str = "93cb41d954fc402000009587a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392fbcd012cb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473940102ce0001117004aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da34750558aa474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739107b1706172656e745f626c6f636b5f68617368cd012ca9746f6b656e5f696473920506aa626c6f636b5f73697a6502a76c6f72615f696403a66d656469756daa4350555f50494e4e4544aa63616368655f73616c74a173aa73657373696f6e5f6964a473657373a96c6f72615f6e616d65a2616483a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657392d38000000000000000cf7fffffffffffffffa66d656469756da347505582a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573910181a474797065b0416c6c426c6f636b73436c656172656402";

fn current_value() -> EventBatch {
    let mut a = stored(&[-5, 300], None, &[1, 2, 70000, 4], 2);
    a.medium = Some("GPU".into());
    let mut b = stored(&[7], Some(300), &[5, 6], 2);
    b.lora_id = Some(3);
    b.medium = Some("CPU_PINNED".into());
    b.cache_salt = Some("s".into());
    b.session_id = Some("sess".into());
    b.lora_name = Some("ad".into());
    EventBatch {
        ts: 1700000000.5,
        events: vec![
            KvEvent::BlockStored(a),
            KvEvent::BlockStored(b),
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![i64::MIN, i64::MAX],
                medium: Some("GPU".into()),
            }),
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![1],
                medium: None,
            }),
            KvEvent::AllBlocksCleared,
        ],
        attn_dp_rank: Some(2),
    }
}

#[test]
fn current_map_layout_decodes_and_reencodes_byte_identically() {
    let bytes = unhex(CURRENT);
    let batch = decode_batch(&bytes).unwrap();
    assert_eq!(batch, current_value());
    assert_eq!(encode_batch(&batch, Layout::Map), bytes);
}

#[test]
fn empty_batch_matches_msgspec() {
    // KVEventBatch(ts=0.0, events=[]): attn_dp_rank None is still written.
    let bytes = unhex("93cb000000000000000090c0");
    let batch = decode_batch(&bytes).unwrap();
    assert_eq!(
        batch,
        EventBatch {
            ts: 0.0,
            events: vec![],
            attn_dp_rank: None
        }
    );
    assert_eq!(encode_batch(&batch, Layout::Map), bytes);
}

/// 0.5.10 (array_like events): ts=1.25, attn_dp_rank=None, events=[
///   BlockStored([11, 12], None, [1, 2, 3, 4], 2, None),
///   BlockRemoved([12], medium="GPU"), AllBlocksCleared()]
/// msgspec writes every field of an array-like struct, defaults included.
const V0_5_10: &str = "93cb3ff40000000000009397ab426c6f636b53746f726564920b0cc0940102030402c0c093ac426c6f636b52656d6f766564910ca347505591b0416c6c426c6f636b73436c6561726564c0";

/// 0.5.18: as above with attn_dp_rank=1 and a fourth event,
///   BlockStoredWithMetadata([13], 11, [9, 9], 2, None, medium="GPU",
///                           metadata=BlockStoredMetadata(cache_salt="salty"))
const V0_5_18: &str = "93cb3ff40000000000009497ab426c6f636b53746f726564920b0cc0940102030402c0c093ac426c6f636b52656d6f766564910ca347505591b0416c6c426c6f636b73436c656172656498ab426c6f636b53746f726564910d0b92090902c0a347505581aa63616368655f73616c74a573616c747901";

fn legacy_events() -> Vec<KvEvent> {
    vec![
        KvEvent::BlockStored(stored(&[11, 12], None, &[1, 2, 3, 4], 2)),
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![12],
            medium: Some("GPU".into()),
        }),
        KvEvent::AllBlocksCleared,
    ]
}

#[test]
fn array_layout_of_0_5_10_decodes_and_reencodes() {
    let bytes = unhex(V0_5_10);
    let batch = decode_batch(&bytes).unwrap();
    assert_eq!(
        batch,
        EventBatch {
            ts: 1.25,
            events: legacy_events(),
            attn_dp_rank: None
        }
    );
    assert_eq!(encode_batch(&batch, Layout::Array), bytes);
}

#[test]
fn array_layout_of_0_5_18_carries_cache_salt_metadata() {
    let bytes = unhex(V0_5_18);
    let batch = decode_batch(&bytes).unwrap();
    let mut salted = stored(&[13], Some(11), &[9, 9], 2);
    salted.medium = Some("GPU".into());
    salted.cache_salt = Some("salty".into());
    let mut events = legacy_events();
    events.push(KvEvent::BlockStored(salted));
    assert_eq!(
        batch,
        EventBatch {
            ts: 1.25,
            events,
            attn_dp_rank: Some(1)
        }
    );
    assert_eq!(encode_batch(&batch, Layout::Array), bytes);
}

#[test]
fn oldest_layout_without_rank_or_medium_decodes() {
    // [ts, [["BlockStored", [1], nil, [5], 1, nil], ["BlockRemoved", [1]]]]:
    // the first releases had no attn_dp_rank and no medium.
    let bytes = unhex("92cb3ff00000000000009296ab426c6f636b53746f72656491 01c0910501c092ac426c6f636b52656d6f7665649101".replace(' ', "").as_str());
    let batch = decode_batch(&bytes).unwrap();
    assert_eq!(batch.attn_dp_rank, None);
    assert_eq!(
        batch.events,
        vec![
            KvEvent::BlockStored(stored(&[1], None, &[5], 1)),
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![1],
                medium: None
            }),
        ]
    );
}

#[test]
fn unknown_fields_and_trailing_elements_are_skipped() {
    // Map event with an unknown key before the tag, and an array event and
    // a batch with extra trailing elements.
    let bytes = unhex(
        concat!(
            "94",                 // batch: 4 elements
            "cb0000000000000000", // ts 0.0
            "92",                 // two events
            "83a178920102a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391 05",
            "93b0416c6c426c6f636b73436c6561726564c0a3787878", // ["AllBlocksCleared", nil, "xxx"]
            "07",                                             // attn_dp_rank 7
            "81a16101" // unknown trailing batch element {"a": 1}
        )
        .replace(' ', "")
        .as_str(),
    );
    let batch = decode_batch(&bytes).unwrap();
    assert_eq!(
        batch.events,
        vec![
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![5],
                medium: None
            }),
            KvEvent::AllBlocksCleared
        ]
    );
    assert_eq!(batch.attn_dp_rank, Some(7));
}

#[test]
fn bigram_tokens_round_trip_in_both_layouts() {
    let mut s = stored(&[1], None, &[], 2);
    s.token_ids = TokenIds::Bigram(vec![[1, 2], [2, 3]]);
    let batch = EventBatch {
        ts: 3.5,
        events: vec![KvEvent::BlockStored(s)],
        attn_dp_rank: Some(0),
    };
    for layout in [Layout::Map, Layout::Array] {
        let bytes = encode_batch(&batch, layout);
        assert_eq!(decode_batch(&bytes).unwrap(), batch, "{layout:?}");
    }
}

#[test]
fn unknown_tag_is_kept_and_malformed_input_is_an_error() {
    let unknown = unhex("93cb00000000000000009181a474797065a3466f6fc0"); // {"type": "Foo"}
    assert_eq!(
        decode_batch(&unknown).unwrap().events,
        vec![KvEvent::Unknown { tag: "Foo".into() }]
    );
    // Same batch with a trailing byte.
    let mut trailing = unknown.clone();
    trailing.push(0xc0);
    assert_eq!(
        decode_batch(&trailing),
        Err(DecodeError::TrailingBytes { extra: 1 })
    );
    // A map event without its tag.
    let untagged = unhex("93cb00000000000000009180c0");
    assert!(matches!(
        decode_batch(&untagged),
        Err(DecodeError::MissingField { field: "type", .. })
    ));
    // token_ids mixing an id and a pair.
    let mixed = unhex(
        "93cb00000000000000009196ab426c6f636b53746f7265649101c09201920102 01c0c0"
            .replace(' ', "")
            .as_str(),
    );
    assert!(matches!(
        decode_batch(&mixed),
        Err(DecodeError::MixedTokens { .. })
    ));
    // A negative token id.
    let negative = unhex("93cb00000000000000009196ab426c6f636b53746f7265649101c091ff01c0c0");
    assert!(matches!(
        decode_batch(&negative),
        Err(DecodeError::IntOutOfRange {
            field: "token_ids",
            ..
        })
    ));
}
