//! `--kv-events-config`: the worker publishes its cache's pages on ZMQ as
//! SGLang does; a `zeromq` SUB socket and replay DEALER check what it sends
//! against the kv-events crate.

mod common;

use std::time::Duration;

use common::{fast, start, Sim};
use serde_json::{json, Value};
use sglang_envoy_kv_events::frame::{parse_pub_message, parse_replay_reply, ReplayReply};
use sglang_envoy_kv_events::hash::{block_hashes, ChainStart};
use sglang_envoy_kv_events::{
    decode_batch, BlockRemoved, BlockStored, EventBatch, KvEvent, TokenIds,
};
use sglang_sim_worker::{text_token_ids, KvEventsConfig, SimConfig};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const WAIT: Duration = Duration::from_secs(5);

fn kv_config(json: &str) -> SimConfig {
    SimConfig {
        kv_events_config: KvEventsConfig::parse(json).unwrap(),
        enable_cache_report: true,
        ..fast()
    }
}

/// A worker publishing on free loopback ports, with replay.
async fn start_kv(page_size: usize, cache_tokens: usize) -> Sim {
    start(SimConfig {
        page_size,
        cache_tokens,
        ..kv_config(
            r#"{"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","bind":true,
                "replay_endpoint":"tcp://127.0.0.1:0","topic":"kv"}"#,
        )
    })
    .await
}

/// The `kv_events` descriptor of `/server_info`.
async fn descriptor(sim: &Sim) -> Value {
    let (status, info) = sim.get("/server_info").await;
    assert_eq!(status, 200);
    info["kv_events"].clone()
}

fn port(v: &Value, key: &str) -> u16 {
    u16::try_from(v[key].as_u64().unwrap()).unwrap()
}

/// One live message: (topic, seq, batch).
async fn recv(sub: &mut SubSocket) -> (Vec<u8>, i64, EventBatch) {
    let m = tokio::time::timeout(WAIT, sub.recv())
        .await
        .expect("no KV-event message")
        .unwrap();
    let frames = m.into_vec();
    let msg = parse_pub_message(&frames).unwrap();
    (
        msg.topic.to_vec(),
        msg.seq,
        decode_batch(msg.payload).unwrap(),
    )
}

async fn generate(sim: &Sim, text: &str, extra: Value) -> Value {
    let mut body = json!({"text": text, "sampling_params": {"max_new_tokens": 1}});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let (status, v) = sim.post("/generate", body).await;
    assert_eq!(status, 200, "{v}");
    v["meta_info"].clone()
}

async fn hooks(sim: &Sim, body: Value) -> Value {
    let (status, v) = sim.post("/_sim/kv_events", body).await;
    assert_eq!(status, 200, "{v}");
    v
}

/// A SUB socket on rank `rank`'s PUB port that is known to receive (a PUB
/// drops messages until the subscription has reached it): warm-up requests
/// until one arrives, then a restart hook so that the test starts at seq 0
/// with an empty cache.
async fn subscribe(sim: &Sim, rank: u16, rank_field: Value) -> SubSocket {
    let base = port(&descriptor(sim).await, "endpoint_port_base");
    let mut sub = SubSocket::new();
    sub.connect(&format!("tcp://127.0.0.1:{}", base + rank))
        .await
        .unwrap();
    sub.subscribe("").await.unwrap();
    for i in 0..50 {
        generate(
            sim,
            &format!("warm-up {i:04} ").repeat(8),
            rank_field.clone(),
        )
        .await;
        if tokio::time::timeout(Duration::from_millis(200), sub.recv())
            .await
            .is_ok()
        {
            // Drain stragglers of earlier warm-ups before restarting.
            while tokio::time::timeout(Duration::from_millis(200), sub.recv())
                .await
                .is_ok()
            {}
            hooks(sim, json!({"restart": true})).await;
            return sub;
        }
    }
    panic!("the SUB socket never received anything");
}

/// `[seq, batch]` of a replay from `start` (0.5.23 layout), up to the end marker.
async fn replay(sim: &Sim, start: u64) -> Vec<(i64, EventBatch)> {
    let replay_port = port(&descriptor(sim).await, "replay_endpoint_port_base");
    let mut dealer = DealerSocket::new();
    dealer
        .connect(&format!("tcp://127.0.0.1:{replay_port}"))
        .await
        .unwrap();
    // A DEALER sends the empty delimiter a REQ socket would add.
    let mut request = ZmqMessage::from(Vec::<u8>::new());
    request.push_back(start.to_be_bytes().to_vec().into());
    dealer.send(request).await.unwrap();
    let mut out = Vec::new();
    loop {
        let m = tokio::time::timeout(WAIT, dealer.recv())
            .await
            .expect("replay did not end")
            .unwrap();
        let frames = m.into_vec();
        assert!(frames[0].is_empty(), "no delimiter: {frames:?}");
        // 0.5.23: [topic, seq, payload]; the end marker has an empty topic.
        assert_eq!(frames.len(), 4, "{frames:?}");
        match parse_replay_reply(&frames[1..]).unwrap() {
            ReplayReply::End => return out,
            ReplayReply::Batch { seq, payload } => {
                assert_eq!(&frames[1][..], b"kv");
                out.push((seq, decode_batch(payload).unwrap()));
            }
        }
    }
}

fn stored(batch: &EventBatch) -> &BlockStored {
    match batch.events.as_slice() {
        [KvEvent::BlockStored(s)] => s,
        other => panic!("expected one BlockStored, got {other:?}"),
    }
}

#[tokio::test]
async fn stored_blocks_are_the_crate_hash_chain_of_the_prompt() {
    let sim = start_kv(4, 100_000).await;
    let mut sub = subscribe(&sim, 0, json!({})).await;
    let chat = |content: &str| json!({"max_tokens": 1, "messages": [{"role": "user", "content": content}]});
    let first = "abcd".repeat(20);
    let (status, v) = sim.post("/v1/chat/completions", chat(&first)).await;
    assert_eq!(status, 200, "{v}");
    let (topic, seq, batch) = recv(&mut sub).await;
    assert_eq!((topic.as_slice(), seq), (&b"kv"[..], 0));
    assert_eq!(batch.attn_dp_rank, Some(0));
    // The worker's prompt: "<|user|>\n" + content + "\n", 90 bytes, 23
    // tokens of which 5 pages of 4 are full.
    let ids = text_token_ids(&format!("<|user|>\n{first}\n"));
    assert_eq!(ids.len(), 23);
    let hashes = block_hashes(&ids, 4, &ChainStart::plain()).unwrap();
    assert_eq!(hashes.len(), 5);
    assert_eq!(
        stored(&batch),
        &BlockStored {
            block_hashes: hashes.clone(),
            parent_block_hash: None,
            token_ids: TokenIds::Flat(ids[..20].to_vec()),
            block_size: 4,
            lora_id: None,
            medium: Some("GPU".into()),
            cache_salt: None,
            session_id: None,
            lora_name: None,
        }
    );

    // A longer prompt sharing 22 tokens: 5 pages hit (20 tokens), the 2
    // new pages hang under the last shared one.
    let second = format!("{first}{}", "zzzz".repeat(8));
    let (_, v) = sim.post("/v1/chat/completions", chat(&second)).await;
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"], 20,
        "{v}"
    );
    let (_, seq, batch) = recv(&mut sub).await;
    assert_eq!(seq, 1);
    let ids2 = text_token_ids(&format!("<|user|>\n{second}\n"));
    let hashes2 = block_hashes(&ids2, 4, &ChainStart::plain()).unwrap();
    assert_eq!(hashes2[..5], hashes[..]);
    let s = stored(&batch);
    assert_eq!(s.block_hashes, hashes2[5..7]);
    assert_eq!(s.parent_block_hash, Some(hashes[4]));
    assert_eq!(s.token_ids, TokenIds::Flat(ids2[20..28].to_vec()));

    // A full repeat stores nothing, so publishes nothing: the next batch
    // is the flush's.
    sim.post("/v1/chat/completions", chat(&first)).await;
    let r = sim
        .client
        .post(sim.url("/flush_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, seq, batch) = recv(&mut sub).await;
    assert_eq!((seq, batch.events), (2, vec![KvEvent::AllBlocksCleared]));
    let (_, v) = sim.post("/v1/chat/completions", chat(&first)).await;
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "{v}"
    );
}

#[tokio::test]
async fn eviction_publishes_block_removed() {
    // Two pages of 4 tokens fit.
    let sim = start_kv(4, 8).await;
    let mut sub = subscribe(&sim, 0, json!({})).await;
    let a = "abcd".repeat(8);
    generate(&sim, &a, json!({})).await;
    let (_, _, batch) = recv(&mut sub).await;
    let a_hashes = stored(&batch).block_hashes.clone();
    assert_eq!(a_hashes.len(), 2);
    let b = "wxyz".repeat(8);
    generate(&sim, &b, json!({})).await;
    let (_, seq, batch) = recv(&mut sub).await;
    assert_eq!(seq, 1);
    let [KvEvent::BlockRemoved(BlockRemoved {
        block_hashes,
        medium,
    }), KvEvent::BlockStored(s)] = batch.events.as_slice()
    else {
        panic!("expected BlockRemoved then BlockStored: {:?}", batch.events);
    };
    // Leaves first, as a radix tree evicts.
    assert_eq!(block_hashes, &vec![a_hashes[1], a_hashes[0]]);
    assert_eq!(medium.as_deref(), Some("GPU"));
    assert_eq!(s.block_hashes, block_hashes_of(&b, 4));
    // a is gone: asking again is a miss, stored anew.
    let meta = generate(&sim, &a, json!({})).await;
    assert_eq!(meta["cached_tokens"], 0);
}

fn block_hashes_of(text: &str, page: usize) -> Vec<i64> {
    block_hashes(&text_token_ids(text), page, &ChainStart::plain()).unwrap()
}

#[tokio::test]
async fn dropped_batches_leave_a_gap_that_replay_fills() {
    let sim = start_kv(4, 100_000).await;
    let mut sub = subscribe(&sim, 0, json!({})).await;
    let v = hooks(&sim, json!({"drop_next": 2})).await;
    assert_eq!(v["ranks"][0]["drop_next"], 2, "{v}");
    for p in ["aaaa", "bbbb", "cccc"] {
        generate(&sim, &p.repeat(4), json!({})).await;
    }
    // Only the third batch went out live.
    let (_, seq, live) = recv(&mut sub).await;
    assert_eq!(seq, 2);
    assert_eq!(
        stored(&live).block_hashes,
        block_hashes_of(&"cccc".repeat(4), 4)
    );
    let all = replay(&sim, 0).await;
    assert_eq!(all.iter().map(|b| b.0).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(
        stored(&all[0].1).block_hashes,
        block_hashes_of(&"aaaa".repeat(4), 4)
    );
    assert_eq!(all[2].1, live);
    let from_one = replay(&sim, 1).await;
    assert_eq!(from_one.iter().map(|b| b.0).collect::<Vec<_>>(), vec![1, 2]);
    assert!(replay(&sim, 3).await.is_empty());
    let (_, status) = sim.get("/_sim/kv_events").await;
    assert_eq!(status["ranks"][0]["dropped"], 2, "{status}");

    // A restart: seq 0 again, nothing to replay from before, cache empty.
    hooks(&sim, json!({"restart": true})).await;
    let meta = generate(&sim, &"aaaa".repeat(4), json!({})).await;
    assert_eq!(meta["cached_tokens"], 0);
    let (_, seq, batch) = recv(&mut sub).await;
    assert_eq!(seq, 0);
    assert_eq!(stored(&batch).parent_block_hash, None);
    assert_eq!(replay(&sim, 0).await.len(), 1);
}

#[tokio::test]
async fn server_info_advertises_the_publisher() {
    let json = r#"{"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","bind":true,"replay_endpoint":"tcp://127.0.0.1:0","topic":"kv"}"#;
    let sim = start(SimConfig {
        page_size: 8,
        ..kv_config(json)
    })
    .await;
    let (_, info) = sim.get("/server_info").await;
    assert_eq!(info["kv_events_config"], json);
    assert_eq!(info["page_size"], 8);
    let d = &info["kv_events"];
    let (_, status) = sim.get("/_sim/kv_events").await;
    assert_eq!(status["enabled"], true);
    assert_eq!(d["endpoint_port_base"], status["ranks"][0]["endpoint_port"]);
    assert_eq!(
        d["replay_endpoint_port_base"],
        status["ranks"][0]["replay_endpoint_port"]
    );
    assert_ne!(d["endpoint_port_base"], 0);
    assert_eq!(d["publisher"], "zmq");
    assert_eq!(d["endpoint_host"], "127.0.0.1");
    assert_eq!(
        (
            d["topic"].clone(),
            d["block_size"].clone(),
            d["dp_size"].clone()
        ),
        (json!("kv"), json!(8), json!(1))
    );
}

#[tokio::test]
async fn off_by_default_and_unchanged() {
    let sim = start(SimConfig {
        enable_cache_report: true,
        ..fast()
    })
    .await;
    let (_, info) = sim.get("/server_info").await;
    for key in ["kv_events", "kv_events_config", "page_size"] {
        assert!(info.get(key).is_none(), "{key} in {info}");
    }
    assert_eq!(
        sim.get("/_sim/kv_events").await.1,
        json!({"enabled": false})
    );
    let (status, _) = sim.post("/_sim/kv_events", json!({"drop_next": 1})).await;
    assert_eq!(status, 400);
    // Token-level cache: 6 of 7 tokens hit, not a page multiple.
    generate(&sim, &"abcd".repeat(6), json!({})).await;
    let meta = generate(&sim, &format!("{}zzzz", "abcd".repeat(6)), json!({})).await;
    assert_eq!(meta["cached_tokens"], 6);
    // /flush_cache empties it (GET works as in SGLang too).
    let r = sim
        .client
        .get(sim.url("/flush_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let meta = generate(&sim, &"abcd".repeat(6), json!({})).await;
    assert_eq!(meta["cached_tokens"], 0);
}

#[tokio::test]
async fn each_dp_rank_publishes_on_its_own_port() {
    // Rank 1 binds rank 0's port + 1, which another process may hold: try
    // a few bases rather than flake.
    for attempt in 0..5 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = listener.local_addr().unwrap().port();
        drop(listener);
        if base == u16::MAX || std::net::TcpListener::bind(("127.0.0.1", base + 1)).is_err() {
            continue;
        }
        let json =
            format!(r#"{{"publisher":"zmq","endpoint":"tcp://127.0.0.1:{base}","bind":true}}"#);
        let sim = start(SimConfig {
            dp_size: 2,
            page_size: 4,
            ..kv_config(&json)
        })
        .await;
        let (status, info) = sim.get("/server_info").await;
        if status != 200 {
            eprintln!("attempt {attempt}: worker did not start");
            continue;
        }
        assert_eq!(info["kv_events"]["endpoint_port_base"], base);
        assert_eq!(info["kv_events"]["dp_size"], 2);
        let mut sub = subscribe(&sim, 1, json!({"routed_dp_rank": 1})).await;
        generate(&sim, &"qrst".repeat(8), json!({"routed_dp_rank": 1})).await;
        let (_, seq, batch) = recv(&mut sub).await;
        assert_eq!((seq, batch.attn_dp_rank), (0, Some(1)));
        assert_eq!(
            stored(&batch).block_hashes,
            block_hashes_of(&"qrst".repeat(8), 4)
        );
        return;
    }
    panic!("no two consecutive free ports found");
}
