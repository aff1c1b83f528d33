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
    /// It answered, but not with what was asked (a usable `dp_size`).
    #[error("neither /server_info nor /get_server_info reports what was asked")]
    Missing,
}

/// How long one question to a worker about itself may take.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the question may take when only the model is wanted: a worker
/// that does not answer is registered all the same, without one.
const MODEL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

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
    /// The model it serves, when it reports one.
    pub model: Option<String>,
}

/// The server info of the SGLang server at `base_url`, asked through
/// `client`, the control plane's client for workers.
pub async fn server_info(
    client: &reqwest::Client,
    base_url: &str,
) -> Result<ServerInfo, DiscoveryError> {
    server_info_within(client, base_url, TIMEOUT).await
}

/// [`server_info`], each question taking at most `timeout`.
async fn server_info_within(
    client: &reqwest::Client,
    base_url: &str,
    timeout: std::time::Duration,
) -> Result<ServerInfo, DiscoveryError> {
    ask_server_info(client, base_url, timeout, read).await
}

/// The first of the server info paths whose JSON answer `read` makes
/// something of, each question taking at most `timeout`: what every part
/// that asks a worker about itself (its DP size and model here, its
/// KV-event publisher in `kv_events`) shares.
pub async fn ask_server_info<T>(
    client: &reqwest::Client,
    base_url: &str,
    timeout: std::time::Duration,
    read: impl Fn(&serde_json::Value) -> Option<T>,
) -> Result<T, DiscoveryError> {
    let mut last = DiscoveryError::Missing;
    for path in PATHS {
        let answer = client
            .get(format!("{base_url}{path}"))
            .timeout(timeout)
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

/// The model the server at `base_url` serves, from its server info; `None`
/// (logged) when it does not answer within a short wait. Asked when a
/// server is added, and again once it is healthy if it did not tell then.
pub async fn served_model(client: &reqwest::Client, base_url: &str) -> Option<String> {
    match server_info_within(client, base_url, MODEL_TIMEOUT).await {
        Ok(info) => info.model,
        Err(e) => {
            warn!(worker = %base_url, error = %crate::workers::error_chain(&e), "cannot read the worker's model yet");
            None
        }
    }
}

/// What the control plane must know of the server at `base_url` to route
/// to it: with `dp_aware`, its DP size and version from [`server_info`]
/// (an error if it cannot be read); its wire profile, `forced` or from that
/// version (see [`crate::pd::wire_profile`]); the model it serves, as smg
/// reads it (`served_model_name`, else `model_id`/`model`, else
/// `model_path`). Without `dp_aware` the server info is asked for the
/// model only, and a worker that does not tell is registered without one
/// (a worker still starting must not fail its registration; without ranks
/// the wire profiles differ in null fields only, which every release
/// ignores).
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
    let model = match &info {
        Some(i) => i.model.clone(),
        None => served_model(client, base_url).await,
    };
    let version = info.as_ref().and_then(|i| i.version.as_deref());
    let facts = ServerFacts {
        dp_size: info.as_ref().map(|i| i.dp_size),
        wire: crate::pd::wire_profile(forced, version),
        model: model.map(Into::into),
    };
    if info.is_some() && version.is_none() && forced.is_none() {
        warn!(worker = %base_url, wire = %facts.wire, "the worker reports no version; assuming the upstream wire profile");
    }
    info!(worker = %base_url, version = version.unwrap_or("unknown"), dp_size = ?facts.dp_size, wire = %facts.wire, model = facts.model.as_deref().unwrap_or("unknown"), "worker's facts");
    Ok(facts)
}

/// `dp_size`, `version` and the model at the top level (SGLang flattens
/// its server args there) or under `server_args`. `None` without a
/// `dp_size`: every SGLang release reports one.
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
    let text = |key: &str| {
        field(key)
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let version = text("version");
    let model = ["served_model_name", "model_id", "model", "model_path"]
        .into_iter()
        .find_map(text);
    Some(ServerInfo {
        dp_size,
        version,
        model,
    })
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

    #[test]
    fn model_as_smg_reads_it() {
        let model = |v| read(&v).and_then(|i| i.model);
        assert_eq!(
            model(
                serde_json::json!({"dp_size": 1, "model_path": "/m/llama", "served_model_name": "llama"})
            ),
            Some("llama".into())
        );
        assert_eq!(
            model(
                serde_json::json!({"dp_size": 1, "served_model_name": "", "server_args": {"model_path": "/m/qwen"}})
            ),
            Some("/m/qwen".into())
        );
        assert_eq!(model(serde_json::json!({"dp_size": 1})), None);
    }
}
