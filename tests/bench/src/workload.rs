//! The workloads: deterministic text, the chat bodies of scenario 1, the
//! multi-turn schedule of scenario 2, and the documents and prompts of the
//! engine benches. Everything is derived from a seed.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::params::{engine_docs, Arrivals, QualityParams};

/// Words the generated text is made of: a small vocabulary gives text the
/// shared substrings (and so the branching) of natural language.
const WORDS: &[&str] = &[
    "the",
    "router",
    "sends",
    "each",
    "request",
    "to",
    "a",
    "worker",
    "that",
    "holds",
    "prefix",
    "cache",
    "of",
    "prompt",
    "and",
    "tokens",
    "model",
    "answer",
    "user",
    "system",
    "assistant",
    "question",
    "about",
    "data",
    "from",
    "latency",
    "queue",
    "batch",
    "memory",
    "gpu",
    "kernel",
    "attention",
    "layer",
    "weights",
    "context",
    "window",
    "stream",
    "chunk",
    "time",
    "first",
    "token",
    "decode",
    "prefill",
    "load",
    "balance",
    "policy",
    "tree",
    "radix",
    "match",
    "longest",
    "shared",
    "history",
    "turn",
    "conversation",
    "please",
    "explain",
    "why",
    "how",
    "what",
    "when",
    "is",
    "are",
    "can",
    "you",
];

/// Deterministic English-looking text of exactly `chars` ASCII characters.
pub fn text(rng: &mut StdRng, chars: usize) -> String {
    let mut out = String::with_capacity(chars + 16);
    while out.len() < chars {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    out.truncate(chars);
    out
}

/// A chat body as a client sends it.
fn chat_body(messages: &[Value], max_tokens: u32, stream: bool) -> Vec<u8> {
    let mut body = json!({
        "model": crate::params::MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    // Serialising a Value cannot fail.
    serde_json::to_vec(&body).unwrap_or_default()
}

/// Scenario 1 bodies: `count` distinct non-streamed chat bodies of about
/// `bytes` bytes each. They share a system prompt (half the body) and differ
/// in the user message, so the cache-aware trees both match and grow.
pub fn overhead_bodies(seed: u64, bytes: usize, count: usize, max_tokens: u32) -> Vec<Vec<u8>> {
    chat_bodies(seed, bytes, count, max_tokens, false)
}

/// The bodies of [`overhead_bodies`] with `"stream": true` (and usage
/// asked for): the streaming case of scenario 1.
pub fn stream_bodies(seed: u64, bytes: usize, count: usize, max_tokens: u32) -> Vec<Vec<u8>> {
    chat_bodies(seed, bytes, count, max_tokens, true)
}

fn chat_bodies(
    seed: u64,
    bytes: usize,
    count: usize,
    max_tokens: u32,
    stream: bool,
) -> Vec<Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(seed ^ bytes as u64);
    // JSON framing of the body below is ~150 bytes.
    let payload = bytes.saturating_sub(150).max(64);
    let system = text(&mut rng, payload / 2);
    (0..count)
        .map(|i| {
            let user = format!(
                "request {i}: {}",
                text(&mut rng, payload - payload / 2 - 16)
            );
            chat_body(
                &[
                    json!({"role": "system", "content": system}),
                    json!({"role": "user", "content": user}),
                ],
                max_tokens,
                stream,
            )
        })
        .collect()
}

/// One request of the scenario 2 schedule.
#[derive(Debug, Clone)]
pub struct Scheduled {
    /// When to send it, from the start of the run.
    pub at: Duration,
    /// The user (conversation) it belongs to.
    pub user: usize,
    /// Its turn in the conversation, from 0.
    pub turn: usize,
    /// The streamed chat body.
    pub body: Vec<u8>,
}

struct User {
    id: usize,
    history: Vec<Value>,
    turns: usize,
    last: Option<Duration>,
}

/// The scenario 2 schedule: Poisson arrivals at `p.rate` for `p.duration`
/// (in bursts when `p.arrivals` says so); each arrival is the next turn of
/// one of `p.active_users` conversations (one whose last turn is at least
/// `p.min_think` old, chosen at random; the longest idle one when none is).
/// A conversation is its group's system prompt (or one of its own when
/// `p.system_prompts` is 0), then user/assistant turns growing by one user
/// message and one answer per turn. The assistant answers in the history are
/// generated here, not read from the workers, so that the schedule does not
/// depend on them.
pub fn conversation_schedule(p: &QualityParams, seed: u64) -> Vec<Scheduled> {
    let mut rng = StdRng::seed_from_u64(seed);
    let system_text = |rng: &mut StdRng, name: String| {
        let t = text(rng, p.system_prompt_chars.saturating_sub(40));
        format!("You are assistant {name} of the team. {t}")
    };
    let systems: Vec<String> = (0..p.system_prompts)
        .map(|g| system_text(&mut rng, format!("number {g}")))
        .collect();
    let mut next_id = 0;
    let mut new_user = |rng: &mut StdRng| {
        let id = next_id;
        next_id += 1;
        let system = if systems.is_empty() {
            system_text(rng, format!("of user {id}"))
        } else {
            systems[rng.random_range(0..systems.len())].clone()
        };
        User {
            id,
            history: vec![json!({"role": "system", "content": system})],
            turns: 0,
            last: None,
        }
    };
    let mut users: Vec<User> = (0..p.active_users.max(1))
        .map(|_| new_user(&mut rng))
        .collect();

    // Arrivals are drawn in "active" time, where they are Poisson at
    // `active_rate`, then laid onto the wall clock: with bursts, each `on`
    // of active time is followed by `off` of nothing.
    let (on, off) = match p.arrivals {
        Arrivals::Poisson => (f64::INFINITY, 0.0),
        Arrivals::Bursts { on, off } => (on.as_secs_f64().max(1e-3), off.as_secs_f64()),
    };
    let active_rate = if on.is_finite() {
        p.rate * (on + off) / on
    } else {
        p.rate
    };
    let mut out = Vec::new();
    let mut active = 0.0f64;
    loop {
        // Exponential inter-arrival times: -ln(U) / rate, U in (0, 1].
        let u: f64 = 1.0 - rng.random::<f64>();
        active += -u.ln() / active_rate;
        let t = if on.is_finite() {
            (active / on).floor() * (on + off) + active % on
        } else {
            active
        };
        let at = Duration::from_secs_f64(t);
        if at >= p.duration {
            break;
        }
        let ready: Vec<usize> = (0..users.len())
            .filter(|&i| users[i].last.is_none_or(|l| at >= l + p.min_think))
            .collect();
        let i = if ready.is_empty() {
            (0..users.len()).min_by_key(|&i| users[i].last).unwrap_or(0)
        } else {
            ready[rng.random_range(0..ready.len())]
        };
        let user = &mut users[i];
        let (lo, hi) = p.user_message_chars;
        let chars = rng.random_range(lo..=hi.max(lo));
        let message = format!(
            "[user {} turn {}] {}",
            user.id,
            user.turns,
            text(&mut rng, chars)
        );
        user.history
            .push(json!({"role": "user", "content": message}));
        out.push(Scheduled {
            at,
            user: user.id,
            turn: user.turns,
            body: chat_body(&user.history, p.max_tokens, true),
        });
        let answer = text(&mut rng, p.assistant_chars);
        user.history
            .push(json!({"role": "assistant", "content": answer}));
        user.turns += 1;
        user.last = Some(at);
        if user.turns >= p.turns_per_user {
            users[i] = new_user(&mut rng);
        }
    }
    out
}

/// Documents for filling the engine benches' trees: a shared system prompt
/// (one of [`engine_docs::SYSTEM_PROMPTS`]) and a conversation of its own, of
/// [`engine_docs::DOC_CHARS`] in all. Document `i` is the same in every run.
pub struct Documents {
    systems: Vec<String>,
    seed: u64,
}

impl Documents {
    /// The document set of `seed`.
    pub fn new(seed: u64) -> Documents {
        let mut rng = StdRng::seed_from_u64(seed);
        let systems = (0..engine_docs::SYSTEM_PROMPTS)
            .map(|g| {
                let t = text(&mut rng, engine_docs::SYSTEM_PROMPT_CHARS - 32);
                format!("<|system|>\nassistant {g:04}: {t}")
            })
            .collect();
        Documents { systems, seed }
    }

    /// Document `i`.
    pub fn doc(&self, i: usize) -> Vec<u8> {
        let mut rng = StdRng::seed_from_u64(self.seed ^ (i as u64).wrapping_mul(0x9e37_79b9));
        let system = &self.systems[i % self.systems.len()];
        let mut d = String::with_capacity(engine_docs::DOC_CHARS);
        d.push_str(system);
        d.push_str(&format!("\n<|user|>\nconversation {i}: "));
        d.push_str(&text(
            &mut rng,
            engine_docs::DOC_CHARS.saturating_sub(d.len()),
        ));
        d.into_bytes()
    }
}

/// Prompts of a fixed size for the engine benches: the first bytes of a
/// stored document (a conversation the tree has seen) with a new last turn
/// that differs every time, as when a user sends the next message.
pub struct Prompts {
    bases: Vec<Vec<u8>>,
    size: usize,
    counter: u64,
}

impl Prompts {
    /// Prompts of `size` bytes over documents `0..stored` of `docs`.
    pub fn new(docs: &Documents, stored: usize, size: usize) -> Prompts {
        let tail = (size / 8).min(engine_docs::MAX_NEW_TAIL);
        let keep = size - tail;
        let bases = (0..64.min(stored.max(1)))
            .map(|k| {
                // Spread over the stored documents.
                let i = k * stored.max(1) / 64.min(stored.max(1));
                let mut d = docs.doc(i);
                d.truncate(keep);
                d
            })
            .collect();
        Prompts {
            bases,
            size,
            counter: 0,
        }
    }

    /// The next prompt.
    pub fn next_prompt(&mut self) -> Vec<u8> {
        let n = self.counter;
        self.counter += 1;
        let base = &self.bases[(n as usize) % self.bases.len()];
        let mut p = Vec::with_capacity(self.size);
        p.extend_from_slice(base);
        let mut x = n.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
        while p.len() < self.size {
            // A varying, printable tail: new text the tree has not seen.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            p.push(b'a' + (x % 26) as u8);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Profile;

    #[test]
    fn schedule_is_reproducible_and_grows_conversations() {
        let mut q = Profile::quick().quality;
        q.duration = Duration::from_secs(5);
        let a = conversation_schedule(&q, 7);
        let b = conversation_schedule(&q, 7);
        assert_eq!(a.len(), b.len());
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| x.body == y.body && x.at == y.at));
        let rate = a.len() as f64 / 5.0;
        assert!((rate - q.rate).abs() < q.rate * 0.5, "rate {rate}");
        // A later turn of a user extends the earlier one's messages.
        let first = a.iter().find(|s| s.turn == 0).expect("a first turn");
        if let Some(second) = a.iter().find(|s| s.user == first.user && s.turn == 1) {
            assert!(second.body.len() > first.body.len());
        }
    }

    #[test]
    fn bursts_keep_the_mean_rate_and_leave_the_off_time_empty() {
        let mut q = Profile::full().quality;
        q.duration = Duration::from_secs(60);
        q.arrivals = Arrivals::Bursts {
            on: Duration::from_secs(1),
            off: Duration::from_secs(2),
        };
        let a = conversation_schedule(&q, 3);
        let rate = a.len() as f64 / 60.0;
        assert!((rate - q.rate).abs() < q.rate * 0.15, "rate {rate}");
        assert!(a.iter().all(|s| s.at.as_secs_f64() % 3.0 < 1.0));
    }

    #[test]
    fn without_shared_prompts_no_two_users_share_a_system_prompt() {
        let mut q = Profile::full().quality;
        q.system_prompts = 0;
        q.turns_per_user = 1;
        q.duration = Duration::from_secs(5);
        let a = conversation_schedule(&q, 3);
        let systems: std::collections::HashSet<String> = a
            .iter()
            .map(|s| {
                let v: Value = serde_json::from_slice(&s.body).expect("json");
                v["messages"][0]["content"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        assert_eq!(systems.len(), a.len());
    }

    #[test]
    fn bodies_have_the_asked_size() {
        for size in [1024, 16 * 1024] {
            let b = overhead_bodies(1, size, 4, 8);
            for body in &b {
                let n = body.len() as f64;
                assert!(
                    (n - size as f64).abs() < size as f64 * 0.15,
                    "{n} vs {size}"
                );
            }
            assert_ne!(b[0], b[1]);
        }
    }

    #[test]
    fn prompts_keep_their_size_and_change() {
        let docs = Documents::new(3);
        assert_eq!(docs.doc(5), docs.doc(5));
        assert_eq!(docs.doc(5).len(), engine_docs::DOC_CHARS);
        let mut p = Prompts::new(&docs, 100, 4096);
        let (a, b) = (p.next_prompt(), p.next_prompt());
        assert_eq!(a.len(), 4096);
        assert_ne!(a, b);
    }
}
