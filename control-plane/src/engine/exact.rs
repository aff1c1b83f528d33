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
//! **The self-check.** The front door reads the cached tokens the chosen
//! worker reports and sends them with the request's end; [`ExactCache::check`]
//! compares them with the prediction. A worker whose recent answers agree
//! less than [`DISTRUST_BELOW`] of the time (a tokenizer or template that
//! differs from the worker's) is logged loudly and routed on the tree
//! until they agree again.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use sglang_envoy_kv_events::{block_hashes, ChainStart, KvIndex};
use sglang_envoy_prompt::{PromptError, PromptTokenizer};

use crate::workers::Worker;

/// The KV-event index, the model's tokenizer, and the self-check.
pub struct ExactCache {
    index: Arc<RwLock<KvIndex<String>>>,
    tokenizer: Arc<PromptTokenizer>,
    checks: Mutex<HashMap<String, Checks>>,
}

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
    /// The prompt's length in tokens.
    pub prompt_tokens: usize,
}

impl ExactCache {
    /// Matches from `index` for prompts tokenized by `tokenizer`.
    pub fn new(index: Arc<RwLock<KvIndex<String>>>, tokenizer: Arc<PromptTokenizer>) -> Self {
        ExactCache {
            index,
            tokenizer,
            checks: Mutex::new(HashMap::new()),
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
        let ranks = match w.dp_rank {
            Some(r) => vec![r],
            None => index.ranks(base),
        };
        let known = index.ranks(base);
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
        let mut tokens = Vec::with_capacity(workers.len());
        for w in workers {
            let Some(ranks) = Self::live_ranks(&index, w) else {
                tokens.push(None);
                continue;
            };
            let base = w.base_url.as_str();
            let mut best = 0usize;
            for r in ranks {
                // A rank that never stored a block holds nothing.
                let Some(page) = index.page_size(base, r).filter(|&p| p > 0) else {
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
                let held = index.cached_tokens(base, r, &chains[pos].1).unwrap_or(0);
                // The last prompt token is never taken from the cache, and
                // matches are whole pages (SGLang's `match_prefix`).
                let reusable = len.saturating_sub(1) / page * page;
                best = best.max(held.min(reusable));
            }
            tokens.push(Some(best));
        }
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
            prompt_tokens: len,
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
