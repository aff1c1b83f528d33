//! The workload matrix of scenario 2: each shape is the base workload of
//! [`QualityParams`] with one thing changed, chosen because some routing
//! policy does well or badly on it. Every contender runs every shape with
//! every seed of [`crate::params::QUALITY_SEEDS`], and some of them with the
//! held-out seeds ([`crate::params::QUALITY_HELD_OUT_SEEDS`]).

use std::time::Duration;

use crate::params::{Arrivals, QualityParams};

/// One workload shape.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Short name, as in the report's tables.
    pub name: &'static str,
    /// What changes from the base shape and why it matters.
    pub what: &'static str,
    /// Whether prompts share prefixes (the "0.8x the peer's cache_aware
    /// TTFT p95" goal applies only then: without sharing there is no cache
    /// to be aware of).
    pub shared: bool,
    /// Its parameters.
    pub params: QualityParams,
}

/// The matrix, derived from `base` (the "many groups" shape).
pub fn matrix(base: &QualityParams) -> Vec<Shape> {
    let with = |f: &dyn Fn(&mut QualityParams)| {
        let mut p = base.clone();
        f(&mut p);
        p
    };
    vec![
        Shape {
            name: "many groups",
            what: "6 system prompts of 6000 chars on 4 workers (more hot prefixes than workers)",
            shared: true,
            params: base.clone(),
        },
        Shape {
            name: "few hot",
            what: "2 system prompts on 4 workers (fewer hot prefixes than workers), 128 users x 4 turns, 0.3 s think time",
            shared: true,
            params: with(&|p| {
                p.system_prompts = 2;
                p.active_users = 128;
                p.turns_per_user = 4;
                p.min_think = Duration::from_millis(300);
            }),
        },
        Shape {
            name: "no sharing",
            // 1200 + ~450 chars = ~410 tokens = ~165 ms of prefill; 14/s
            // keeps 4 workers ~58% busy.
            what: "every request a new user with a system prompt of its own (1200 chars): routing can only balance; 14 req/s",
            shared: false,
            params: with(&|p| {
                p.system_prompts = 0;
                p.system_prompt_chars = 1200;
                p.turns_per_user = 1;
                p.rate = 14.0;
            }),
        },
        Shape {
            name: "two routers",
            what: "two independent router stacks in front of the 4 workers, each sent half of the users (a fleet shared with traffic each router cannot see)",
            shared: true,
            params: with(&|p| p.routers = 2),
        },
        Shape {
            // The byte-level BPE makes about 1 token a byte (the toy
            // tokenizer 4 bytes): 100 us a token keeps prefill times
            // those of the base shape; 24k tokens hold about 4 system
            // prompts, so the caches evict all the time. At 24 req/s
            // every router overloaded it (busy 124-172%, TTFT p95 over
            // 10 s): 12 req/s is what 4 workers carry at a hit ratio of
            // about 0.6.
            name: "drifting caches",
            what: "workers publish KV events and tokenize with a byte-level BPE (100 us a token): 12 system prompts of 6000 chars, a 24k-token cache per worker (about 4 of them), the first worker's cache flushed 10 s in (a restart); this project routes on the events (`cost_aware --disable-kv-events`: its tree alone); 12 req/s",
            shared: true,
            params: drifting(base, 1),
        },
        Shape {
            name: "drifting, two routers",
            what: "\"drifting caches\" behind two independent router stacks, each sent half of the users: each router's tree sees half the traffic, the events all of it",
            shared: true,
            params: drifting(base, 2),
        },
        Shape {
            name: "slow worker",
            what: "the first worker 3x slower at prefill and decode (the fleet has ~3.3 workers' capacity)",
            shared: true,
            params: with(&|p| p.slow_first_worker = 3),
        },
        Shape {
            name: "bursts",
            what: "arrivals in 1 s bursts every 3 s, at the same mean rate (3x the rate while on)",
            shared: true,
            params: with(&|p| {
                p.arrivals = Arrivals::Bursts {
                    on: Duration::from_secs(1),
                    off: Duration::from_secs(2),
                }
            }),
        },
        Shape {
            // 32 KB = 8192 tokens = 0.82 s of prefill at 100 us/token; a
            // 32k-token cache holds under 4 of the 6 with their histories.
            name: "long prompts",
            what: "6 system prompts of 32 KB, a 32k-token cache per worker (under 4 of them), 100 us per token, 16 req/s",
            shared: true,
            params: with(&|p| {
                p.system_prompt_chars = 32 * 1024;
                p.cache_tokens = 32_000;
                p.prefill_us_per_token = 100;
                p.rate = 16.0;
            }),
        },
        Shape {
            name: "DP",
            what: "2 workers x 4 DP ranks (each rank its own cache and prefill queue), routers `--dp-aware`, 60 req/s",
            shared: true,
            params: with(&|p| {
                p.workers = 2;
                p.dp_size = 4;
                p.rate = 60.0;
            }),
        },
        Shape {
            name: "PD",
            what: "2 prefill + 2 decode workers, the policy under test as `--prefill-policy` (decode round_robin for all), 18 req/s",
            shared: true,
            params: with(&|p| {
                p.pd = Some((2, 2));
                p.rate = 18.0;
            }),
        },
        Shape {
            name: "4 prefills",
            what: "each worker runs 4 prefills at once (the one-prefill-at-a-time assumption loosened), 72 req/s",
            shared: true,
            params: with(&|p| {
                p.max_running_prefills = 4;
                p.rate = 72.0;
            }),
        },
    ]
}

/// The "drifting caches" shapes, behind `routers` router stacks.
fn drifting(base: &QualityParams, routers: usize) -> QualityParams {
    let mut p = base.clone();
    p.kv_events = true;
    p.system_prompts = 12;
    p.prefill_us_per_token = 100;
    p.cache_tokens = 24_000;
    p.flush_first_worker_at = Some(Duration::from_secs(10));
    p.rate = 12.0;
    p.routers = routers;
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Profile;

    #[test]
    fn shapes_have_distinct_names_and_differ_from_the_base() {
        let base = Profile::full().quality;
        let m = matrix(&base);
        let mut names: Vec<_> = m.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), m.len());
        for s in &m[1..] {
            assert_ne!(format!("{:?}", s.params), format!("{base:?}"), "{}", s.name);
        }
    }
}
