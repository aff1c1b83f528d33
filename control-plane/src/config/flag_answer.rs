//! What this router answers to a flag of another router (sglang-router
//! 0.3.2's in `peer_flags.rs`, smg 1.13.0's own in `smg_flags.rs`): the
//! shape of one table row, and the reasons several rows share.
//! `launch_screen.rs` screens a launch line against both tables.

/// How many values a flag takes (as sglang-router's argparse defines it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// None: a switch.
    Switch,
    /// Exactly one.
    One,
    /// Any number, up to the next flag.
    Many,
}

/// This router's answer to one of sglang-router's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted: what it asks for is done another way (how).
    Elsewhere(&'static str),
    /// Refused: a router inside Envoy has no use for it (why).
    NotApplicable(&'static str),
    /// Refused: not built yet (what to do meanwhile).
    NotYet(&'static str),
}

impl Verdict {
    /// The answer's name in docs/flags.md's table.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Elsewhere(_) => "supported differently",
            Verdict::NotApplicable(_) => "refused: not applicable",
            Verdict::NotYet(_) => "refused: not built yet",
        }
    }

    /// Why, or how.
    pub fn reason(self) -> &'static str {
        match self {
            Verdict::Elsewhere(r) | Verdict::NotApplicable(r) | Verdict::NotYet(r) => r,
        }
    }
}

/// One of sglang-router's flags and this router's answer.
#[derive(Debug, Clone, Copy)]
pub struct PeerFlag {
    /// `--name`
    pub name: &'static str,
    /// How many values it takes.
    pub values: Values,
    /// sglang-router's default, as text (empty: none).
    pub default: &'static str,
    /// This router's answer.
    pub answer: Verdict,
}

pub(super) const fn flag(
    name: &'static str,
    values: Values,
    default: &'static str,
    answer: Verdict,
) -> PeerFlag {
    PeerFlag {
        name,
        values,
        default,
        answer,
    }
}

pub(super) const TOKENIZER: &str = "the router inside Envoy forwards HTTP: it does not tokenize, apply chat templates or parse model output (SGLang workers do)";
pub(super) const HISTORY: &str = "the router keeps no conversation history: it forwards the OpenAI/SGLang endpoints to workers and stores nothing";
