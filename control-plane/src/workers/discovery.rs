//! What the control plane asks a worker about itself when it is added.

/// Why a worker's `dp_size` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The worker did not answer.
    #[error("request failed: {0}")]
    Http(#[from] reqwest::Error),
    /// It answered, but not with a usable `dp_size`.
    #[error("neither /get_server_info nor /server_info reports a dp_size")]
    Missing,
}

/// How long one question to a worker about itself may take.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The number of data-parallel ranks of the SGLang server at `base_url`,
/// from `/get_server_info` (newer SGLang also serves `/server_info`), asked
/// through `client`, the control plane's client for workers.
pub async fn dp_size(client: &reqwest::Client, base_url: &str) -> Result<u32, DiscoveryError> {
    let mut last = DiscoveryError::Missing;
    for path in ["/get_server_info", "/server_info"] {
        let answer = client
            .get(format!("{base_url}{path}"))
            .timeout(TIMEOUT)
            .send()
            .await
            .and_then(|r| r.error_for_status());
        match answer {
            Ok(r) => match r.json::<serde_json::Value>().await {
                Ok(info) => {
                    if let Some(n) = read_dp_size(&info) {
                        return Ok(n);
                    }
                    last = DiscoveryError::Missing;
                }
                Err(e) => last = e.into(),
            },
            Err(e) => last = e.into(),
        }
    }
    Err(last)
}

/// `dp_size` at the top level (SGLang flattens its server args there) or
/// under `server_args`.
fn read_dp_size(info: &serde_json::Value) -> Option<u32> {
    [info.get("dp_size"), info.pointer("/server_args/dp_size")]
        .into_iter()
        .flatten()
        .find_map(|v| v.as_u64())
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n >= 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dp_size_at_top_or_nested() {
        assert_eq!(read_dp_size(&serde_json::json!({"dp_size": 4})), Some(4));
        assert_eq!(
            read_dp_size(&serde_json::json!({"server_args": {"dp_size": 2}})),
            Some(2)
        );
        assert_eq!(read_dp_size(&serde_json::json!({"dp_size": 0})), None);
        assert_eq!(read_dp_size(&serde_json::json!({"tp_size": 2})), None);
    }
}
