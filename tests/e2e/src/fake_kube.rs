//! A small stand-in for a Kubernetes API server: it serves list and watch of
//! pods (`/api/v1/pods`, `/api/v1/namespaces/NS/pods`) from pods the test
//! puts, modifies and deletes, the way kube-rs's watcher reads them, and
//! InferencePools by name. No API
//! server can run on the test machines; this serves what the control
//! plane's discovery asks of one, and nothing else.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// The fake API server, serving until dropped.
pub struct FakeKube {
    /// `http://127.0.0.1:port`
    pub url: String,
    state: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    inner: Mutex<Inner>,
    events: broadcast::Sender<(String, Value)>,
}

#[derive(Default)]
struct Inner {
    /// `namespace/name` → the pod as JSON.
    pods: BTreeMap<String, Value>,
    /// `namespace/name` → the InferencePool as JSON.
    pools: BTreeMap<String, Value>,
    resource_version: u64,
}

impl FakeKube {
    /// Starts serving on a free loopback port.
    pub async fn start() -> anyhow::Result<FakeKube> {
        let (events, _) = broadcast::channel(1024);
        let state = Arc::new(Shared {
            inner: Mutex::new(Inner::default()),
            events,
        });
        let app = Router::new()
            .route("/api/v1/pods", get(all_pods))
            .route("/api/v1/namespaces/{namespace}/pods", get(namespace_pods))
            .route(
                "/apis/{group}/{version}/namespaces/{namespace}/inferencepools/{name}",
                get(pool),
            )
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeKube { url, state, task })
    }

    /// A kubeconfig naming this server (no credentials), written in `dir`:
    /// what `KUBECONFIG` points a client at.
    pub fn kubeconfig(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\n",
            self.url
        );
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// Adds or replaces a pod (`metadata.namespace` and `.name` say which).
    pub fn put(&self, mut pod: Value) {
        let key = key_of(&pod);
        let mut inner = self.state.inner.lock().unwrap();
        inner.resource_version += 1;
        pod["metadata"]["resourceVersion"] = json!(inner.resource_version.to_string());
        let kind = if inner.pods.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        inner.pods.insert(key, pod.clone());
        let _ = self.state.events.send((kind.to_string(), pod));
    }

    /// Adds an InferencePool (`inference.networking.k8s.io/v1`) with `spec`.
    pub fn put_pool(&self, namespace: &str, name: &str, spec: Value) {
        let pool = json!({
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"namespace": namespace, "name": name, "resourceVersion": "1"},
            "spec": spec,
        });
        let mut inner = self.state.inner.lock().unwrap();
        inner.pools.insert(format!("{namespace}/{name}"), pool);
    }

    /// Deletes a pod.
    pub fn delete(&self, namespace: &str, name: &str) {
        let mut inner = self.state.inner.lock().unwrap();
        if let Some(mut pod) = inner.pods.remove(&format!("{namespace}/{name}")) {
            inner.resource_version += 1;
            pod["metadata"]["resourceVersion"] = json!(inner.resource_version.to_string());
            let _ = self.state.events.send(("DELETED".to_string(), pod));
        }
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A pod as the API server shows it: running, with `ip`, ready or not.
pub fn pod(
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
    ip: &str,
    ready: bool,
) -> Value {
    let map = |pairs: &[(&str, &str)]| -> serde_json::Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect()
    };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": format!("uid-{namespace}-{name}"),
            "labels": map(labels),
            "annotations": map(annotations),
        },
        "spec": {"containers": [{"name": "sglang", "image": "sglang"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

fn key_of(pod: &Value) -> String {
    format!(
        "{}/{}",
        pod["metadata"]["namespace"].as_str().unwrap_or_default(),
        pod["metadata"]["name"].as_str().unwrap_or_default()
    )
}

async fn pool(
    State(state): State<Arc<Shared>>,
    UrlPath((_group, _version, namespace, name)): UrlPath<(String, String, String, String)>,
) -> Response {
    let inner = state.inner.lock().unwrap();
    let (status, body) = match inner.pools.get(&format!("{namespace}/{name}")) {
        Some(pool) => (200, pool.clone()),
        None => (
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "reason": "NotFound", "code": 404,
                   "message": format!("inferencepools \"{name}\" not found")}),
        ),
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn all_pods(
    State(state): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    pods(state, None, query)
}

async fn namespace_pods(
    State(state): State<Arc<Shared>>,
    UrlPath(namespace): UrlPath<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    pods(state, Some(namespace), query)
}

/// A list, or with `watch=true` a stream of events (one JSON per line).
fn pods(state: Arc<Shared>, namespace: Option<String>, query: HashMap<String, String>) -> Response {
    let in_scope = move |pod: &Value| {
        namespace
            .as_deref()
            .is_none_or(|ns| pod["metadata"]["namespace"] == ns)
    };
    let json_response = |body: Body| {
        Response::builder()
            .header("content-type", "application/json")
            .body(body)
            .unwrap()
    };
    if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) {
        let rx = state.events.subscribe();
        let lines = futures::stream::unfold(rx, move |mut rx| {
            let in_scope = in_scope.clone();
            async move {
                loop {
                    match rx.recv().await {
                        Ok((kind, pod)) if in_scope(&pod) => {
                            let line = format!("{}\n", json!({"type": kind, "object": pod}));
                            return Some((Ok::<_, std::convert::Infallible>(line), rx));
                        }
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        });
        return json_response(Body::from_stream(lines));
    }
    let inner = state.inner.lock().unwrap();
    let items: Vec<&Value> = inner.pods.values().filter(|p| in_scope(p)).collect();
    let list = json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": inner.resource_version.to_string()},
        "items": items,
    });
    json_response(Body::from(list.to_string()))
}
