//! Configuration and the state shared by all handlers.

use std::ops::Deref;
use std::sync::Arc;

use crate::control::Control;
use crate::engine::{Engine, Prefilled};
use crate::error::ApiError;
use crate::record::{RecordId, Recorder};
use crate::stats::{InFlight, Stats};
use crate::tokens::Token;

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
}

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
        }
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
}

impl Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// Fresh state for `config`.
    pub fn new(config: SimConfig) -> AppState {
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
        );
        AppState(Arc::new(Shared {
            config: SimConfig { dp_size, ..config },
            engine,
            control,
            recorder: Recorder::default(),
            stats: Arc::new(Stats::new(dp_size)),
        }))
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
