//! The KV-event subscriber against real ZMQ sockets on loopback: a PUB and a
//! replay ROUTER bound here, batches encoded with the kv-events crate.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use sglang_envoy_control_plane::kv_events::status::RankStatus;
use sglang_envoy_control_plane::kv_events::subscriber::{self, Rank, Tuning};
use sglang_envoy_control_plane::kv_events::{KvEvents, KvEventsOptions};
use sglang_envoy_control_plane::workers::{Registry, WorkerAddress, WorkerSpec};
use sglang_envoy_kv_events::frame::{
    parse_replay_request, pub_frames, replay_reply_frames, ReplayLayout, ReplayReply,
};
use sglang_envoy_kv_events::{
    encode_batch, BlockRemoved, BlockStored, EventBatch, IndexLimits, KvEvent, KvIndex, Layout,
    TokenIds, Untrusted,
};
use tokio::sync::mpsc;
use zeromq::{Endpoint, PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

const WORKER: &str = "http://127.0.0.1:1";
const TOPIC: &str = "kv";

fn port(e: &Endpoint) -> u16 {
    match e {
        Endpoint::Tcp(_, p) => *p,
        other => panic!("not TCP: {other:?}"),
    }
}

fn stored(hashes: &[i64]) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: None,
        token_ids: TokenIds::Flat((0..hashes.len() as u64 * 4).collect()),
        block_size: 4,
        lora_id: None,
        medium: None,
        cache_salt: None,
        session_id: None,
        lora_name: None,
    })
}

fn removed(hashes: &[i64]) -> KvEvent {
    KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: hashes.to_vec(),
        medium: None,
    })
}

fn payload(events: Vec<KvEvent>) -> Vec<u8> {
    encode_batch(
        &EventBatch {
            ts: 1.0,
            events,
            attn_dp_rank: Some(0),
        },
        Layout::Map,
    )
}

fn message(frames: Vec<Vec<u8>>) -> ZmqMessage {
    let mut frames = frames.into_iter();
    let mut m = ZmqMessage::from(frames.next().unwrap_or_default());
    for f in frames {
        m.push_back(f.into());
    }
    m
}

/// Poll `check` until it holds; panics with `what` after 10 s.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Send `frames` on `publisher` until `done` holds: a SUB connection only
/// gets messages once its subscription has reached the PUB, so the first
/// message of a test is repeated (the index ignores duplicates).
async fn publish_until(
    publisher: &mut PubSocket,
    frames: &[Vec<u8>],
    what: &str,
    mut done: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        publisher.send(message(frames.to_vec())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct Harness {
    publisher: PubSocket,
    index: Arc<RwLock<KvIndex<String>>>,
    status: Arc<RankStatus>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Harness {
    async fn new(replay: Option<u16>) -> Harness {
        let mut publisher = PubSocket::new();
        let bound = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
        let index = Arc::new(RwLock::new(KvIndex::new(IndexLimits::default())));
        let status = Arc::new(RankStatus::new(0));
        let rank = Rank {
            worker: WORKER.to_string(),
            rank: 0,
            endpoint: format!("tcp://127.0.0.1:{}", port(&bound)),
            replay: replay.map(|p| format!("tcp://127.0.0.1:{p}")),
            topic: TOPIC.to_string(),
            index: index.clone(),
            alive: Arc::new(AtomicBool::new(true)),
            status: status.clone(),
            dropped: Arc::new(AtomicBool::new(false)),
        };
        let tuning = Tuning {
            queue: 1024,
            replay_timeout: Duration::from_secs(5),
            max_replay: 100,
            backoff: (Duration::from_millis(20), Duration::from_millis(200)),
        };
        let task = tokio::spawn(subscriber::run(rank, tuning));
        Harness {
            publisher,
            index,
            status,
            task,
        }
    }

    fn blocks(&self) -> usize {
        self.index.read().blocks(WORKER, 0)
    }

    fn untrusted(&self) -> Option<Untrusted> {
        self.index.read().untrusted(WORKER, 0)
    }

    fn last_seq(&self) -> i64 {
        self.status.last_seq.load(Ordering::Relaxed)
    }

    async fn send(&mut self, seq: i64, events: Vec<KvEvent>) {
        let frames = pub_frames(TOPIC.as_bytes(), seq, &payload(events));
        self.publisher.send(message(frames.to_vec())).await.unwrap();
    }

    /// The first batch, repeated until the subscriber has applied it.
    async fn send_first(&mut self, seq: i64, events: Vec<KvEvent>) {
        let frames = pub_frames(TOPIC.as_bytes(), seq, &payload(events)).to_vec();
        let status = self.status.clone();
        publish_until(&mut self.publisher, &frames, "the first batch", || {
            status.last_seq.load(Ordering::Relaxed) == seq
        })
        .await;
    }
}

/// A replay ROUTER that answers each request with the batches `script`
/// returns for its start seq, then the end marker; reports each start.
async fn replay_server(
    layout: ReplayLayout,
    script: impl Fn(u64) -> Vec<(i64, Vec<u8>)> + Send + 'static,
) -> (
    u16,
    mpsc::UnboundedReceiver<u64>,
    tokio::task::JoinHandle<()>,
) {
    let mut router = RouterSocket::new();
    let bound = router.bind("tcp://127.0.0.1:0").await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok(request) = router.recv().await {
            let frames = request.into_vec();
            let Ok(req) = parse_replay_request(&frames) else {
                continue;
            };
            let id = req.client_id.to_vec();
            let _ = tx.send(req.start_seq);
            let mut replies: Vec<Vec<Vec<u8>>> = script(req.start_seq)
                .iter()
                .map(|(seq, p)| {
                    replay_reply_frames(
                        ReplayReply::Batch {
                            seq: *seq,
                            payload: p,
                        },
                        TOPIC.as_bytes(),
                        layout,
                    )
                })
                .collect();
            replies.push(replay_reply_frames(
                ReplayReply::End,
                TOPIC.as_bytes(),
                layout,
            ));
            for reply in replies {
                let mut frames = vec![id.clone(), Vec::new()];
                frames.extend(reply);
                if router.send(message(frames)).await.is_err() {
                    break;
                }
            }
        }
    });
    (port(&bound), rx, task)
}

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test]
async fn blocks_appear_gaps_are_replayed_and_restarts_reset() {
    for layout in [ReplayLayout::WithTopic, ReplayLayout::SeqPayload] {
        // The batch the subscriber will miss: seq 2 stores 4 and evicts 1.
        let missed = payload(vec![stored(&[4]), removed(&[1])]);
        let after = payload(vec![stored(&[5])]);
        let (replay_port, mut starts, router) = replay_server(layout, move |start| {
            // Only what is still "buffered" from `start` on.
            [(2, missed.clone()), (3, after.clone())]
                .into_iter()
                .filter(|(s, _)| *s as u64 >= start)
                .collect()
        })
        .await;
        let mut h = Harness::new(Some(replay_port)).await;

        h.send_first(0, vec![stored(&[1, 2])]).await;
        assert_eq!(h.blocks(), 2);
        h.send(1, vec![stored(&[3])]).await;
        until("seq 1", || h.last_seq() == 1).await;
        assert_eq!(h.blocks(), 3);

        // Seq 2 never arrives live; seq 3 shows the gap.
        h.send(3, vec![stored(&[5])]).await;
        let start = within("the replay request", starts.recv()).await.unwrap();
        assert_eq!(start, 2, "replay asked from the first missed seq");
        until("seq 3", || h.last_seq() == 3).await;
        assert_eq!(
            h.untrusted(),
            None,
            "the replay filled the gap ({layout:?})"
        );
        assert_eq!(h.status.gaps.load(Ordering::Relaxed), 1);
        assert_eq!(h.status.replayed.load(Ordering::Relaxed), 1);
        {
            let index = h.index.read();
            // 1 was evicted by the replayed batch, 4 stored by it.
            assert_eq!(index.blocks(WORKER, 0), 4);
            assert_eq!(index.cached_tokens(WORKER, 0, &[1]), Some(0));
            assert_eq!(index.cached_tokens(WORKER, 0, &[4]), Some(4));
        }

        // The publisher restarts: seq back to 0 empties the rank.
        h.send(0, vec![stored(&[9])]).await;
        until("the restart", || h.last_seq() == 0).await;
        assert_eq!(h.blocks(), 1);
        assert_eq!(h.untrusted(), None);

        // A gap the replay no longer covers (its buffer holds 2 and 3,
        // not 1): the rank is untrusted...
        h.send(2, vec![]).await;
        let start = within("the second replay request", starts.recv())
            .await
            .unwrap();
        assert_eq!(start, 1);
        until("seq 2", || h.last_seq() == 2).await;
        assert_eq!(h.untrusted(), Some(Untrusted::Gap));
        assert_eq!(h.status.replayed.load(Ordering::Relaxed), 1);
        // ...until the cache is flushed.
        h.send(3, vec![KvEvent::AllBlocksCleared, stored(&[7])])
            .await;
        until("the flush", || h.last_seq() == 3).await;
        assert_eq!(h.untrusted(), None);
        assert_eq!(h.blocks(), 1);
        router.abort();
    }
}

#[tokio::test]
async fn a_gap_without_a_replay_endpoint_leaves_the_rank_untrusted() {
    let mut h = Harness::new(None).await;
    h.send_first(10, vec![stored(&[1])]).await;
    assert_eq!(
        h.untrusted(),
        None,
        "a rank first seen mid-stream is trusted"
    );
    h.send(12, vec![stored(&[2])]).await;
    until("seq 12", || h.last_seq() == 12).await;
    assert_eq!(h.untrusted(), Some(Untrusted::Gap));
    assert_eq!(h.status.gaps.load(Ordering::Relaxed), 1);
    assert_eq!(h.status.replayed.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn garbage_marks_nothing_live_and_the_subscriber_survives() {
    let mut h = Harness::new(None).await;
    let valid_seq = 5i64.to_be_bytes().to_vec();
    let garbage: Vec<Vec<Vec<u8>>> = vec![
        vec![TOPIC.into()],
        vec![TOPIC.into(), vec![1, 2, 3], payload(vec![stored(&[1])])],
        vec![
            TOPIC.into(),
            (-7i64).to_be_bytes().to_vec(),
            payload(vec![]),
        ],
        vec![TOPIC.into(), valid_seq.clone(), vec![0xc1, 0xff, 0x00]],
        vec![TOPIC.into(), valid_seq.clone(), vec![0x93]],
        vec![
            TOPIC.into(),
            i64::MAX.to_be_bytes().to_vec(),
            vec![0xdc, 0xff, 0xff],
        ],
        vec![
            TOPIC.into(),
            valid_seq,
            payload(vec![stored(&[1])]),
            vec![9],
        ],
    ];
    let kinds = garbage.len() as u64;
    // Each kind sent until the subscriber has counted every one malformed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.status.malformed.load(Ordering::Relaxed) < kinds * 2 {
        assert!(Instant::now() < deadline, "the garbage never arrived");
        for g in &garbage {
            h.publisher.send(message(g.clone())).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.last_seq(), -1, "no garbage was applied");
    assert_eq!(h.blocks(), 0);
    // Known since the subscription, and holding nothing.
    let held: Vec<_> = h
        .index
        .read()
        .match_all(&[1])
        .into_iter()
        .map(|(_, _, m)| m.map(|m| m.device_tokens))
        .collect();
    assert_eq!(held, [Some(0)]);
    // Still subscribed: a real batch after all that is applied.
    h.send_first(0, vec![stored(&[1, 2, 3])]).await;
    assert_eq!(h.blocks(), 3);
    assert_eq!(h.untrusted(), None);
    assert!(!h.task.is_finished());
}

/// A worker whose `/server_info` answers `info`, registered, and a
/// subscriber (not yet following the registry).
async fn worker_serving_info(
    info: serde_json::Value,
) -> (
    tokio::task::JoinHandle<std::io::Result<()>>,
    Arc<Registry>,
    String,
    Arc<KvEvents>,
) {
    let app = axum::Router::new().route(
        "/server_info",
        axum::routing::get(move || {
            let info = info.clone();
            async move { axum::Json(info) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http: SocketAddr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let registry = Arc::new(Registry::default());
    registry
        .add(WorkerAddress::from(http), WorkerSpec::REGULAR, None::<u32>)
        .unwrap();
    let base = registry.all()[0].base_url.clone();
    let kv = KvEvents::new(KvEventsOptions::default(), reqwest::Client::new());
    (server, registry, base, kv)
}

#[tokio::test]
async fn discovery_from_server_info_and_removal_drop_the_worker() {
    // The PUB the worker "advertises", bound on all interfaces as SGLang's
    // default `tcp://*:5557` is.
    let mut publisher = PubSocket::new();
    let bound = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
    let pub_port = port(&bound);
    // A worker's /server_info in SGLang 0.5.23's shape.
    let info = serde_json::json!({
        "version": "0.5.23",
        "dp_size": 1,
        "kv_events": {
            "publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": pub_port,
            "topic": TOPIC, "block_size": 4, "dp_size": 1
        }
    });
    let (server, registry, base, kv) = worker_serving_info(info).await;
    let follower = tokio::spawn(kv.clone().run(registry.clone()));

    let frames = pub_frames(TOPIC.as_bytes(), 0, &payload(vec![stored(&[11, 12])])).to_vec();
    publish_until(
        &mut publisher,
        &frames,
        "the advertised publisher's batch",
        // Live from the subscription on; the batch shows as a seq.
        || {
            kv.view(&base)
                .is_some_and(|v| v.live && v.ranks.iter().all(|r| r.last_seq.is_some()))
        },
    )
    .await;
    let view = kv.view(&base).unwrap();
    assert_eq!(view.discovery, "subscribed");
    assert_eq!(
        view.endpoint.as_deref(),
        Some(&*format!("tcp://127.0.0.1:{pub_port}"))
    );
    assert_eq!(view.blocks, 2);
    assert_eq!(view.ranks.len(), 1);
    assert_eq!(
        (view.ranks[0].state, view.ranks[0].last_seq),
        ("live", Some(0))
    );
    assert_eq!(kv.index().read().blocks(base.as_str(), 0), 2);

    registry.remove(&base).unwrap();
    until("the worker's removal", || kv.view(&base).is_none()).await;
    assert_eq!(kv.index().read().total_blocks(), 0);
    // Its socket is gone: more batches change nothing.
    publisher
        .send(message(
            pub_frames(TOPIC.as_bytes(), 1, &payload(vec![stored(&[13])])).to_vec(),
        ))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(kv.index().read().total_blocks(), 0);
    follower.abort();
    server.abort();
}

#[tokio::test]
async fn a_worker_advertising_nothing_is_not_subscribed() {
    let (server, registry, base, kv) =
        worker_serving_info(serde_json::json!({"dp_size": 1, "kv_events": null})).await;
    kv.sync(&registry.all());
    until("discovery", || {
        kv.view(&base).is_some_and(|v| v.discovery != "pending")
    })
    .await;
    let view = kv.view(&base).unwrap();
    assert_eq!(view.discovery, "not_advertised");
    assert!(view.ranks.is_empty() && !view.live);
    server.abort();
}
