//! The worker registry on disk (`--state-file`), so a restarted control
//! plane comes back with the workers added at run time, not only those on
//! its command line.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::workers::{Registry, Role, WorkerId, WorkerSpec};

/// Why the state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading or writing failed.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// The file is not a state file.
    #[error("{0}: not a worker state file: {1}")]
    Format(PathBuf, serde_json::Error),
}

/// One registered server as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredWorker {
    /// `http://host:port`.
    pub url: String,
    /// `regular`, `prefill` or `decode`.
    pub worker_type: String,
    /// Prefill only; `None` is `none`.
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
    /// Its id in the `/workers` API (absent in files written before ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<WorkerId>,
}

impl StoredWorker {
    /// The server at `url` (normalised) registered as `spec`, under `id`
    /// if it has one yet.
    pub fn new(url: String, spec: WorkerSpec, id: Option<WorkerId>) -> Self {
        StoredWorker {
            url,
            worker_type: spec.role().as_str().to_string(),
            bootstrap_port: spec.bootstrap_port(),
            id,
        }
    }

    /// The spec to register it with; `None` for an unknown worker type.
    pub fn spec(&self) -> Option<WorkerSpec> {
        let role = Role::parse(&self.worker_type)?;
        Some(WorkerSpec::of(
            role,
            self.bootstrap_port.filter(|_| role == Role::Prefill),
        ))
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct StateDoc {
    version: u32,
    workers: Vec<StoredWorker>,
}

/// The registry's servers (once each, whatever their DP ranks).
pub fn snapshot(registry: &Registry) -> Vec<StoredWorker> {
    let mut out: Vec<StoredWorker> = Vec::new();
    for w in registry.all().iter() {
        if out.iter().any(|s| s.url == w.base_url) {
            continue;
        }
        out.push(StoredWorker::new(w.base_url.clone(), w.spec, Some(w.id)));
    }
    out
}

/// Reads the stored servers; a missing file is an empty fleet.
pub fn load(path: &Path) -> Result<Vec<StoredWorker>, StateError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StateError::Io(path.to_path_buf(), e)),
    };
    let doc: StateDoc =
        serde_json::from_slice(&bytes).map_err(|e| StateError::Format(path.to_path_buf(), e))?;
    Ok(doc.workers)
}

/// Writes `workers` atomically: a crash leaves the old file or the new one,
/// never half of one.
pub fn save(path: &Path, workers: &[StoredWorker]) -> Result<(), StateError> {
    let doc = StateDoc {
        version: 1,
        workers: workers.to_vec(),
    };
    let io = |e| StateError::Io(path.to_path_buf(), e);
    let text = serde_json::to_vec_pretty(&doc).map_err(|e| io(std::io::Error::other(e)))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::WorkerAddress;

    #[test]
    fn round_trips_servers_once_each() {
        let r = Registry::default();
        let address =
            |port: u16| WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        let prefill = WorkerSpec::Prefill {
            bootstrap_port: Some(8998),
        };
        r.add(address(1), prefill, Some(4)).unwrap();
        r.add(address(2), WorkerSpec::REGULAR, None).unwrap();
        let dir = std::env::temp_dir().join(format!("persist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("workers.json");
        // PIDs wrap: an earlier run's file under this name is not this run's.
        let _ = std::fs::remove_file(&path);
        assert!(load(&path).unwrap().is_empty(), "missing file = no workers");
        let snap = snapshot(&r);
        assert_eq!(snap.len(), 2);
        save(&path, &snap).unwrap();
        let back = load(&path).unwrap();
        assert_eq!(back, snap);
        assert_eq!(back[0].spec(), Some(prefill));
        assert!(back.iter().all(|w| w.id.is_some()), "ids are kept");
        // A file written before ids existed still loads.
        std::fs::write(
            &path,
            br#"{"version":1,"workers":[{"url":"http://127.0.0.1:3","worker_type":"regular"}]}"#,
        )
        .unwrap();
        assert_eq!(load(&path).unwrap()[0].id, None);
        std::fs::write(&path, b"{nope").unwrap();
        assert!(load(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
