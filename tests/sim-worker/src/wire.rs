//! Which SGLang the simulator imitates as far as a router's fields go
//! (`--wire-profile`): which DP-rank fields it reads, and which version and
//! info routes it reports.
//!
//! Written from SGLang's sources, independently of the router's own field
//! builder, so that a router writing the wrong fields fails against it:
//!
//! * **upstream** (SGLang 0.5.10 and later; read in 0.5.10 and 0.5.23
//!   `managers/io_struct.py`, `managers/data_parallel_controller.py`,
//!   `disaggregation/decode.py`, `disaggregation/common/conn.py`): a request
//!   runs on `routed_dp_rank`; `data_parallel_rank` is a deprecated alias
//!   (used only when `routed_dp_rank` is absent, counted in
//!   `/_sim/stats` `deprecated_dp_rank`); `data_parallel_rank_decode` means
//!   nothing. A decode finds its KV on prefill rank `disagg_prefill_dp_rank`,
//!   else `bootstrap_room % prefill dp_size`. A prefill with more than one
//!   rank that is sent to a rank other than `room % dp_size` without
//!   `disagg_prefill_dp_rank` fails ("follow_bootstrap_room conflict", 0.5.23).
//! * **legacy** (SGLang before 0.5.10, and the design notes the router was
//!   built from): a request runs
//!   on `data_parallel_rank`, a decode on `data_parallel_rank_decode` and
//!   finds its KV on prefill rank `data_parallel_rank`, else
//!   `bootstrap_room % prefill dp_size`. No SGLang release reads
//!   `data_parallel_rank_decode`: before 0.5.10 a decode ran on
//!   `data_parallel_rank` and used it as the prefill's rank too (0.5.9
//!   `disaggregation/decode.py`).

use std::fmt;
use std::str::FromStr;

use crate::disagg::DisaggregationMode;
use crate::error::ApiError;
use crate::request::{dp_rank, Body};

/// The field dialect the simulator speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireProfile {
    /// The legacy fields.
    Legacy,
    /// SGLang 0.5.10 and later.
    #[default]
    Upstream,
}

impl WireProfile {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            WireProfile::Legacy => "legacy",
            WireProfile::Upstream => "upstream",
        }
    }

    /// The version reported by default: the last release before the
    /// renaming for legacy, the newest read for upstream, marked as
    /// simulated (a PEP 440 local label).
    pub fn default_version(self) -> &'static str {
        match self {
            WireProfile::Legacy => "0.5.9+sim",
            WireProfile::Upstream => "0.5.23+sim",
        }
    }
}

impl fmt::Display for WireProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A flag value that is none of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown value {0:?} (expected {1})")]
pub struct UnknownValue(String, &'static str);

impl FromStr for WireProfile {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, UnknownValue> {
        match s {
            "legacy" | "seeds" => Ok(WireProfile::Legacy),
            "upstream" => Ok(WireProfile::Upstream),
            other => Err(UnknownValue(other.into(), "legacy or upstream")),
        }
    }
}

/// Which server and model info routes the simulator answers
/// (`--info-routes`); the others are unknown paths (404).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InfoRoutes {
    /// `/get_server_info`, `/server_info`, `/get_model_info` and
    /// `/model_info`: SGLang 0.5.6 to 0.5.23 (the `get_` ones deprecated).
    #[default]
    Both,
    /// `/get_server_info` and `/get_model_info` only: SGLang 0.5.4 and older.
    Legacy,
    /// `/server_info` and `/model_info` only: a release without the
    /// deprecated `get_` aliases.
    Current,
}

impl InfoRoutes {
    /// Whether the `get_`-prefixed routes are served.
    pub fn legacy(self) -> bool {
        self != InfoRoutes::Current
    }

    /// Whether the unprefixed routes are served.
    pub fn current(self) -> bool {
        self != InfoRoutes::Legacy
    }
}

impl FromStr for InfoRoutes {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, UnknownValue> {
        match s {
            "both" => Ok(InfoRoutes::Both),
            "legacy" => Ok(InfoRoutes::Legacy),
            "current" => Ok(InfoRoutes::Current),
            other => Err(UnknownValue(other.into(), "both, legacy or current")),
        }
    }
}

/// The DP ranks a request names, as the simulator's profile reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ranks {
    /// The rank to run on here; `None`: the worker picks (the room's rank
    /// in PD mode, round robin otherwise).
    pub run: Option<i64>,
    /// A decode's word on the prefill rank holding its KV (also, for the
    /// conflict check, whether a prefill was told it).
    pub prefill: Option<i64>,
    /// The request used the deprecated `data_parallel_rank` (upstream).
    pub deprecated: bool,
}

/// The ranks `body` names for a worker in `mode` speaking `profile`.
pub fn ranks(
    profile: WireProfile,
    mode: DisaggregationMode,
    body: &Body,
) -> Result<Ranks, ApiError> {
    let old = dp_rank(body, "data_parallel_rank")?;
    Ok(match profile {
        WireProfile::Legacy => match mode {
            DisaggregationMode::Decode => Ranks {
                run: dp_rank(body, "data_parallel_rank_decode")?,
                prefill: old,
                deprecated: false,
            },
            _ => Ranks {
                run: old,
                ..Ranks::default()
            },
        },
        WireProfile::Upstream => {
            let routed = dp_rank(body, "routed_dp_rank")?;
            Ranks {
                run: routed.or(old),
                prefill: dp_rank(body, "disagg_prefill_dp_rank")?,
                deprecated: old.is_some(),
            }
        }
    })
}

/// An upstream prefill's check that its rank is the one the room implies
/// when nobody told the decode otherwise (0.5.23 `common/conn.py`, the
/// sender's init): an error message on a conflict.
pub fn room_conflict(
    profile: WireProfile,
    ranks: &Ranks,
    rank: usize,
    room: u64,
    dp_size: usize,
) -> Option<String> {
    let implied = room % dp_size.max(1) as u64;
    let conflict = profile == WireProfile::Upstream
        && dp_size > 1
        && ranks.prefill.is_none()
        && rank as u64 != implied;
    conflict.then(|| {
        format!(
            "follow_bootstrap_room conflict: dispatched to dp_rank {rank} but bootstrap_room {room} implies dp_rank {implied}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: serde_json::Value) -> Body {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn upstream_reads_routed_then_the_deprecated_alias() {
        let up = WireProfile::Upstream;
        let d = DisaggregationMode::Decode;
        let b = body(
            json!({"routed_dp_rank": 1, "data_parallel_rank": 2, "disagg_prefill_dp_rank": 3, "data_parallel_rank_decode": 0}),
        );
        let r = ranks(up, d, &b).unwrap();
        assert_eq!((r.run, r.prefill, r.deprecated), (Some(1), Some(3), true));
        let b = body(json!({"data_parallel_rank": 2, "data_parallel_rank_decode": 0}));
        let r = ranks(up, d, &b).unwrap();
        assert_eq!(
            (r.run, r.prefill),
            (Some(2), None),
            "the legacy decode lands on the prefill's rank"
        );
        assert!(ranks(up, d, &body(json!({"routed_dp_rank": "1"}))).is_err());
    }

    #[test]
    fn legacy_reads_the_legacy_fields() {
        let s = WireProfile::Legacy;
        let b = body(
            json!({"routed_dp_rank": 1, "data_parallel_rank": 2, "data_parallel_rank_decode": 3}),
        );
        let r = ranks(s, DisaggregationMode::Decode, &b).unwrap();
        assert_eq!((r.run, r.prefill, r.deprecated), (Some(3), Some(2), false));
        let r = ranks(s, DisaggregationMode::Prefill, &b).unwrap();
        assert_eq!((r.run, r.prefill), (Some(2), None));
        let r = ranks(
            s,
            DisaggregationMode::Null,
            &body(json!({"routed_dp_rank": 1})),
        )
        .unwrap();
        assert_eq!(r.run, None, "routed_dp_rank means nothing before 0.5.10");
    }

    #[test]
    fn conflicts_only_upstream_with_ranks_and_no_prefill_word() {
        let up = WireProfile::Upstream;
        let none = Ranks::default();
        assert!(room_conflict(up, &none, 1, 4, 2).is_some());
        assert!(room_conflict(up, &none, 0, 4, 2).is_none());
        assert!(room_conflict(up, &none, 0, 5, 1).is_none());
        let told = Ranks {
            prefill: Some(1),
            ..none
        };
        assert!(room_conflict(up, &told, 1, 4, 2).is_none());
        assert!(room_conflict(WireProfile::Legacy, &none, 1, 4, 2).is_none());
        assert_eq!("legacy".parse(), Ok(InfoRoutes::Legacy));
        assert_eq!("legacy".parse(), Ok(WireProfile::Legacy));
        assert!("both!".parse::<InfoRoutes>().is_err());
    }
}
