//! Exact cached prefixes from the workers' KV events: the request's prompt
//! tokens as the worker computes them (`sglang-envoy-prompt`, from the
//! model's files given by `--tokenizer-path` / `--model-path`), hashed into
//! SGLang's page chain and looked up in the KV-event index.
//!
//! A worker's match is exact only where every rank the request may reach
//! is known and trusted; elsewhere it is `None` and the policy asks its
//! approximate tree. A request whose tokens cannot be known (images,
//! batches, LoRA adapters, a template error) uses the tree everywhere.
//!
//! **Pages on their way.** The events say what a worker stored, a prefill
//! after the router sent the request. Until then, [`ExactCache::note_routed`]
//! keeps the pages of each request sent (for [`PENDING_TTL`], or until a
//! lookup finds them stored), and a match walks on through them.
//!
//! **The self-check.** The front door reads the cached tokens the chosen
//! worker reports and sends them with the request's end; [`ExactCache::check`]
//! compares them with the prediction. A worker whose recent answers agree
//! less than [`DISTRUST_BELOW`] of the time (a tokenizer or template that
//! differs from the worker's) is logged loudly and routed on the tree
//! until they agree again.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use sglang_envoy_kv_events::{block_hashes, ChainStart, KvIndex};
use sglang_envoy_prompt::{PromptError, PromptTokenizer};

use crate::workers::Worker;

/// The KV-event index, the model's tokenizer, the pages routed but not
/// yet stored, and the self-check.
pub struct ExactCache {
    index: Arc<RwLock<KvIndex<String>>>,
    tokenizer: Arc<PromptTokenizer>,
    pending: Mutex<HashMap<(String, u32), HashMap<i64, Instant>>>,
    checks: Mutex<HashMap<String, Checks>>,
}

/// How long a page routed to a worker counts as on its way there before
/// its `BlockStored` confirms it: a request's prefill may queue for
/// seconds; one that never runs (cancelled, failed) stops counting then.
const PENDING_TTL: Duration = Duration::from_secs(20);
/// Pages one rank may have on their way (beyond it, the expired ones go,
/// then all of them).
const PENDING_CAP: usize = 1 << 16;

/// Results of the self-check kept per worker.
const WINDOW: usize = 64;
/// Results needed before a worker can be distrusted.
const MIN_CHECKS: usize = 20;
/// Below this share of agreeing results, a worker is routed on the tree:
/// the router's tokens or template differ from the worker's. Races
/// (pages stored or evicted between the decision and the prefill) stay
/// well above it.
const DISTRUST_BELOW: f64 = 0.9;
/// At or above this share a distrusted worker is trusted again.
const TRUST_FROM: f64 = 0.98;

/// One worker's recent self-check results.
#[derive(Debug, Default)]
struct Checks {
    recent: VecDeque<bool>,
    checked: u64,
    agreed: u64,
    distrusted: bool,
}

impl Checks {
    fn share(&self) -> f64 {
        let agreed = self.recent.iter().filter(|&&a| a).count();
        agreed as f64 / self.recent.len().max(1) as f64
    }
}

/// The self-check of one worker, for `/workers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckView {
    /// Answers whose reported cached tokens were compared.
    pub checked: u64,
    /// Of those, the ones that matched the prediction.
    pub agreed: u64,
    /// Routed on its events (not distrusted by the self-check).
    pub trusted: bool,
}

/// What one self-check result changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckChange {
    /// Nothing.
    None,
    /// The worker is routed on the tree from now on.
    Distrusted,
    /// The worker is routed on its events again.
    Trusted,
}

/// One request's exact matches over a slice of workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matches {
    /// Per worker: the cached prefix in the routing text's bytes (the
    /// policies' unit), `None` where the tree must guess.
    pub bytes: Vec<Option<usize>>,
    /// Per worker: the tokens it should report as cached.
    pub tokens: Vec<Option<usize>>,
    /// The prompt's page hashes, per page size.
    chains: Vec<(usize, Vec<i64>)>,
}

impl Matches {
    fn chain(&self, page: usize) -> Option<&[i64]> {
        self.chains
            .iter()
            .find(|(p, _)| *p == page)
            .map(|(_, c)| c.as_slice())
    }

    /// The page size used where a rank has not stored yet: the fleet's.
    fn any_page(&self) -> Option<usize> {
        self.chains.first().map(|(p, _)| *p)
    }
}

impl ExactCache {
    /// Matches from `index` for prompts tokenized by `tokenizer`.
    pub fn new(index: Arc<RwLock<KvIndex<String>>>, tokenizer: Arc<PromptTokenizer>) -> Self {
        ExactCache {
            index,
            tokenizer,
            pending: Mutex::new(HashMap::new()),
            checks: Mutex::new(HashMap::new()),
        }
    }

    /// The request of `m` was sent to `w`: its pages are on their way
    /// there. Events lag decisions by a prefill; without this, requests
    /// sharing a new prefix would all look cold until the first one's
    /// prefill ends, and be spread over the fleet.
    pub fn note_routed(&self, w: &Worker, m: &Matches) {
        let index = self.index.read();
        let Some(ranks) = Self::live_ranks(&index, w) else {
            return;
        };
        let now = Instant::now();
        let mut pending = self.pending.lock();
        for r in ranks {
            let page = index.page_size(w.base_url.as_str(), r).or(m.any_page());
            let Some(chain) = page.and_then(|p| m.chain(p)) else {
                continue;
            };
            // Only what it does not hold yet is on its way: a page it
            // stores and then drops must not come back as routed.
            let page = page.unwrap_or(1).max(1);
            let held = index
                .cached_tokens(w.base_url.as_str(), r, chain)
                .unwrap_or(0)
                / page;
            let chain = &chain[held.min(chain.len())..];
            let pages = pending.entry((w.base_url.clone(), r)).or_default();
            if pages.len() + chain.len() > PENDING_CAP {
                pages.retain(|_, until| *until > now);
                if pages.len() + chain.len() > PENDING_CAP {
                    pages.clear();
                }
            }
            for &h in chain {
                pages.insert(h, now + PENDING_TTL);
            }
        }
    }

    /// Records one self-check of the worker at `base_url`: it reported
    /// `reported` cached tokens where `predicted` were expected.
    pub fn check(&self, base_url: &str, predicted: u64, reported: u64) -> CheckChange {
        let mut all = self.checks.lock();
        let c = all.entry(base_url.to_string()).or_default();
        let agree = predicted == reported;
        c.checked += 1;
        c.agreed += u64::from(agree);
        c.recent.push_back(agree);
        if c.recent.len() > WINDOW {
            c.recent.pop_front();
        }
        let share = c.share();
        if !c.distrusted && c.recent.len() >= MIN_CHECKS && share < DISTRUST_BELOW {
            c.distrusted = true;
            CheckChange::Distrusted
        } else if c.distrusted && share >= TRUST_FROM {
            c.distrusted = false;
            CheckChange::Trusted
        } else {
            CheckChange::None
        }
    }

    /// The self-check of the worker at `base_url`.
    pub fn check_view(&self, base_url: &str) -> CheckView {
        self.checks.lock().get(base_url).map_or(
            CheckView {
                trusted: true,
                ..Default::default()
            },
            |c| CheckView {
                checked: c.checked,
                agreed: c.agreed,
                trusted: !c.distrusted,
            },
        )
    }

    /// Forgets a removed worker's self-check.
    pub fn forget(&self, base_url: &str) {
        self.checks.lock().remove(base_url);
    }

    /// The ranks of `w` a request may reach, if all are known and
    /// trusted: its own with `--dp-aware`, every one of its server's
    /// otherwise (SGLang's DP controller then picks).
    fn live_ranks(index: &KvIndex<String>, w: &Worker) -> Option<Vec<u32>> {
        let base = w.base_url.as_str();
        let known = index.ranks(base);
        let ranks = match w.dp_rank {
            Some(r) => vec![r],
            None => known.clone(),
        };
        let live = !ranks.is_empty()
            && ranks
                .iter()
                .all(|r| known.contains(r) && index.untrusted(base, *r).is_none());
        live.then_some(ranks)
    }

    /// Whether any of `workers` has live events (so a request's body is
    /// worth reading).
    pub fn covers(&self, workers: &[Arc<Worker>]) -> bool {
        let index = self.index.read();
        workers
            .iter()
            .any(|w| Self::live_ranks(&index, w).is_some())
    }

    /// The exact matches of the request to `path` with `body` over
    /// `workers`; `text_len` is its routing text's length.
    pub fn matches(
        &self,
        path: &str,
        body: &[u8],
        text_len: usize,
        workers: &[Arc<Worker>],
    ) -> Result<Matches, PromptError> {
        let prompt = self.tokenizer.tokens(path, body)?;
        if prompt.lora {
            return Err(PromptError::Unpredictable("a LoRA adapter's namespace"));
        }
        let ids: Vec<u64> = prompt.ids.iter().map(|&t| u64::from(t)).collect();
        let start = prompt
            .cache_salt
            .as_deref()
            .map_or_else(ChainStart::plain, ChainStart::salted);
        let len = ids.len();
        // Hashes per page size (one in any real fleet).
        let mut chains: Vec<(usize, Vec<i64>)> = Vec::new();
        let index = self.index.read();
        let live: Vec<Option<Vec<u32>>> = workers
            .iter()
            .map(|w| Self::live_ranks(&index, w))
            .collect();
        // A rank that never stored a block holds nothing but what is on
        // its way, hashed with the fleet's page size.
        let fleet_page = workers
            .iter()
            .zip(&live)
            .filter_map(|(w, ranks)| Some((w, ranks.as_ref()?)))
            .flat_map(|(w, ranks)| ranks.iter().map(move |&r| (w, r)))
            .find_map(|(w, r)| index.page_size(w.base_url.as_str(), r))
            .filter(|&p| p > 0);
        let now = Instant::now();
        let mut pending = self.pending.lock();
        let mut tokens = Vec::with_capacity(workers.len());
        for (w, ranks) in workers.iter().zip(live) {
            let Some(ranks) = ranks else {
                tokens.push(None);
                continue;
            };
            let base = w.base_url.as_str();
            let mut best = 0usize;
            for r in ranks {
                let Some(page) = index.page_size(base, r).or(fleet_page).filter(|&p| p > 0) else {
                    continue;
                };
                let pos = match chains.iter().position(|(p, _)| *p == page) {
                    Some(pos) => pos,
                    None => {
                        let hashes = block_hashes(&ids, page, &start)
                            .map_err(|_| PromptError::Unpredictable("token ids too wide"))?;
                        chains.push((page, hashes));
                        chains.len() - 1
                    }
                };
                let chain = &chains[pos].1;
                let stored = index.cached_tokens(base, r, chain).unwrap_or(0) / page;
                let mut held = stored;
                if let Some(on_way) = pending.get_mut(&(w.base_url.clone(), r)) {
                    // Stored pages are the index's now: removals count.
                    for h in &chain[..stored.min(chain.len())] {
                        on_way.remove(h);
                    }
                    while chain
                        .get(held)
                        .and_then(|h| on_way.get(h))
                        .is_some_and(|until| *until > now)
                    {
                        held += 1;
                    }
                }
                let held = held * page;
                // The last prompt token is never taken from the cache, and
                // matches are whole pages (SGLang's `match_prefix`).
                let reusable = len.saturating_sub(1) / page * page;
                best = best.max(held.min(reusable));
            }
            tokens.push(Some(best));
        }
        drop(pending);
        drop(index);
        // A worker its self-check distrusts is still predicted (so that the
        // check goes on and can trust it again) but routed on the tree.
        let checks = self.checks.lock();
        let bytes = tokens
            .iter()
            .zip(workers)
            .map(|(t, w)| {
                let distrusted = checks.get(&w.base_url).is_some_and(|c| c.distrusted);
                t.filter(|_| !distrusted)
                    .map(|t| (text_len * t).checked_div(len).unwrap_or(0))
            })
            .collect();
        Ok(Matches {
            bytes,
            tokens,
            chains,
        })
    }
}

/// A metrics label for why a request was routed on the tree alone.
pub fn skip_reason(e: &PromptError) -> &'static str {
    match e {
        PromptError::Unpredictable(_) => "unpredictable",
        PromptError::Invalid(_) => "invalid",
        PromptError::Template(_) => "template",
        PromptError::Tokenizer(_) | PromptError::Files(_) => "tokenizer",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::{WorkerAddress, WorkerSpec};
    use sglang_envoy_kv_events::{BlockStored, IndexLimits, KvEvent, TokenIds};

    fn worker(port: u16) -> Arc<Worker> {
        let w = Worker::new(
            WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
            WorkerSpec::REGULAR,
            None,
            Arc::default(),
            u32::from(port),
        );
        w.set_healthy(true);
        Arc::new(w)
    }

    /// A store of `hashes`, pages of 16 tokens.
    fn stored(hashes: Vec<i64>) -> KvEvent {
        KvEvent::BlockStored(BlockStored {
            block_hashes: hashes,
            parent_block_hash: None,
            token_ids: TokenIds::Flat(Vec::new()),
            block_size: 16,
            lora_id: None,
            medium: None,
            lora_name: None,
            cache_salt: None,
            session_id: None,
        })
    }

    fn body(question: &str) -> Vec<u8> {
        let system = "a long system prompt shared by many users. ".repeat(20);
        serde_json::json!({"messages": [{"role": "system", "content": system},
            {"role": "user", "content": question}]})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn pages_routed_count_until_stored_and_then_follow_the_events() {
        let tokenizer = PromptTokenizer::from_files(sglang_envoy_prompt::fixture::model_files())
            .expect("fixture model");
        let index = Arc::new(RwLock::new(KvIndex::new(IndexLimits::default())));
        let ws = vec![worker(1), worker(2)];
        {
            // Both subscribed; the second has stored an unrelated page, which
            // tells the fleet's page size (16).
            let mut i = index.write();
            i.open_rank(&ws[0].base_url, 0);
            let store = stored(vec![42]);
            i.apply_events(&ws[1].base_url, 0, &[store]);
        }
        let exact = ExactCache::new(index.clone(), Arc::new(tokenizer));
        let path = "/v1/chat/completions";
        let first = exact
            .matches(path, &body("one"), 100, &ws)
            .expect("matches");
        assert_eq!(first.tokens, [Some(0), Some(0)]);
        exact.note_routed(&ws[0], &first);
        // The next request sharing the system prompt finds it on its way
        // to the first worker, before any event says so.
        let second = exact
            .matches(path, &body("two"), 100, &ws)
            .expect("matches");
        let on_way = second.tokens[0].unwrap_or(0);
        assert!(on_way >= 16 * 10, "{:?}", second.tokens);
        assert_eq!(second.tokens[1], Some(0));
        // Stored, then evicted: the events win over what was sent.
        let chain = first.chain(16).expect("a chain").to_vec();
        let stored = stored(chain);
        index.write().apply_events(&ws[0].base_url, 0, &[stored]);
        let third = exact
            .matches(path, &body("three"), 100, &ws)
            .expect("matches");
        assert_eq!(third.tokens[0], second.tokens[0]);
        index
            .write()
            .apply_events(&ws[0].base_url, 0, &[KvEvent::AllBlocksCleared]);
        let fourth = exact
            .matches(path, &body("four"), 100, &ws)
            .expect("matches");
        assert_eq!(fourth.tokens[0], Some(0));
    }
}
