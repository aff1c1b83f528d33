//! KV events as SGLang publishes them, for the simulated cache: token ids
//! and page hashes of a prompt, and the `BlockStored` / `BlockRemoved` /
//! `AllBlocksCleared` batches sent on each DP rank's publisher.
//!
//! What SGLang does (0.5.23 `srt/mem_cache/events.py`, `radix_cache.py`,
//! `disaggregation/kv_events.py`): the radix cache stores page-aligned keys;
//! each newly cached page becomes a `BlockStored` with its chained SHA-256
//! hash, its parent's hash, its tokens, `block_size` = page length,
//! `lora_id` None and `medium` `"GPU"`, consecutive pages coalesced into one
//! event; evicted pages become `BlockRemoved` (medium `"GPU"`); a cache reset
//! becomes `AllBlocksCleared`. The events of one scheduler step go out as one
//! batch `[ts, events, attn_dp_rank]`, events as maps (0.5.23 layout).
//!
//! The simulator publishes one batch per prefill (the evictions it caused,
//! then the pages it stored) and one per flush. It caches prompt pages only,
//! not generated tokens (SGLang also caches the output when a request ends).

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use sglang_envoy_kv_events::hash::{block_hashes, ChainStart};
use sglang_envoy_kv_events::{
    encode_batch, BlockRemoved, BlockStored, EventBatch, KvEvent, Layout, TokenIds,
};

use crate::cache::Inserted;
use crate::kv_config::KvEventsConfig;
use crate::publisher::{PublishError, PublisherStatus, RankPublisher};
use crate::tokens::{token_id, tokenize, Token};

/// The storage tier SGLang's radix cache names in its events.
const MEDIUM_GPU: &str = "GPU";

/// The token ids the simulated worker hashes and publishes for `tokens`:
/// a prompt given as ids keeps them; text tokens (about 4 characters each)
/// get the stable id in `0..32000` that logprobs report. A negative id
/// (which SGLang would refuse) is published as its magnitude.
pub fn token_ids(tokens: &[Token]) -> Vec<u64> {
    tokens
        .iter()
        .map(|&t| {
            let id = token_id(t);
            u64::try_from(id).unwrap_or(id.unsigned_abs())
        })
        .collect()
}

/// [`token_ids`] of a text prompt (a chat's rendered prompt included), for
/// tests that recompute what the worker hashed.
pub fn text_token_ids(text: &str) -> Vec<u64> {
    token_ids(&tokenize(text))
}

/// A prompt cut into full pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pages {
    /// Token ids of the full pages, back to back (a partial tail is left
    /// out: SGLang's paged radix cache never stores it).
    pub ids: Vec<u64>,
    /// The chained hash of each page, as in SGLang's events.
    pub hashes: Vec<i64>,
}

impl Pages {
    /// The cache keys of the pages (their hashes, as unsigned).
    pub fn keys(&self) -> Vec<u64> {
        self.hashes.iter().map(|&h| h as u64).collect()
    }
}

/// Every DP rank's publisher, and the page size events are cut at.
#[derive(Debug)]
pub struct KvEvents {
    config: KvEventsConfig,
    page_size: usize,
    ranks: Vec<RankPublisher>,
}

/// `base + rank` as a port.
fn offset(base: u16, rank: usize) -> Result<u16, PublishError> {
    u16::try_from(rank)
        .ok()
        .and_then(|r| base.checked_add(r))
        .ok_or(PublishError::PortRange { base, rank })
}

impl KvEvents {
    /// Binds the publishers of `dp_size` ranks: rank `r` on the configured
    /// ports plus `r`, as SGLang does. With port 0, rank 0 picks a free
    /// port and the other ranks follow it.
    pub async fn start(
        config: &KvEventsConfig,
        page_size: usize,
        dp_size: usize,
    ) -> Result<KvEvents, PublishError> {
        let mut ranks: Vec<RankPublisher> = Vec::with_capacity(dp_size);
        for rank in 0..dp_size.max(1) {
            let pub_base = ranks
                .first()
                .map_or(config.endpoint.port, |r0| r0.pub_port());
            let pub_port = if rank == 0 {
                pub_base
            } else {
                offset(pub_base, rank)?
            };
            let replay = match (&config.replay_endpoint, ranks.first()) {
                (None, _) => None,
                (Some(e), None) => Some(e.bind_address(e.port)),
                (Some(e), Some(r0)) => {
                    let base = r0.replay_port().unwrap_or(e.port);
                    Some(e.bind_address(offset(base, rank)?))
                }
            };
            let publisher = RankPublisher::bind(
                rank,
                &config.topic,
                config.buffer_steps,
                &config.endpoint.bind_address(pub_port),
                replay.as_deref(),
            )
            .await?;
            ranks.push(publisher);
        }
        Ok(KvEvents {
            config: config.clone(),
            page_size: page_size.max(1),
            ranks,
        })
    }

    /// Tokens per page (the events' `block_size`).
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// `tokens`' full pages and their hashes.
    pub fn pages(&self, tokens: &[Token]) -> Pages {
        let mut ids = token_ids(tokens);
        ids.truncate(ids.len() / self.page_size * self.page_size);
        match block_hashes(&ids, self.page_size, &ChainStart::plain()) {
            Ok(hashes) => Pages { ids, hashes },
            // Cannot happen for the ids above (all below 2^63); caching
            // nothing is the safe answer if it ever did.
            Err(e) => {
                tracing::warn!(error = %e, "cannot hash prompt pages; not caching them");
                Pages {
                    ids: Vec::new(),
                    hashes: Vec::new(),
                }
            }
        }
    }

    /// Publishes what inserting `pages` into `rank`'s cache changed, if
    /// anything: evictions first (SGLang evicts to make room before it
    /// stores), then the new pages as one coalesced `BlockStored`.
    pub fn publish_insert(&self, rank: usize, pages: &Pages, inserted: &Inserted) {
        let mut events = Vec::new();
        if !inserted.evicted.is_empty() {
            events.push(KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: inserted.evicted.iter().map(|&k| k as i64).collect(),
                medium: Some(MEDIUM_GPU.into()),
            }));
        }
        let new = inserted.new.clone();
        if let (Some(hashes), Some(ids)) = (
            pages.hashes.get(new.clone()),
            pages
                .ids
                .get(new.start * self.page_size..new.end * self.page_size),
        ) {
            if !hashes.is_empty() {
                events.push(KvEvent::BlockStored(BlockStored {
                    block_hashes: hashes.to_vec(),
                    parent_block_hash: new
                        .start
                        .checked_sub(1)
                        .and_then(|p| pages.hashes.get(p))
                        .copied(),
                    token_ids: TokenIds::Flat(ids.to_vec()),
                    block_size: u32::try_from(self.page_size).unwrap_or(u32::MAX),
                    lora_id: None,
                    medium: Some(MEDIUM_GPU.into()),
                    cache_salt: None,
                    session_id: None,
                    lora_name: None,
                }));
            }
        }
        if !events.is_empty() {
            self.publish(rank, events);
        }
    }

    /// Publishes `AllBlocksCleared` on `rank`.
    pub fn publish_cleared(&self, rank: usize) {
        self.publish(rank, vec![KvEvent::AllBlocksCleared]);
    }

    fn publish(&self, rank: usize, events: Vec<KvEvent>) {
        let Some(publisher) = self.ranks.get(rank) else {
            return;
        };
        let batch = EventBatch {
            ts: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            events,
            attn_dp_rank: i64::try_from(rank).ok(),
        };
        let seq = publisher.publish(encode_batch(&batch, Layout::Map));
        tracing::trace!(
            rank,
            seq,
            events = batch.events.len(),
            "KV events published"
        );
    }

    /// Withholds the next `n` batches of `rank` (every rank when None).
    /// False when there is no such rank.
    pub fn drop_next(&self, rank: Option<usize>, n: u64) -> bool {
        match rank {
            Some(r) => self.ranks.get(r).map(|p| p.drop_next(n)).is_some(),
            None => {
                self.ranks.iter().for_each(|p| p.drop_next(n));
                true
            }
        }
    }

    /// Restarts `rank`'s sequence at 0 with an empty replay buffer.
    pub fn restart(&self, rank: usize) {
        if let Some(p) = self.ranks.get(rank) {
            p.restart();
        }
    }

    /// Every rank's counters.
    pub fn status(&self) -> Vec<PublisherStatus> {
        self.ranks.iter().map(RankPublisher::status).collect()
    }

    /// The `kv_events` object of `/server_info`.
    pub fn descriptor(&self) -> Value {
        let (pub_port, replay_port) = self
            .ranks
            .first()
            .map_or((0, None), |r| (r.pub_port(), r.replay_port()));
        self.config
            .descriptor(pub_port, replay_port, self.page_size, self.ranks.len())
    }

    /// The flag's JSON as given.
    pub fn raw_config(&self) -> &str {
        &self.config.raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Prompt;

    #[test]
    fn token_ids_are_stable_and_keep_given_ids() {
        let a = token_ids(&tokenize("hello world, again"));
        assert_eq!(a, token_ids(&tokenize("hello world, again")));
        assert_eq!(a.len(), 5);
        assert!(a.iter().all(|&id| id < 32000));
        assert_ne!(a[0], a[1]);
        assert_eq!(
            token_ids(&Prompt::Ids(vec![7, 40000, -3]).tokens()),
            vec![7, 40000, 3]
        );
    }

    #[tokio::test]
    async fn pages_are_full_pages_hashed_with_the_crate_chain() {
        let config = KvEventsConfig::parse(
            r#"{"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","bind":true}"#,
        )
        .unwrap()
        .unwrap();
        let kv = KvEvents::start(&config, 4, 1).await.unwrap();
        let tokens = Prompt::Ids((1..=9).collect()).tokens();
        let p = kv.pages(&tokens);
        assert_eq!(p.ids, (1..=8).collect::<Vec<u64>>());
        // The kv-events crate's golden values for [1,2,3,4] and [5,6,7,8].
        assert_eq!(p.hashes, vec![-3488128144981237669, 5674439469042975057]);
        assert_eq!(p.keys()[0], p.hashes[0] as u64);
        assert!(!kv.drop_next(Some(1), 1));
        assert!(kv.drop_next(Some(0), 1));
        assert_eq!(kv.status()[0].drop_next, 1);
        let d = kv.descriptor();
        assert_eq!(d["block_size"], 4);
        assert_eq!(d["endpoint_port_base"], kv.status()[0].endpoint_port);
    }

    #[tokio::test]
    async fn ranks_bind_consecutive_ports() {
        let config = KvEventsConfig::parse(
            r#"{"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","bind":true,"replay_endpoint":"tcp://127.0.0.1:0"}"#,
        )
        .unwrap()
        .unwrap();
        // Port 0: rank 0 picks, rank 1 takes the next port (which another
        // process may hold: retry a few times rather than flake).
        for _ in 0..5 {
            let Ok(kv) = KvEvents::start(&config, 1, 2).await else {
                continue;
            };
            let s = kv.status();
            assert_eq!(s[1].endpoint_port, s[0].endpoint_port + 1);
            assert_eq!(
                s[1].replay_endpoint_port,
                s[0].replay_endpoint_port.map(|p| p + 1)
            );
            assert_eq!(kv.descriptor()["dp_size"], 2);
            return;
        }
        panic!("could not bind two consecutive ports");
    }
}
