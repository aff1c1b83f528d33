//! Every parameter of the benchmarks, in one place. A full run
//! (`scripts/bench.sh`) uses [`Profile::full`]; `--quick` uses
//! [`Profile::quick`], a short smoke run whose numbers are not meant to be
//! quoted. Change a number here, not in the scripts.

use std::time::Duration;

/// Seed of every random choice (workload text, arrivals, users). Fixed so
/// that two runs send the same requests in the same order at the same times.
pub const SEED: u64 = 0x5eed_0e11_7000_0001;

/// The model every benchmark request names, and every benchmarked worker
/// serves (the simulated worker's default `--model-path`; the instant
/// worker's only model). smg routes by model and refuses a model no worker
/// serves, so the two must agree.
pub const MODEL: &str = "sim-model";

/// The first peer: sglang-router from PyPI, installed by `scripts/bench.sh`
/// into its own venv. Pinned so that results compare across runs.
pub const PEER_PACKAGE: &str = "sglang-router==0.3.2";

/// The second peer: smg (Shepherd Model Gateway), sglang-router's
/// successor, installed by `scripts/bench.sh` into a venv of its own.
pub const SMG_PACKAGE: &str = "smg==1.13.0";

/// A peer router: each is installed in its own venv and started with the
/// same fleet flags as this project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// sglang-router 0.3.2 ([`PEER_PACKAGE`]).
    SglangRouter,
    /// smg 1.13.0 ([`SMG_PACKAGE`]).
    Smg,
}

impl Peer {
    /// Name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Peer::SglangRouter => "sglang-router",
            Peer::Smg => "smg",
        }
    }
}

/// Who is benchmarked. Adding a contender is one line in [`OVERHEAD`] or
/// [`QUALITY`] (e.g. `Contender::ours("my_policy")` once the control plane
/// knows `--policy my_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contender {
    /// Straight to the worker, no router: the floor of scenario 1.
    Direct,
    /// Envoy from `envoy/envoy.yaml` without the wasm filter (workers from
    /// the control plane's EDS, Envoy's round robin): what any router inside
    /// Envoy pays before it decides anything.
    EnvoyAlone,
    /// A peer router with this `--policy`.
    Peer(Peer, &'static str),
    /// This project (control plane + Envoy with the wasm filter) with this
    /// `--policy`.
    Ours(&'static str),
    /// This project through Envoy's ext_proc filter instead of wasm
    /// (`envoy/envoy-ext-proc.yaml`) with this `--policy`.
    OursExtProc(&'static str),
}

impl Contender {
    /// This project with `policy`.
    pub const fn ours(policy: &'static str) -> Contender {
        Contender::Ours(policy)
    }

    /// The first peer, sglang-router, with `policy`: the reference of the
    /// goals that name one peer.
    pub const fn peer(policy: &'static str) -> Contender {
        Contender::Peer(Peer::SglangRouter, policy)
    }

    /// The second peer, smg, with `policy`.
    pub const fn smg(policy: &'static str) -> Contender {
        Contender::Peer(Peer::Smg, policy)
    }

    /// Name in tables: `direct`, `peer cache_aware` (sglang-router),
    /// `smg cache_aware`, `ours cache_aware`.
    pub fn label(&self) -> String {
        match self {
            Contender::Direct => "direct".into(),
            Contender::EnvoyAlone => "envoy alone (no filter)".into(),
            Contender::Peer(Peer::SglangRouter, p) => format!("peer {p}"),
            Contender::Peer(Peer::Smg, p) => format!("smg {p}"),
            Contender::Ours(p) => format!("ours {p}"),
            Contender::OursExtProc(p) => format!("ours ext_proc {p}"),
        }
    }
}

/// Scenario 1 contenders: the floors (the worker, Envoy with no filter),
/// both peers and this project, cache-aware.
pub const OVERHEAD: &[Contender] = &[
    Contender::Direct,
    Contender::EnvoyAlone,
    Contender::peer("cache_aware"),
    Contender::smg("cache_aware"),
    Contender::ours("cache_aware"),
    Contender::OursExtProc("cache_aware"),
];

/// Scenario 1's PD case: this project and both peers in prefill/decode
/// mode (one prefill and one decode simulated worker), in this order.
pub const PD: &[Contender] = &[
    Contender::peer("cache_aware"),
    Contender::smg("cache_aware"),
    Contender::ours("cache_aware"),
];

/// Scenario 2 contenders, run in every cell of the workload matrix
/// ([`crate::shapes`]) on fresh workers: this project's `cost_aware` and
/// every peer policy its goals compare against ([`quality_rivals`]): both
/// peers' policies that route a regular fleet. The first entry is the
/// reference of the "0.8x the peer's cache_aware" goal.
pub const QUALITY: &[Contender] = &[
    Contender::peer("cache_aware"),
    Contender::ours("cost_aware"),
    Contender::peer("round_robin"),
    Contender::peer("power_of_two"),
    Contender::smg("cache_aware"),
    Contender::smg("round_robin"),
    Contender::smg("power_of_two"),
    Contender::smg("least_load"),
    Contender::smg("prefix_hash"),
    Contender::smg("consistent_hashing"),
];

/// The policy scenario 2's goals are about: this project's shipped
/// `cost_aware` (no flags of its own).
pub const QUALITY_OURS: Contender = Contender::ours("cost_aware");

/// The peer policies [`QUALITY_OURS`] must beat in every shape: its goals
/// compare it with the best of these, of either peer (every peer entry of
/// [`QUALITY`]).
pub fn quality_rivals() -> impl Iterator<Item = Contender> {
    QUALITY
        .iter()
        .copied()
        .filter(|c| matches!(c, Contender::Peer(..)))
}

/// Candidates for tuning `cost_aware`, not in the matrix: `--only` runs
/// those it names (`--only "ours cost_aware"` runs them beside the shipped
/// one). A policy may carry flags of its own, as this one does: the
/// shipped policy blind to the workers' load reports (routing on the
/// router's own counts only, as before they were read).
pub const QUALITY_CANDIDATES: &[Contender] = &[
    Contender::ours("cost_aware --disable-load-monitoring"),
    // Its tree alone where workers publish KV events ("drifting caches").
    Contender::ours("cost_aware --disable-kv-events"),
    // Without the spill gate: priced by work alone.
    Contender::ours("cost_aware --cost-spill-gate false"),
    // The prefill under way counted in full until its report.
    Contender::ours("cost_aware --cost-prefill-progress false"),
];

/// Seeds of scenario 2: every cell runs once per seed (workload text,
/// arrivals and users all change with it), and the report shows the mean
/// and the spread over them. `cost_aware` and its parameters were tuned on
/// these seeds (in-sample): its goals on them are not a test of how it
/// does on workloads it was not fitted to; [`QUALITY_HELD_OUT_SEEDS`] are.
pub const QUALITY_SEEDS: &[u64] = &[SEED, SEED + 1, SEED + 2];

/// Held-out seeds of scenario 2: never used while tuning `cost_aware` or
/// its parameters (they were added after its weights were fixed, and are
/// far from [`QUALITY_SEEDS`]). Every shape runs them after its in-sample
/// seeds, but only for [`QUALITY_OURS`], the peer's `cache_aware` and
/// `round_robin` and any peer policy with the best mean TTFT p50 or p95 on
/// that shape's in-sample seeds ([`crate::quality::held_out_contenders`]);
/// tuning candidates ([`QUALITY_CANDIDATES`]) never run them. The report
/// shows them beside the in-sample seeds, with goals of their own.
///
/// Do not tune on them: once a result on these seeds has chosen a policy
/// or a weight, they are in-sample; move them to [`QUALITY_SEEDS`] and pick
/// new ones.
pub const QUALITY_HELD_OUT_SEEDS: &[u64] = &[0x4e1d_0075_0000_0001, 0x4e1d_0075_0000_0002];

/// Seeds of the replicas scenario: scenario 2's, then more. Nothing is
/// tuned on them; there are more because a seed's decision p99 rests on
/// its few slowest decisions (about 7 of 700 at 1 replica), and the same
/// setup's p99 was 69 us with one seed and 152 us with the next
/// (docs/benchmarks.md, "Several control planes"): the goal is judged on
/// the median seed's, which one machine hiccup does not move.
pub const REPLICAS_SEEDS: &[u64] = &[SEED, SEED + 1, SEED + 2, SEED + 3, SEED + 4];

/// Scenario 1: router overhead in front of a worker that answers at once
/// (`bench-instant-worker`: reads the body, answers a fixed completion).
#[derive(Debug, Clone)]
pub struct OverheadParams {
    /// Closed-loop clients, each sending its next request when the last
    /// answer is read.
    pub concurrency: Vec<usize>,
    /// Approximate sizes of the chat bodies, in bytes.
    pub body_bytes: Vec<usize>,
    /// Requests before measuring (connections, trees and caches warm up).
    pub warmup: Duration,
    /// Measured time per cell.
    pub measure: Duration,
    /// Every cell runs each contender this many times, in alternating order
    /// (A B C, C B A, ...); the table shows the round whose req/s is the
    /// nearest-rank median, which of two rounds is the slower one.
    pub rounds: usize,
    /// `max_tokens` of each request (the worker answers at once anyway).
    pub max_tokens: u32,
    /// Distinct bodies per size; clients cycle through them so that the
    /// cache-aware trees see new text, not one prompt over and over.
    pub distinct_bodies: usize,
    /// The streaming case: the same contenders, streamed chat completions
    /// answered with SSE.
    pub stream: StreamParams,
    /// The PD case: prefill/decode mode on simulated workers.
    pub pd: PdParams,
}

/// Scenario 1's streaming case: `bench-instant-worker` answers a
/// `"stream": true` request with `chunks` chat-completion chunk events,
/// written one by one as fast as the connection takes them, then
/// `data: [DONE]`. Warm-up, measured time and rounds are the overhead
/// cells'.
#[derive(Debug, Clone)]
pub struct StreamParams {
    /// Closed-loop clients, each reading its stream to `[DONE]` before
    /// sending the next request.
    pub concurrency: usize,
    /// Chunk events per answer (the worker's `--sse-chunks`).
    pub chunks: usize,
    /// Approximate size of the request bodies.
    pub body_bytes: usize,
}

/// Scenario 1's PD case: this project in prefill/decode mode against the
/// peer's `--pd-disaggregation`, in front of one prefill and one decode
/// simulated worker (`sglang-sim-worker`, which hands the KV over through
/// its bootstrap port); a closed loop of small non-streamed chat
/// completions. Warm-up, measured time and rounds are the overhead cells'.
#[derive(Debug, Clone)]
pub struct PdParams {
    /// Closed-loop clients.
    pub concurrency: usize,
    /// Approximate size of the request bodies.
    pub body_bytes: usize,
    /// `max_tokens` of each request.
    pub max_tokens: u32,
    /// Simulated prefill time per uncached prompt token.
    pub prefill_us_per_token: u64,
    /// Simulated time per generated token.
    pub decode_us_per_token: u64,
    /// How long a prefill waits for the decode to fetch its KV (and the
    /// decode for the KV), in milliseconds.
    pub kv_timeout_ms: u64,
}

impl PdParams {
    /// Flags of both simulated workers (the role flags come on top).
    pub fn sim_args(&self) -> Vec<String> {
        vec![
            "--prefill-us-per-token".into(),
            self.prefill_us_per_token.to_string(),
            "--decode-us-per-token".into(),
            self.decode_us_per_token.to_string(),
            "--disaggregation-timeout-ms".into(),
            self.kv_timeout_ms.to_string(),
            // Health checks answer at once (the routers' probes at start).
            "--health-delay-ms".into(),
            "0".into(),
            "--log-level".into(),
            "warn".into(),
        ]
    }
}

/// Scenario 2: routing quality on a multi-turn chat workload. These are
/// the base shape's numbers ("many groups"); [`crate::shapes::matrix`]
/// derives every other shape from them.
///
/// Sizing (the simulator's toy tokenizer makes 4 characters one token):
/// a system prompt is 6000 chars = 1500 tokens = 0.6 s of prefill at
/// 400 us/token; a new turn (user message + the previous assistant answer +
/// role tags) is ~650 chars = ~165 tokens = ~66 ms when the history is
/// cached. A conversation reaches ~6000 + 6 x 650 chars = ~2500 tokens.
/// With perfect affinity each worker's working set is its groups' system
/// prompts plus its active users' histories (~15k tokens), which fits the
/// 20k-token cache; spreading every user over every worker needs ~4x that,
/// which does not. At 36 requests/s (`rate`) and ~66 ms of prefill each,
/// 4 workers are ~60% busy prefilling with perfect caching; misses add to
/// that (docs/benchmarks.md, column "busy"). Decoding is not counted: the
/// simulator decodes any number of requests at once.
#[derive(Debug, Clone)]
pub struct QualityParams {
    /// Simulated workers.
    pub workers: usize,
    /// Distinct long system prompts, each shared by a group of users; 0
    /// gives every user a system prompt of their own (nothing is shared).
    pub system_prompts: usize,
    /// Characters of each system prompt.
    pub system_prompt_chars: usize,
    /// Users in conversation at any time; a user who has had all their
    /// turns is replaced by a new one (in a random group).
    pub active_users: usize,
    /// Turns of each conversation.
    pub turns_per_user: usize,
    /// Characters of a user message (uniform in this range).
    pub user_message_chars: (usize, usize),
    /// Characters of the assistant answer kept in the history.
    pub assistant_chars: usize,
    /// A user's next turn comes at least this long after their last one.
    pub min_think: Duration,
    /// Mean Poisson arrival rate, requests per second.
    pub rate: f64,
    /// How arrivals are spread in time.
    pub arrivals: Arrivals,
    /// Arrivals are generated for this long.
    pub duration: Duration,
    /// After the last arrival, requests still running get this long to end;
    /// then they are cut and counted as unfinished.
    pub drain: Duration,
    /// `max_tokens` of each request.
    pub max_tokens: u32,
    /// Simulated prefill time per uncached prompt token.
    pub prefill_us_per_token: u64,
    /// Simulated time per generated token.
    pub decode_us_per_token: u64,
    /// Prefix-cache capacity per worker (per DP rank), in tokens (LRU
    /// eviction).
    pub cache_tokens: usize,
    /// Prefills a worker (a DP rank) runs at once; the others queue. Each
    /// runs at full speed, so 4 is a worker with 4 times the prefill
    /// throughput, not a batch.
    pub max_running_prefills: usize,
    /// Data-parallel ranks per worker (routers run `--dp-aware` above 1).
    pub dp_size: usize,
    /// The first worker's prefill and decode take this many times longer
    /// (1: every worker is the same).
    pub slow_first_worker: u64,
    /// Prefill/decode disaggregation: `(prefill workers, decode workers)`
    /// instead of `workers` regular ones.
    pub pd: Option<(usize, usize)>,
    /// Independent router stacks in front of the one fleet, each sent the
    /// conversations of its share of the users (user id modulo this): a
    /// fleet shared with traffic each router cannot see.
    pub routers: usize,
    /// Workers publish KV events and tokenize with the fixture model's
    /// files ([`kv_model_dir`]); this project's routers get the same files
    /// and route on the events.
    pub kv_events: bool,
    /// The first worker's cache is flushed this long after the first
    /// arrival (what a restart does to it: the tree does not know).
    pub flush_first_worker_at: Option<Duration>,
    /// How many of [`QUALITY_SEEDS`] each cell runs with.
    pub seeds: usize,
    /// How many of [`QUALITY_HELD_OUT_SEEDS`] each shape runs with (0:
    /// none), for the contenders that run them.
    pub held_out_seeds: usize,
}

/// How the arrivals of scenario 2 are spread in time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Poisson at the mean rate.
    Poisson,
    /// Poisson during `on`, nothing during `off`, at the same mean rate
    /// overall (so `(on + off) / on` times the rate while on).
    Bursts {
        /// Length of a burst.
        on: Duration,
        /// Quiet time after each burst.
        off: Duration,
    },
}

impl QualityParams {
    /// Flags of simulated worker `i` (of the regular workers, or of the
    /// prefill and then the decode workers in PD mode; the role flags come
    /// on top).
    pub fn sim_args(&self, i: usize) -> Vec<String> {
        let slow = if i == 0 {
            self.slow_first_worker.max(1)
        } else {
            1
        };
        let mut args = vec![
            "--prefill-us-per-token".into(),
            (self.prefill_us_per_token * slow).to_string(),
            "--decode-us-per-token".into(),
            (self.decode_us_per_token * slow).to_string(),
            "--max-running-prefills".into(),
            self.max_running_prefills.to_string(),
            "--cache-tokens".into(),
            self.cache_tokens.to_string(),
            // The cache hit ratio is read from the workers' own counters;
            // the report also shows what clients see in their usage, which
            // SGLang fills only with this flag.
            "--enable-cache-report".into(),
            "--log-level".into(),
            "warn".into(),
        ];
        if self.dp_size > 1 {
            // SGLang before 0.5.10 reads `data_parallel_rank`, which both
            // routers send; later versions read another field that the
            // peer (0.3.2) does not know, which would make its DP-aware
            // routing look worse than it is.
            args.extend([
                "--dp-size".into(),
                self.dp_size.to_string(),
                "--wire-profile".into(),
                "seeds".into(),
            ]);
        }
        if self.pd.is_some() {
            args.extend(["--disaggregation-timeout-ms".into(), "10000".into()]);
        }
        if self.kv_events {
            args.extend([
                "--kv-events-config".into(),
                KV_EVENTS_CONFIG.into(),
                "--tokenizer-path".into(),
                kv_model_dir().display().to_string(),
            ]);
        }
        args
    }
}

/// The simulated workers' `--kv-events-config` in shapes with KV events:
/// publishers and replay on free ports, advertised in `/server_info`.
pub const KV_EVENTS_CONFIG: &str =
    r#"{"publisher":"zmq","endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0","topic":"kv"}"#;

/// Where the fixture model's tokenizer files are written for shapes with
/// KV events (the workers and this project's routers read them).
pub fn kv_model_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("sglang-bench-model-{}", std::process::id()))
}

/// Scenario "replicas" (issue 28, several control planes, all active):
/// this project's `cost_aware` behind one Envoy whose
/// `sglang_control_plane` cluster lists 1, 2 or 3 control planes
/// ([`crate::replicas::SETUPS`]), on shapes of scenario 2. Run only when asked
/// (`--scenarios replicas`): it adds about 35 minutes and needs no peer.
#[derive(Debug, Clone)]
pub struct ReplicasParams {
    /// Scenario 2's shapes it runs ([`crate::shapes::matrix`] names).
    pub shapes: Vec<&'static str>,
    /// How many of [`REPLICAS_SEEDS`] each setup runs with (the same seeds
    /// for every setup).
    pub seeds: usize,
    /// Envoy's `--concurrency`, the same for every setup: one filter VM per
    /// worker thread, each holding its session to one control plane, so
    /// that with more VMs than control planes every one gets some.
    pub envoy_concurrency: usize,
}

/// Scenario 3: the decision engine in-process (criterion benches and the
/// `bench-engine` helper).
#[derive(Debug, Clone)]
pub struct EngineParams {
    /// Prompt sizes in bytes.
    pub prompt_bytes: Vec<usize>,
    /// Registered healthy workers.
    pub workers: Vec<usize>,
    /// Text routed into the tree per worker before measuring.
    pub fill_chars_per_worker: usize,
    /// Cap on the text routed in total (keeps 256 workers within memory and
    /// time on a small machine); the per-worker fill is lowered to fit.
    pub fill_chars_total_max: usize,
    /// Individually timed decisions per cell (for p50/p99).
    pub timed_decisions: usize,
}

/// Shape of the documents the engine benches fill the tree with: a shared
/// system prompt followed by a conversation of its own, long enough that
/// the largest prompt is a prefix of one.
pub mod engine_docs {
    /// Distinct system prompts.
    pub const SYSTEM_PROMPTS: usize = 16;
    /// Characters of each system prompt. Below 30% of a document, so that
    /// filling spreads documents over workers instead of following the match.
    pub const SYSTEM_PROMPT_CHARS: usize = 4096;
    /// Characters of a whole document.
    pub const DOC_CHARS: usize = 40 * 1024;
    /// Characters that differ per measured prompt at its end (a new turn);
    /// at most an eighth of the prompt.
    pub const MAX_NEW_TAIL: usize = 256;
}

/// All scenarios' parameters.
#[derive(Debug, Clone)]
pub struct Profile {
    /// Scenario 1.
    pub overhead: OverheadParams,
    /// Scenario 2.
    pub quality: QualityParams,
    /// Scenario 3.
    pub engine: EngineParams,
    /// Several control planes.
    pub replicas: ReplicasParams,
}

impl Profile {
    /// The documented run.
    pub fn full() -> Profile {
        Profile {
            overhead: OverheadParams {
                concurrency: vec![1, 16, 64],
                body_bytes: vec![1024, 16 * 1024],
                warmup: Duration::from_millis(1000),
                measure: Duration::from_secs(4),
                rounds: 2,
                max_tokens: 8,
                distinct_bodies: 512,
                stream: StreamParams {
                    concurrency: 4,
                    chunks: 1000,
                    body_bytes: 1024,
                },
                pd: PdParams {
                    concurrency: 16,
                    body_bytes: 1024,
                    max_tokens: 8,
                    prefill_us_per_token: 1,
                    decode_us_per_token: 100,
                    kv_timeout_ms: 3000,
                },
            },
            quality: QualityParams {
                workers: 4,
                system_prompts: 6,
                system_prompt_chars: 6000,
                active_users: 64,
                turns_per_user: 6,
                user_message_chars: (300, 600),
                assistant_chars: 200,
                min_think: Duration::from_secs(1),
                rate: 36.0,
                duration: Duration::from_secs(20),
                drain: Duration::from_secs(15),
                max_tokens: 16,
                arrivals: Arrivals::Poisson,
                prefill_us_per_token: 400,
                decode_us_per_token: 20_000,
                cache_tokens: 20_000,
                max_running_prefills: 1,
                dp_size: 1,
                slow_first_worker: 1,
                pd: None,
                routers: 1,
                kv_events: false,
                flush_first_worker_at: None,
                seeds: QUALITY_SEEDS.len(),
                held_out_seeds: QUALITY_HELD_OUT_SEEDS.len(),
            },
            engine: EngineParams {
                prompt_bytes: vec![256, 4096, 32 * 1024],
                workers: vec![8, 64, 256],
                fill_chars_per_worker: 1 << 20,
                fill_chars_total_max: 256 << 20,
                timed_decisions: 20_000,
            },
            replicas: ReplicasParams {
                shapes: vec!["many groups", "few hot"],
                seeds: REPLICAS_SEEDS.len(),
                envoy_concurrency: 4,
            },
        }
    }

    /// A smoke run of a minute or two: same shapes, shorter and smaller.
    pub fn quick() -> Profile {
        let mut p = Profile::full();
        p.overhead.warmup = Duration::from_millis(300);
        p.overhead.measure = Duration::from_secs(1);
        p.overhead.rounds = 1;
        p.quality.duration = Duration::from_secs(6);
        p.quality.drain = Duration::from_secs(8);
        p.quality.seeds = 1;
        p.quality.held_out_seeds = 1;
        p.engine.fill_chars_per_worker = 64 << 10;
        p.engine.timed_decisions = 2_000;
        p.replicas.seeds = 1;
        p
    }

    /// [`Profile::quick`] when `quick`, else [`Profile::full`].
    pub fn select(quick: bool) -> Profile {
        if quick {
            Profile::quick()
        } else {
            Profile::full()
        }
    }
}

/// Environment variable selecting the quick profile in the criterion benches
/// (which take no custom flags): `SGLANG_BENCH_QUICK=1`.
pub const QUICK_ENV: &str = "SGLANG_BENCH_QUICK";

/// The profile the criterion benches and `bench-engine` use, from
/// [`QUICK_ENV`].
pub fn profile_from_env() -> Profile {
    let quick = std::env::var(QUICK_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    Profile::select(quick)
}
