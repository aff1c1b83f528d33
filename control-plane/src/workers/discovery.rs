//! What the control plane asks a worker about itself when it is added.

use sglang_envoy_body::WireProfile;
use tracing::{info, warn};

use crate::workers::ServerFacts;

/// Why a worker's server info could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The worker did not answer.
    #[error("request failed: {0}")]
    Http(#[from] reqwest::Error),
    /// It answered, but not with a usable `dp_size`.
    #[error("neither /server_info nor /get_server_info reports a dp_size")]
    Missing,
}

/// How long one question to a worker about itself may take.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Where SGLang serves its server info, in the order asked: `/server_info`
/// since 0.5.6 (0.5.4 and older answer 404), `/get_server_info` in every
/// release so far, deprecated since 0.5.6 with a warning logged on each
/// call (`python/sglang/srt/entrypoints/http_server.py`), so it is asked
/// only when the first fails.
const PATHS: [&str; 2] = ["/server_info", "/get_server_info"];

/// What a worker says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// Its number of data-parallel ranks.
    pub dp_size: u32,
    /// SGLang's `__version__`, when it reports one.
    pub version: Option<String>,
}

/// The server info of the SGLang server at `base_url`, asked through
/// `client`, the control plane's client for workers.
pub async fn server_info(
    client: &reqwest::Client,
    base_url: &str,
) -> Result<ServerInfo, DiscoveryError> {
    let mut last = DiscoveryError::Missing;
    for path in PATHS {
        let answer = client
            .get(format!("{base_url}{path}"))
            .timeout(TIMEOUT)
            .send()
            .await
            .and_then(|r| r.error_for_status());
        match answer {
            Ok(r) => match r.json::<serde_json::Value>().await {
                Ok(info) => match read(&info) {
                    Some(found) => return Ok(found),
                    None => last = DiscoveryError::Missing,
                },
                Err(e) => last = e.into(),
            },
            Err(e) => last = e.into(),
        }
    }
    Err(last)
}

/// What the control plane must know of the server at `base_url` to route
/// to it: with `dp_aware`, its DP size and version from [`server_info`]
/// (an error if it cannot be read); its wire profile, `forced` or from that
/// version (see [`crate::pd::wire_profile`]). Without `dp_aware` nothing is
/// asked: without ranks the profiles differ in null fields only, which
/// every release ignores, and a worker still starting must not fail its
/// registration.
pub async fn server_facts(
    client: &reqwest::Client,
    base_url: &str,
    dp_aware: bool,
    forced: Option<WireProfile>,
) -> Result<ServerFacts, DiscoveryError> {
    let info = if dp_aware {
        Some(server_info(client, base_url).await?)
    } else {
        None
    };
    let version = info.as_ref().and_then(|i| i.version.as_deref());
    let facts = ServerFacts {
        dp_size: info.as_ref().map(|i| i.dp_size),
        wire: crate::pd::wire_profile(forced, version),
    };
    if info.is_some() && version.is_none() && forced.is_none() {
        warn!(worker = %base_url, wire = %facts.wire, "the worker reports no version; assuming the upstream wire profile");
    }
    info!(worker = %base_url, version = version.unwrap_or("unknown"), dp_size = ?facts.dp_size, wire = %facts.wire, "worker's wire profile");
    Ok(facts)
}

/// `dp_size` and `version` at the top level (SGLang flattens its server
/// args there) or under `server_args`.
fn read(info: &serde_json::Value) -> Option<ServerInfo> {
    let field = |key: &str| {
        [
            info.get(key),
            info.get("server_args").and_then(|a| a.get(key)),
        ]
        .into_iter()
        .flatten()
        .find(|v| !v.is_null())
    };
    let dp_size = field("dp_size")
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n >= 1)?;
    let version = field("version")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string);
    Some(ServerInfo { dp_size, version })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dp_size_and_version_at_top_or_nested() {
        let info = |v| read(&v).map(|i| (i.dp_size, i.version));
        assert_eq!(
            info(serde_json::json!({"dp_size": 4, "version": "0.5.23"})),
            Some((4, Some("0.5.23".into())))
        );
        assert_eq!(
            info(serde_json::json!({"server_args": {"dp_size": 2}})),
            Some((2, None))
        );
        assert_eq!(info(serde_json::json!({"dp_size": 0})), None);
        assert_eq!(info(serde_json::json!({"tp_size": 2})), None);
        assert_eq!(
            info(serde_json::json!({"dp_size": 1, "version": 5})),
            Some((1, None))
        );
    }
}
