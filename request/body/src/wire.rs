//! Which dialect of SGLang's request fields a worker speaks.
//!
//! Two spellings of the data-parallel fields exist. The legacy one (what
//! SGLang before 0.5.10 reads; the design notes this router was built from
//! use it too, matching sglang-router's
//! `data_parallel_rank` and `data_parallel_rank_decode`) and SGLang itself
//! since v0.5.10, which renamed the rank a worker runs a request on to
//! `routed_dp_rank` (`data_parallel_rank` lives on as a deprecated alias,
//! migrated with a warning), and tells a PD decode worker where its KV is
//! with `disagg_prefill_dp_rank` (sglang PR #19268; in 0.5.10
//! `python/sglang/srt/managers/io_struct.py` `GenerateReqInput` and
//! `python/sglang/srt/disaggregation/decode.py` `_resolve_prefill_dp_rank`).
//! `data_parallel_rank_decode` exists in no SGLang release.
//!
//! [`crate::pd`] writes the fields of each profile; this module names the
//! profiles and picks one from the `version` a worker reports.

use std::fmt;
use std::str::FromStr;

/// The field dialect of one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WireProfile {
    /// The legacy fields: `data_parallel_rank` is the rank a worker runs on,
    /// and a PD decode half carries the prefill's rank as
    /// `data_parallel_rank` and its own as `data_parallel_rank_decode`
    /// (both null without DP ranks). What SGLang before 0.5.10 reads.
    Legacy,
    /// SGLang since 0.5.10: `routed_dp_rank` is the rank a worker runs on; a
    /// PD decode half names the prefill's rank in `disagg_prefill_dp_rank`,
    /// and the room is chosen so that `bootstrap_room % dp_size` is the
    /// prefill's rank (what a prefill that follows the room requires).
    #[default]
    Upstream,
}

/// The first SGLang release that reads `routed_dp_rank` and
/// `disagg_prefill_dp_rank` (major, minor, patch).
pub const UPSTREAM_SINCE: (u32, u32, u32) = (0, 5, 10);

impl WireProfile {
    /// The name used on the command line and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            WireProfile::Legacy => "legacy",
            WireProfile::Upstream => "upstream",
        }
    }

    /// The profile of a worker reporting `version` (SGLang's `__version__`,
    /// from `/server_info` or `/get_server_info`): legacy before 0.5.10,
    /// upstream from then on. `None` when the version does not start with
    /// three numbers; the caller decides what an unknown version gets.
    pub fn for_version(version: &str) -> Option<WireProfile> {
        let release = parse_release(version)?;
        Some(if release >= UPSTREAM_SINCE {
            WireProfile::Upstream
        } else {
            WireProfile::Legacy
        })
    }
}

/// `major.minor.patch` at the start of a Python version string: `0.5.10`,
/// `0.5.10.post1`, `0.5.10rc0`, `0.5.9+sim` and `v0.5.23` all give their
/// first three numbers (a pre-release of 0.5.10 counts as 0.5.10).
fn parse_release(version: &str) -> Option<(u32, u32, u32)> {
    let v = version.trim();
    let v = v.strip_prefix('v').unwrap_or(v);
    let mut parts = v.splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let rest = parts.next()?;
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let patch = rest.get(..digits)?.parse().ok()?;
    Some((major, minor, patch))
}

impl fmt::Display for WireProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A profile name that is neither `legacy` (or its old name `seeds`) nor
/// `upstream`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown wire profile {0:?} (expected legacy or upstream)")]
pub struct UnknownProfile(pub String);

impl FromStr for WireProfile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Self, UnknownProfile> {
        match s {
            // `seeds`: the profile's first name, still accepted.
            "legacy" | "seeds" => Ok(WireProfile::Legacy),
            "upstream" => Ok(WireProfile::Upstream),
            other => Err(UnknownProfile(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_before_0_5_10_speak_the_legacy_fields() {
        for (version, profile) in [
            ("0.4.10.post2", Some(WireProfile::Legacy)),
            ("0.5.4", Some(WireProfile::Legacy)),
            ("0.5.9", Some(WireProfile::Legacy)),
            ("0.5.9+sim", Some(WireProfile::Legacy)),
            ("0.5.10", Some(WireProfile::Upstream)),
            ("0.5.10rc0", Some(WireProfile::Upstream)),
            ("0.5.10.post1", Some(WireProfile::Upstream)),
            ("0.5.23", Some(WireProfile::Upstream)),
            ("v0.6.0", Some(WireProfile::Upstream)),
            ("1.0.0", Some(WireProfile::Upstream)),
            ("0.5", None),
            ("", None),
            ("unknown", None),
            ("0.5.x", None),
        ] {
            assert_eq!(WireProfile::for_version(version), profile, "{version}");
        }
    }

    #[test]
    fn names_round_trip() {
        for p in [WireProfile::Legacy, WireProfile::Upstream] {
            assert_eq!(p.as_str().parse::<WireProfile>(), Ok(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        assert!("auto".parse::<WireProfile>().is_err());
    }
}
