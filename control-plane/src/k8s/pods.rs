//! Which pods are workers, and as what: sglang-router's service discovery
//! rules, as pure functions of a pod (the watcher in `watch.rs` applies
//! them to every pod it sees).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::workers::{Role, WorkerSpec};

/// The annotation a prefill pod names its bootstrap port with.
pub const BOOTSTRAP_PORT_ANNOTATION: &str = "sglang.ai/bootstrap-port";

/// `key=value` pairs a pod's labels must all have.
pub type Selector = Vec<(String, String)>;

/// What makes a pod a worker (from the flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Regular mode: the pods that are workers.
    pub selector: Selector,
    /// PD mode: the pods that are prefill servers, and decode servers
    /// (`None`: regular mode).
    pub pd: Option<(Selector, Selector)>,
    /// The ports each pod serves on, one worker each
    /// (`--service-discovery-port`; an InferencePool's target ports).
    pub ports: Vec<u16>,
}

/// A pod that is a worker: where it serves, and as what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// `http://pod-ip:port`
    pub url: String,
    /// Its role (and bootstrap port).
    pub spec: WorkerSpec,
}

/// The workers `pod` is under `rules` (one per port), if it is any now:
/// its labels match, it is running and ready, it has an IP and is not
/// being deleted.
pub fn workers_of(pod: &Pod, rules: &Rules) -> Vec<Found> {
    worker_at(pod, rules)
        .map(|(host, spec)| {
            rules
                .ports
                .iter()
                .map(|port| Found {
                    url: format!("http://{host}:{port}"),
                    spec,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The pod's host part of a URL and its spec, if it is a worker now.
fn worker_at(pod: &Pod, rules: &Rules) -> Option<(String, WorkerSpec)> {
    let labels = pod.metadata.labels.as_ref();
    let role = match &rules.pd {
        None => matches(labels, &rules.selector).then_some(Role::Regular)?,
        Some((prefill, _)) if matches(labels, prefill) => Role::Prefill,
        Some((_, decode)) if matches(labels, decode) => Role::Decode,
        Some(_) => return None,
    };
    if pod.metadata.deletion_timestamp.is_some() || !running_and_ready(pod) {
        return None;
    }
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?.trim();
    if ip.is_empty() {
        return None;
    }
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    let bootstrap = (role == Role::Prefill)
        .then(|| bootstrap_port(pod))
        .flatten();
    Some((host, WorkerSpec::of(role, bootstrap)))
}

/// Every pair of `selector` is among `labels` (an empty selector matches
/// nothing: discovery must say which pods it means).
fn matches(labels: Option<&BTreeMap<String, String>>, selector: &Selector) -> bool {
    !selector.is_empty()
        && selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

fn running_and_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The prefill pod's bootstrap port from its annotation, if it names one.
fn bootstrap_port(pod: &Pod) -> Option<u16> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(BOOTSTRAP_PORT_ANNOTATION)?
        .trim()
        .parse()
        .ok()
}

/// `key=value` texts as a selector; an error names the one without `=`.
pub fn parse_selector(pairs: &[String]) -> Result<Selector, String> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(format!("selector `{p}` is not key=value")),
        })
        .collect()
}

/// A running pod for tests: these labels and IP, ready or not.
#[cfg(test)]
pub(crate) fn test_pod(
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    ip: &str,
    ready: bool,
) -> Pod {
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(labels: &[(&str, &str)], ip: &str, ready: bool) -> Pod {
        test_pod("ns", "p", labels, ip, ready)
    }

    fn first(pod: &Pod, rules: &Rules) -> Option<Found> {
        workers_of(pod, rules).into_iter().next()
    }

    fn regular(selector: &[(&str, &str)]) -> Rules {
        Rules {
            selector: selector
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            pd: None,
            ports: vec![8000],
        }
    }

    #[test]
    fn a_ready_running_pod_with_every_label_is_a_worker_at_its_ip() {
        let rules = regular(&[("app", "sglang"), ("tier", "gpu")]);
        let found = first(
            &pod(
                &[("app", "sglang"), ("tier", "gpu"), ("x", "y")],
                "10.0.0.7",
                true,
            ),
            &rules,
        );
        assert_eq!(
            found,
            Some(Found {
                url: "http://10.0.0.7:8000".into(),
                spec: WorkerSpec::REGULAR
            })
        );
        assert_eq!(
            first(&pod(&[("app", "sglang")], "10.0.0.7", true), &rules),
            None,
            "one label missing"
        );
        assert_eq!(
            first(
                &pod(&[("app", "sglang"), ("tier", "gpu")], "10.0.0.7", false),
                &rules
            ),
            None,
            "not ready"
        );
        assert_eq!(
            first(
                &pod(&[("app", "sglang"), ("tier", "gpu")], "", true),
                &rules
            ),
            None,
            "no IP yet"
        );
        let v6 = first(
            &pod(&[("app", "sglang"), ("tier", "gpu")], "fd00::7", true),
            &rules,
        );
        assert_eq!(v6.unwrap().url, "http://[fd00::7]:8000");
        let mut leaving = pod(&[("app", "sglang"), ("tier", "gpu")], "10.0.0.7", true);
        leaving.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(first(&leaving, &rules), None, "being deleted");
        assert_eq!(
            first(&pod(&[], "10.0.0.7", true), &regular(&[])),
            None,
            "an empty selector means no pod"
        );
    }

    #[test]
    fn pd_roles_come_from_their_selectors_and_the_bootstrap_port_from_the_annotation() {
        let sel = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        let rules = Rules {
            selector: Vec::new(),
            pd: Some((sel("role", "prefill"), sel("role", "decode"))),
            ports: vec![30000],
        };
        let mut prefill = pod(&[("role", "prefill")], "10.0.0.1", true);
        prefill.metadata.annotations =
            Some([(BOOTSTRAP_PORT_ANNOTATION.to_string(), "9001".to_string())].into());
        assert_eq!(
            first(&prefill, &rules).unwrap().spec,
            WorkerSpec::of(Role::Prefill, Some(9001))
        );
        let bare = pod(&[("role", "prefill")], "10.0.0.2", true);
        assert_eq!(
            first(&bare, &rules).unwrap().spec,
            WorkerSpec::of(Role::Prefill, None)
        );
        let decode = pod(&[("role", "decode")], "10.0.0.3", true);
        assert_eq!(
            first(&decode, &rules).unwrap().spec,
            WorkerSpec::of(Role::Decode, None)
        );
        assert_eq!(
            first(&pod(&[("role", "other")], "10.0.0.4", true), &rules),
            None
        );
    }

    #[test]
    fn several_ports_make_several_workers_of_one_pod() {
        let mut rules = regular(&[("app", "m")]);
        rules.ports = vec![8000, 8001];
        let urls: Vec<String> = workers_of(&pod(&[("app", "m")], "10.0.0.8", true), &rules)
            .into_iter()
            .map(|f| f.url)
            .collect();
        assert_eq!(urls, ["http://10.0.0.8:8000", "http://10.0.0.8:8001"]);
    }

    #[test]
    fn selectors_parse_from_key_value_texts() {
        assert_eq!(
            parse_selector(&["app=sglang".into(), " tier = gpu ".into()]).unwrap(),
            vec![
                ("app".into(), "sglang".into()),
                ("tier".into(), "gpu".into())
            ]
        );
        assert!(parse_selector(&["app".into()])
            .unwrap_err()
            .contains("`app`"));
    }
}
