//! Configuration and the state shared by all handlers.

use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bootstrap::{self, Kv, Rooms};
use crate::control::Control;
use crate::disagg::{prompt_hash, DisaggregationMode, Handoff};
use crate::engine::{Engine, Prefilled};
use crate::error::ApiError;
use crate::kv_config::KvEventsConfig;
use crate::kv_events::KvEvents;
use crate::record::{RecordId, Recorder};
use crate::request::Body;
use crate::stats::{InFlight, KvEvent, Stats};
use crate::tokens::Token;
use crate::wire::{self, InfoRoutes, Ranks, WireProfile};
use sglang_envoy_prompt::PromptTokenizer;

/// Startup configuration of a simulated worker (the CLI flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Reported host (the listener decides where it really listens).
    pub host: String,
    /// Reported port; [`crate::serve`] replaces it with the bound port.
    pub port: u16,
    /// Model path, also the served model id.
    pub model_path: String,
    /// Number of data-parallel ranks.
    pub dp_size: usize,
    /// Simulated prefill time per uncached prompt token, in microseconds.
    pub prefill_us_per_token: u64,
    /// Simulated time per generated token, in microseconds.
    pub decode_us_per_token: u64,
    /// Concurrent prefills per DP rank; more wait in a queue.
    pub max_running_prefills: usize,
    /// Prefix-cache capacity in tokens, per DP rank.
    pub cache_tokens: usize,
    /// Tokens generated when a request does not say.
    pub default_max_tokens: usize,
    /// `--context-length`: a request may ask to generate fewer tokens than
    /// this, at least one being its prompt's (SGLang refuses more with a
    /// 400; without it a client's huge `max_tokens` would have the
    /// simulator generate without end).
    pub context_length: usize,
    /// `--disaggregation-mode`: `null` (not disaggregated), `prefill` or
    /// `decode`.
    pub disaggregation_mode: DisaggregationMode,
    /// `--disaggregation-bootstrap-port`: where a prefill worker's bootstrap
    /// server listens (0 picks a free port; [`crate::serve`] replaces it with
    /// the bound one); on a decode worker, the port used for requests whose
    /// `bootstrap_port` is `null`.
    pub disaggregation_bootstrap_port: u16,
    /// `--disaggregation-timeout-ms`: how long a prefill waits for its room
    /// to be fetched, and a decode for its room to be published.
    pub disaggregation_timeout_ms: u64,
    /// `--wire-profile`: which DP-rank fields it reads (see [`crate::wire`]).
    pub wire_profile: WireProfile,
    /// `--sglang-version`: the version reported; `None`: the profile's.
    pub version: Option<String>,
    /// `--info-routes`: which server and model info routes exist.
    pub info_routes: InfoRoutes,
    /// `--enable-cache-report`: `usage.prompt_tokens_details.cached_tokens`
    /// in OpenAI answers (SGLang's flag, off by default there too; native
    /// `meta_info.cached_tokens` is always reported).
    pub enable_cache_report: bool,
    /// `--health-delay-ms`: how long a `/health` takes (SGLang's runs a
    /// one-token generate and looks for output after a one-second sleep).
    pub health_delay_ms: u64,
    /// `--health-timeout-ms`: how long a `/health` of a stalled worker
    /// waits before it answers 503 (SGLang's `SGLANG_HEALTH_CHECK_TIMEOUT`).
    pub health_timeout_ms: u64,
    /// `--startup-ms`: how long after the start `/health` answers 503, as
    /// SGLang's does while the server is starting.
    pub startup_ms: u64,
    /// `--api-key`: every request but `/health*`, `/metrics`, `OPTIONS`
    /// and the `/_sim/` switches needs `Authorization: Bearer <key>`, as
    /// SGLang's server with `--api-key`.
    pub api_key: Option<String>,
    /// `--kv-events-config` with a `zmq` publisher: publish KV events, and
    /// cache in pages of `page_size` tokens. `None` (the default, and
    /// `"publisher": "null"`): no events, a token-level cache.
    pub kv_events_config: Option<KvEventsConfig>,
    /// `--page-size`: tokens per cached page, used only with
    /// `kv_events_config` (the token-level cache stays as it was).
    pub page_size: usize,
    /// `--tokenizer-path`: tokenize prompts with this model's files as
    /// SGLang does; `None`: the toy tokenizer.
    pub tokenizer_path: Option<std::path::PathBuf>,
}

/// `--page-size` default. SGLang resolves its own per attention backend
/// (1 for most); 16 keeps the simulator's events per prompt few.
pub const DEFAULT_PAGE_SIZE: usize = 16;

/// The simulated model's context length, in tokens, unless told.
pub const DEFAULT_CONTEXT_LENGTH: usize = 32768;

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            host: "127.0.0.1".into(),
            port: 30001,
            model_path: "sim-model".into(),
            dp_size: 1,
            prefill_us_per_token: 10,
            decode_us_per_token: 200,
            max_running_prefills: 1,
            cache_tokens: 1_000_000,
            default_max_tokens: 16,
            context_length: DEFAULT_CONTEXT_LENGTH,
            disaggregation_mode: DisaggregationMode::Null,
            disaggregation_bootstrap_port: 8998,
            disaggregation_timeout_ms: 5000,
            wire_profile: WireProfile::default(),
            version: None,
            info_routes: InfoRoutes::default(),
            enable_cache_report: false,
            health_delay_ms: 1000,
            health_timeout_ms: 20_000,
            startup_ms: 0,
            api_key: None,
            kv_events_config: None,
            page_size: DEFAULT_PAGE_SIZE,
            tokenizer_path: None,
        }
    }
}

impl SimConfig {
    /// The version the info routes report.
    pub fn reported_version(&self) -> &str {
        self.version
            .as_deref()
            .unwrap_or(self.wire_profile.default_version())
    }
}

/// Everything the handlers share; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

/// The shared parts of [`AppState`].
#[derive(Debug)]
pub struct Shared {
    /// Startup configuration.
    pub config: SimConfig,
    /// The simulated GPU.
    pub engine: Engine,
    /// The `/_sim/config` switches.
    pub control: Arc<Control>,
    /// The request log.
    pub recorder: Recorder,
    /// Request counters.
    pub stats: Arc<Stats>,
    /// Rooms of the bootstrap server (used in prefill mode).
    pub rooms: Rooms,
    /// Client for fetching KV from prefill workers (used in decode mode).
    pub client: reqwest::Client,
    /// When the worker started (`--startup-ms` counts from here).
    pub started: Instant,
    /// The KV-event publishers, with `--kv-events-config`.
    pub kv: Option<Arc<KvEvents>>,
    /// The model's tokenizer, with `--tokenizer-path`.
    pub tokenizer: Option<Arc<PromptTokenizer>>,
}

impl Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// Fresh state for `config`, publishing no KV events.
    pub fn new(config: SimConfig) -> AppState {
        AppState::with_kv(config, None)
    }

    /// Fresh state for `config` whose caches publish on `kv` (bound by
    /// [`KvEvents::start`] from `config.kv_events_config`).
    pub fn with_kv(config: SimConfig, kv: Option<Arc<KvEvents>>) -> AppState {
        AppState::with_parts(config, kv, None)
    }

    /// Fresh state publishing on `kv` and tokenizing with `tokenizer`
    /// (loaded from `config.tokenizer_path`).
    pub fn with_parts(
        config: SimConfig,
        kv: Option<Arc<KvEvents>>,
        tokenizer: Option<Arc<PromptTokenizer>>,
    ) -> AppState {
        let dp_size = config.dp_size.max(1);
        let control = Arc::new(Control::new(
            config.prefill_us_per_token,
            config.decode_us_per_token,
        ));
        let engine = Engine::new(
            dp_size,
            config.max_running_prefills,
            config.cache_tokens,
            Arc::clone(&control),
            kv.clone(),
        );
        AppState(Arc::new(Shared {
            config: SimConfig { dp_size, ..config },
            engine,
            control,
            recorder: Recorder::default(),
            stats: Arc::new(Stats::new(dp_size)),
            rooms: Rooms::default(),
            client: reqwest::Client::new(),
            started: Instant::now(),
            kv,
            tokenizer,
        }))
    }

    /// `--disaggregation-timeout-ms` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.disaggregation_timeout_ms)
    }

    /// The DP ranks a request names, read as this worker's profile reads
    /// them (see [`crate::wire::ranks`]); a use of the deprecated
    /// `data_parallel_rank` on an upstream worker is counted.
    pub fn ranks(&self, body: &Body) -> Result<Ranks, ApiError> {
        let ranks = wire::ranks(
            self.config.wire_profile,
            self.config.disaggregation_mode,
            body,
        )?;
        if ranks.deprecated {
            tracing::debug!("'data_parallel_rank' is deprecated, use 'routed_dp_rank' instead.");
            self.stats.deprecated_dp_rank();
        }
        Ok(ranks)
    }

    /// The [`Handoff`]s of the `n` sequences of a generate-like `body`.
    pub fn handoffs(&self, body: &Body, n: usize, batch: bool) -> Result<Vec<Handoff>, ApiError> {
        crate::disagg::handoffs(
            self.config.disaggregation_mode,
            body,
            n,
            batch,
            self.config.disaggregation_bootstrap_port,
        )
    }

    /// Tokens a sequence asking for `max_new` generates here: a prefill
    /// worker stops after the first token, as SGLang's does.
    pub fn to_generate(&self, max_new: usize) -> usize {
        match self.config.disaggregation_mode {
            DisaggregationMode::Prefill => max_new.min(1),
            _ => max_new,
        }
    }

    /// Brings one sequence of a generate-like request to the point where it
    /// can decode: prefilled here, plus (on a prefill worker) its KV fetched
    /// by a decode worker, or (on a decode worker) fetched from the prefill
    /// worker. `ranks` is [`AppState::ranks`]; `max_new` is what
    /// [`AppState::to_generate`] says.
    pub async fn start_sequence(
        &self,
        record: Option<RecordId>,
        handoff: &Handoff,
        ranks: &Ranks,
        rid: &str,
        tokens: &[Token],
        max_new: usize,
    ) -> Result<Prefilled, ApiError> {
        let rank = handoff.rank(ranks.run, self.config.dp_size);
        match handoff {
            Handoff::Local => Ok(self.prefill(record, rank, tokens, max_new).await),
            Handoff::Publish { room } => {
                let rank = self.engine.pick_rank(rank);
                let conflict = wire::room_conflict(
                    self.config.wire_profile,
                    ranks,
                    rank,
                    *room,
                    self.config.dp_size,
                );
                if let Some(reason) = conflict {
                    self.stats.kv(KvEvent::Failed);
                    return Err(ApiError::KvTransfer(reason));
                }
                let p = self
                    .prefill(record, i64::try_from(rank).ok(), tokens, max_new)
                    .await;
                let kv = Kv {
                    bootstrap_room: *room,
                    rid: rid.to_string(),
                    prompt_hash: prompt_hash(tokens),
                    prompt_tokens: tokens.len(),
                    dp_rank: p.rank,
                };
                let published = self.rooms.publish(kv).map_err(|e| {
                    self.stats.kv(KvEvent::Failed);
                    ApiError::KvTransfer(e.to_string())
                })?;
                self.stats.kv(KvEvent::Published);
                tracing::debug!(room, rid, "KV published");
                if published.fetched(self.timeout()).await {
                    self.stats.kv(KvEvent::Fetched { rank: p.rank });
                    Ok(p)
                } else {
                    self.stats.kv(KvEvent::Failed);
                    Err(ApiError::KvTransfer(format!(
                        "bootstrap_room {room} was not fetched by a decode worker within {} ms",
                        self.config.disaggregation_timeout_ms
                    )))
                }
            }
            Handoff::Fetch { room, host, port } => {
                let admitted =
                    self.engine
                        .admit(self.engine.pick_rank(rank), tokens.len(), max_new);
                let at = bootstrap::Source {
                    host,
                    port: *port,
                    room: *room,
                    prefill_rank: ranks.prefill,
                };
                let fetched = bootstrap::fetch_remote(&self.client, &at, self.timeout())
                    .await
                    .and_then(|kv| check_kv(&kv, *room, tokens));
                if let Err(reason) = fetched {
                    self.stats.kv(KvEvent::Failed);
                    tracing::debug!(room, host, port, reason, "KV fetch failed");
                    return Err(ApiError::KvTransfer(format!(
                        "bootstrap_room {room}: {reason}"
                    )));
                }
                let p = admitted.start();
                self.stats.kv(KvEvent::Fetched { rank: p.rank });
                self.stats.prefilled(p.rank, p.prompt_tokens, 0);
                if let Some(id) = record {
                    self.recorder.note_prefill(id, p.rank, p.prompt_tokens, 0);
                }
                Ok(p)
            }
        }
    }

    /// A single prompt's tokens as SGLang computes them from the model's
    /// files (`--tokenizer-path`), for the request to `path` with the raw
    /// JSON `body`; `None` without the files, or for a prompt they cannot
    /// tokenize alone (a batch, an image), which the toy tokenizer takes.
    pub fn file_tokens(&self, path: &str, body: &[u8]) -> Option<Vec<Token>> {
        let prompt = self.tokenizer.as_ref()?.tokens(path, body).ok()?;
        Some(
            crate::tokens::Prompt::Ids(prompt.ids.iter().map(|&i| i64::from(i)).collect()).tokens(),
        )
    }

    /// Start of every inference request: counts it and applies an injected
    /// failure. The request is in flight while the returned guard lives.
    pub fn begin(&self, path: &str) -> Result<InFlight, ApiError> {
        let in_flight = self.stats.begin(path);
        if let Some(code) = self.control.get().fail_status {
            let status = axum::http::StatusCode::from_u16(code)
                .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
            tracing::debug!(path, code, "answering an injected failure");
            return Err(ApiError::Injected(status));
        }
        Ok(in_flight)
    }

    /// Runs the prefill of one sequence on the requested (or a round-robin)
    /// rank and accounts for it in the stats and in record `record`.
    pub async fn prefill(
        &self,
        record: Option<RecordId>,
        requested_rank: Option<i64>,
        tokens: &[Token],
        max_new: usize,
    ) -> Prefilled {
        let rank = self.engine.pick_rank(requested_rank);
        let done = self.engine.prefill(rank, tokens, max_new).await;
        self.stats
            .prefilled(done.rank, done.prompt_tokens, done.cached_tokens);
        if let Some(id) = record {
            self.recorder
                .note_prefill(id, done.rank, done.prompt_tokens, done.cached_tokens);
        }
        tracing::debug!(
            rank = done.rank,
            prompt_tokens = done.prompt_tokens,
            cached_tokens = done.cached_tokens,
            "prefilled"
        );
        done
    }
}

/// Checks that `kv`, fetched for `room`, is the KV of the prompt `tokens`.
fn check_kv(kv: &Kv, room: u64, tokens: &[Token]) -> Result<(), String> {
    if kv.bootstrap_room != room {
        return Err(format!(
            "the bootstrap server sent the KV of room {} instead",
            kv.bootstrap_room
        ));
    }
    if kv.prompt_hash != prompt_hash(tokens) || kv.prompt_tokens != tokens.len() {
        return Err(format!(
            "the KV (request {}, {} prompt tokens) is not the KV of this prompt ({} tokens)",
            kv.rid,
            kv.prompt_tokens,
            tokens.len()
        ));
    }
    Ok(())
}
