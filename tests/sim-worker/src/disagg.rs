//! Prefill/decode disaggregation as a router sees it: SGLang's
//! `--disaggregation-mode`, the bootstrap fields of a request
//! (`bootstrap_host`, `bootstrap_port`, `bootstrap_room`), and how each
//! sequence's DP rank follows from them.
//!
//! A prefill server runs the prompt, publishes the "KV" of the room on its
//! bootstrap server ([`crate::bootstrap`]) and answers after a decode server
//! has fetched it; a decode server fetches the room from
//! `bootstrap_host:bootstrap_port` and then generates.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use crate::cache::prefix_hashes;
use crate::error::ApiError;
use crate::request::{field, Body};
use crate::tokens::Token;

/// SGLang's `--disaggregation-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DisaggregationMode {
    /// Not disaggregated: prefill and decode on this worker.
    #[default]
    Null,
    /// Prefill server: runs prompts and hands their KV to decode servers.
    Prefill,
    /// Decode server: fetches the KV from a prefill server, then generates.
    Decode,
}

impl DisaggregationMode {
    /// The flag value (`null`, `prefill` or `decode`).
    pub fn as_str(self) -> &'static str {
        match self {
            DisaggregationMode::Null => "null",
            DisaggregationMode::Prefill => "prefill",
            DisaggregationMode::Decode => "decode",
        }
    }
}

impl fmt::Display for DisaggregationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--disaggregation-mode` value that is none of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown disaggregation mode {0:?} (expected null, prefill or decode)")]
pub struct UnknownMode(String);

impl FromStr for DisaggregationMode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, UnknownMode> {
        match s {
            "null" => Ok(DisaggregationMode::Null),
            "prefill" => Ok(DisaggregationMode::Prefill),
            "decode" => Ok(DisaggregationMode::Decode),
            other => Err(UnknownMode(other.to_string())),
        }
    }
}

/// What one sequence of a request does about disaggregation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handoff {
    /// Not disaggregated: prefill and decode here.
    Local,
    /// Prefill side: publish the KV of `room` and wait until it is fetched.
    Publish {
        /// The `bootstrap_room`.
        room: u64,
    },
    /// Decode side: fetch `room` from the bootstrap server at `host:port`.
    Fetch {
        /// The `bootstrap_room`.
        room: u64,
        /// The `bootstrap_host` (the prefill server's host).
        host: String,
        /// The `bootstrap_port`, or this worker's own bootstrap port when the
        /// request said `null` (as SGLang's scheduler does).
        port: u16,
    },
}

impl Handoff {
    /// The room, if disaggregated.
    pub fn room(&self) -> Option<u64> {
        match self {
            Handoff::Local => None,
            Handoff::Publish { room } | Handoff::Fetch { room, .. } => Some(*room),
        }
    }

    /// The DP rank for this sequence: the explicit rank if any (the
    /// profile's field, see [`crate::wire::ranks`]), else `room % dp_size`
    /// (what SGLang's prefill, following the room, picks). Local sequences
    /// keep `explicit` (the engine round-robins on `None`).
    pub fn rank(&self, explicit: Option<i64>, dp_size: usize) -> Option<i64> {
        match (explicit, self.room()) {
            (Some(rank), _) => Some(rank),
            (None, Some(room)) => i64::try_from(room % dp_size.max(1) as u64).ok(),
            (None, None) => None,
        }
    }
}

/// The [`Handoff`] of each of the `n` sequences of `body` (`batch` when the
/// request is a batch, whose bootstrap fields are then per-item lists).
/// `own_port` stands in for a `null` `bootstrap_port` on a decode server.
pub fn handoffs(
    mode: DisaggregationMode,
    body: &Body,
    n: usize,
    batch: bool,
    own_port: u16,
) -> Result<Vec<Handoff>, ApiError> {
    if mode == DisaggregationMode::Null {
        return Ok(vec![Handoff::Local; n]);
    }
    let rooms = items(body, "bootstrap_room", n, batch, true)?;
    let hosts = items(body, "bootstrap_host", n, batch, false)?;
    let ports = items(body, "bootstrap_port", n, batch, false)?;
    (0..n)
        .map(|i| {
            let room = match rooms[i] {
                None => return Err(missing("bootstrap_room", mode)),
                Some(v) => v.as_u64().ok_or_else(|| {
                    ApiError::bad("bootstrap_room must be a non-negative integer")
                })?,
            };
            let host = match hosts[i] {
                None => return Err(missing("bootstrap_host", mode)),
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                Some(_) => return Err(ApiError::bad("bootstrap_host must be a non-empty string")),
            };
            let port = match ports[i] {
                None => own_port,
                Some(v) => v
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|&p| p != 0)
                    .ok_or_else(|| ApiError::bad("bootstrap_port must be null or a port number"))?,
            };
            // A prefill only checks that the router sent its host and port:
            // they name where it already listens.
            Ok(match mode {
                DisaggregationMode::Decode => Handoff::Fetch { room, host, port },
                _ => Handoff::Publish { room },
            })
        })
        .collect()
}

fn missing(key: &str, mode: DisaggregationMode) -> ApiError {
    ApiError::bad(format!(
        "{key} is required: this worker runs with --disaggregation-mode {mode}"
    ))
}

/// `body[key]` for each of `n` items: a batch takes a list of `n` values
/// (SGLang indexes the bootstrap fields per item), though `host` and `port`
/// may also be one shared value; a single request takes one value. `None`
/// for an absent or `null` value.
fn items<'a>(
    body: &'a Body,
    key: &str,
    n: usize,
    batch: bool,
    list_required: bool,
) -> Result<Vec<Option<&'a Value>>, ApiError> {
    let value = field(body, key);
    match value {
        Some(Value::Array(list)) if batch => {
            if list.len() != n {
                return Err(ApiError::bad(format!(
                    "{key} must have one entry per batch item ({n}), got {}",
                    list.len()
                )));
            }
            Ok(list
                .iter()
                .map(|v| Some(v).filter(|v| !v.is_null()))
                .collect())
        }
        Some(Value::Array(_)) => Err(ApiError::bad(format!(
            "{key} must not be a list for a single (non-batch) request"
        ))),
        Some(_) if batch && list_required => Err(ApiError::bad(format!(
            "{key} must be a list with one entry per batch item"
        ))),
        other => Ok(vec![other; n]),
    }
}

/// A fingerprint of a prompt: what a decode server compares to know that the
/// KV it fetched is the KV of its own prompt.
pub fn prompt_hash(tokens: &[Token]) -> u64 {
    prefix_hashes(tokens)
        .last()
        .copied()
        .unwrap_or(0x656d_7074_795f_6b76)
        ^ tokens.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Body {
        match v {
            Value::Object(m) => m,
            _ => Body::new(),
        }
    }

    #[test]
    fn modes_parse() {
        assert_eq!("prefill".parse(), Ok(DisaggregationMode::Prefill));
        assert_eq!("decode".parse(), Ok(DisaggregationMode::Decode));
        assert_eq!("null".parse(), Ok(DisaggregationMode::Null));
        assert!("mixed".parse::<DisaggregationMode>().is_err());
        assert_eq!(DisaggregationMode::Decode.to_string(), "decode");
    }

    #[test]
    fn decode_fields_and_null_port() {
        let d = DisaggregationMode::Decode;
        let b = body(json!({"bootstrap_host": "h", "bootstrap_port": null, "bootstrap_room": 7}));
        assert_eq!(
            handoffs(d, &b, 1, false, 8998).ok(),
            Some(vec![Handoff::Fetch {
                room: 7,
                host: "h".into(),
                port: 8998
            }])
        );
        let b = body(json!({"bootstrap_host": "h", "bootstrap_port": 9001, "bootstrap_room": 7}));
        assert!(matches!(
            handoffs(d, &b, 1, false, 8998).as_deref(),
            Ok([Handoff::Fetch { port: 9001, .. }])
        ));
        for bad in [
            json!({"bootstrap_port": 1, "bootstrap_room": 7}),
            json!({"bootstrap_host": "h"}),
            json!({"bootstrap_host": "h", "bootstrap_room": -1}),
            json!({"bootstrap_host": "h", "bootstrap_room": "7"}),
            json!({"bootstrap_host": 3, "bootstrap_room": 7}),
            json!({"bootstrap_host": "h", "bootstrap_room": 7, "bootstrap_port": 70000}),
            json!({"bootstrap_host": "h", "bootstrap_room": [7]}),
        ] {
            assert!(
                handoffs(d, &body(bad.clone()), 1, false, 1).is_err(),
                "{bad}"
            );
        }
        // Not disaggregated: the fields are not needed.
        assert_eq!(
            handoffs(DisaggregationMode::Null, &Body::new(), 2, true, 1).ok(),
            Some(vec![Handoff::Local, Handoff::Local])
        );
    }

    #[test]
    fn batch_fields_are_per_item() {
        let b = body(
            json!({"bootstrap_host": "h", "bootstrap_port": [1, 2], "bootstrap_room": [5, 6]}),
        );
        let h = handoffs(DisaggregationMode::Decode, &b, 2, true, 9);
        assert!(matches!(
            h.as_deref(),
            Ok([
                Handoff::Fetch {
                    room: 5,
                    port: 1,
                    ..
                },
                Handoff::Fetch {
                    room: 6,
                    port: 2,
                    ..
                }
            ])
        ));
        let p = DisaggregationMode::Prefill;
        let scalar_room = body(json!({"bootstrap_host": "h", "bootstrap_room": 5}));
        assert!(handoffs(p, &scalar_room, 2, true, 9).is_err());
        let short = body(json!({"bootstrap_host": "h", "bootstrap_room": [5]}));
        assert!(handoffs(p, &short, 2, true, 9).is_err());
        let ok = body(json!({"bootstrap_host": ["a", "b"], "bootstrap_room": [5, 6]}));
        assert_eq!(
            handoffs(p, &ok, 2, true, 9).ok(),
            Some(vec![
                Handoff::Publish { room: 5 },
                Handoff::Publish { room: 6 }
            ])
        );
    }

    #[test]
    fn ranks_follow_rooms() {
        let h = Handoff::Publish { room: 7 };
        assert_eq!(h.rank(None, 4), Some(3));
        assert_eq!(h.rank(Some(1), 4), Some(1));
        assert_eq!(Handoff::Local.rank(None, 4), None);
        assert_eq!(Handoff::Local.rank(Some(2), 4), Some(2));
        let big = Handoff::Publish { room: u64::MAX };
        assert_eq!(big.rank(None, 1), Some(0));
    }

    #[test]
    fn hashes_tell_prompts_apart() {
        let a = crate::tokens::tokenize("abcdefgh");
        let b = crate::tokens::tokenize("abcdefgi");
        assert_eq!(prompt_hash(&a), prompt_hash(&a.clone()));
        assert_ne!(prompt_hash(&a), prompt_hash(&b));
        assert_ne!(prompt_hash(&a), prompt_hash(&a[..1]));
    }
}
