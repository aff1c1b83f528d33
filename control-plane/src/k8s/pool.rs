//! An InferencePool (Gateway API Inference Extension) as discovery rules:
//! its pods are those its selector matches, each serving on every one of
//! its target ports (one worker per pod and port, as the endpoint picker
//! the pool names sees them). Read with `--pool-name` / `--pool-namespace`.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::Api;
use serde_json::Value;

use super::pods::Rules;

/// The API group of InferencePool v1; the older `…x-k8s.io` group serves
/// `v1alpha2`.
pub const POOL_GROUP: &str = "inference.networking.k8s.io";

/// Why a pool gives no rules.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The API server did not give the pool.
    #[error("cannot read InferencePool {namespace}/{name}: {source}")]
    Read {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why.
        source: kube::Error,
    },
    /// The pool says nothing usable.
    #[error("InferencePool {0}: {1}")]
    Spec(String, &'static str),
}

/// The pool's discovery rules, read from the API server.
pub async fn read(
    client: kube::Client,
    group: &str,
    namespace: &str,
    name: &str,
) -> Result<Rules, PoolError> {
    let version = if group.ends_with("x-k8s.io") {
        "v1alpha2"
    } else {
        "v1"
    };
    let gvk = GroupVersionKind::gvk(group, version, "InferencePool");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, namespace, &ApiResource::from_gvk(&gvk));
    let pool = api.get(name).await.map_err(|source| PoolError::Read {
        namespace: namespace.to_string(),
        name: name.to_string(),
        source,
    })?;
    rules_of(&pool.data["spec"]).map_err(|why| PoolError::Spec(format!("{namespace}/{name}"), why))
}

/// The rules a pool's `spec` gives: `selector.matchLabels` (v1; v1alpha2's
/// `selector` is the map itself) and `targetPorts[].number` (v1;
/// v1alpha2's `targetPortNumber`).
pub fn rules_of(spec: &Value) -> Result<Rules, &'static str> {
    let labels = spec["selector"]["matchLabels"]
        .as_object()
        .or_else(|| {
            spec["selector"]
                .as_object()
                .filter(|m| !m.contains_key("matchLabels"))
        })
        .ok_or("no selector")?;
    let selector: Vec<(String, String)> = labels
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect();
    if selector.is_empty() {
        return Err("an empty selector");
    }
    let port = |v: &Value| {
        v.as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|p| *p > 0)
    };
    let mut ports: Vec<u16> = match spec["targetPorts"].as_array() {
        Some(list) => list.iter().filter_map(|p| port(&p["number"])).collect(),
        None => port(&spec["targetPortNumber"]).into_iter().collect(),
    };
    ports.dedup();
    if ports.is_empty() {
        return Err("no target port");
    }
    Ok(Rules {
        selector,
        pd: None,
        ports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn v1_and_v1alpha2_pools_give_the_same_rules() {
        let v1 = rules_of(&json!({
            "selector": {"matchLabels": {"app": "sglang"}},
            "targetPorts": [{"number": 8000}, {"number": 8001}],
            "endpointPickerRef": {"name": "picker"},
        }))
        .unwrap();
        assert_eq!(v1.selector, vec![("app".to_string(), "sglang".to_string())]);
        assert_eq!(v1.ports, vec![8000, 8001]);
        let alpha = rules_of(&json!({
            "selector": {"app": "sglang"},
            "targetPortNumber": 8000,
        }))
        .unwrap();
        assert_eq!(alpha.selector, v1.selector);
        assert_eq!(alpha.ports, vec![8000]);
        assert!(rules_of(
            &json!({"selector": {"matchLabels": {}}, "targetPorts": [{"number": 1}]})
        )
        .is_err());
        assert!(
            rules_of(&json!({"selector": {"matchLabels": {"a": "b"}}, "targetPorts": []})).is_err()
        );
    }
}
