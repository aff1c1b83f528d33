use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use sglang_envoy_body::WireProfile;
use sglang_envoy_lifecycle::ClientKey;
use sglang_envoy_proto::{PrefillEndpoint, WorkersSnapshot};

/// What the filter knows to keep routing while the control plane is
/// unreachable: the last list of healthy workers it published, refreshed
/// on a timer by the root context. One per wasm VM, shared by its streams.
#[derive(Clone, Default)]
pub struct Fallback(Rc<Inner>);

#[derive(Default)]
struct Inner {
    snapshot: RefCell<Option<(SystemTime, WorkersSnapshot)>>,
    turn: Cell<usize>,
}

/// A locally chosen destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalChoice {
    /// The chosen endpoint first, then the others to retry on.
    pub endpoints: Vec<String>,
    /// PD mode: the prefill worker the filter must send the prefill half to.
    pub prefill: Option<PrefillEndpoint>,
    /// The field dialect of the chosen serving worker and of the prefill
    /// worker, as the control plane last said (see [`profile_of`]).
    pub profiles: Profiles,
}

/// The wire profiles of the two halves of a locally routed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Profiles {
    /// The worker the request goes to (the decode worker in PD mode).
    pub serving: WireProfile,
    /// PD mode: the prefill worker.
    pub prefill: WireProfile,
}

/// The profile the snapshot gives `endpoint`; the body crate's default when
/// it gives none (a control plane from before profiles).
pub fn profile_of(snapshot: &WorkersSnapshot, endpoint: &str) -> WireProfile {
    use sglang_envoy_proto::WireProfile as Code;
    match snapshot
        .wire_profiles
        .get(endpoint)
        .and_then(|c| Code::try_from(*c).ok())
    {
        Some(Code::Legacy) => WireProfile::Legacy,
        Some(Code::Upstream) => WireProfile::Upstream,
        Some(Code::Unspecified) | None => WireProfile::default(),
    }
}

impl Fallback {
    /// `--api-key`'s digest as the control plane last said, however old
    /// the list: a key once required stays required while it is away.
    pub fn client_key(&self) -> Option<ClientKey> {
        self.0
            .snapshot
            .borrow()
            .as_ref()
            .and_then(|(_, s)| ClientKey::from_digest(&s.client_key_sha256))
    }

    /// The tenant header the control plane trusts (`--tenant-header-name`
    /// with `--trust-tenant-header`), lower-cased; `None` when it trusts
    /// none or has not said yet.
    pub fn tenant_header(&self) -> Option<String> {
        self.0
            .snapshot
            .borrow()
            .as_ref()
            .map(|(_, s)| s.tenant_header.to_ascii_lowercase())
            .filter(|h| !h.is_empty())
    }

    /// `--max-payload-size` as the control plane last said, if it did.
    pub fn max_body_bytes(&self) -> Option<usize> {
        self.0
            .snapshot
            .borrow()
            .as_ref()
            .map(|(_, s)| s.max_body_bytes)
            .filter(|n| *n > 0)
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Stores a fresh list of workers, received at `now`.
    pub fn update(&self, now: SystemTime, snapshot: WorkersSnapshot) {
        *self.0.snapshot.borrow_mut() = Some((now, snapshot));
    }

    /// Round robin over the last known healthy servers (and, in PD mode,
    /// prefill servers), if that list is younger than `max_age`.
    pub fn choose(
        &self,
        now: SystemTime,
        max_age: Duration,
        retries: usize,
    ) -> Option<LocalChoice> {
        let guard = self.0.snapshot.borrow();
        let (at, snapshot) = guard.as_ref()?;
        let age = now.duration_since(*at).unwrap_or_default();
        if age > max_age || snapshot.serving.is_empty() {
            return None;
        }
        if snapshot.pd && snapshot.prefill.is_empty() {
            return None;
        }
        let turn = self.0.turn.get();
        self.0.turn.set(turn.wrapping_add(1));
        let n = snapshot.serving.len();
        let endpoints: Vec<String> = (0..n.min(retries + 1))
            .map(|i| snapshot.serving[(turn + i) % n].clone())
            .collect();
        let prefill = snapshot
            .pd
            .then(|| snapshot.prefill[turn % snapshot.prefill.len()].clone());
        let profiles = Profiles {
            serving: endpoints
                .first()
                .map(|e| profile_of(snapshot, e))
                .unwrap_or_default(),
            prefill: prefill
                .as_ref()
                .map(|p| profile_of(snapshot, &p.endpoint))
                .unwrap_or_default(),
        };
        Some(LocalChoice {
            endpoints,
            prefill,
            profiles,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(serving: &[&str], pd: bool) -> WorkersSnapshot {
        WorkersSnapshot {
            pd,
            serving: serving.iter().map(|s| s.to_string()).collect(),
            prefill: Vec::new(),
            wire_profiles: Default::default(),
            client_key_sha256: Vec::new(),
            max_body_bytes: 0,
            tenant_header: String::new(),
        }
    }

    #[test]
    fn the_tenant_header_is_the_one_the_control_plane_trusts() {
        let f = Fallback::default();
        assert_eq!(f.tenant_header(), None, "nothing known yet");
        let mut s = snapshot(&["a:1"], false);
        s.tenant_header = "X-Team".to_string();
        f.update(SystemTime::UNIX_EPOCH, s);
        // Lower-cased, as Envoy hands headers to the filter.
        assert_eq!(f.tenant_header().as_deref(), Some("x-team"));
        f.update(SystemTime::UNIX_EPOCH, snapshot(&["a:1"], false));
        assert_eq!(f.tenant_header(), None, "trusted no longer");
    }

    #[test]
    fn the_client_key_comes_from_the_last_snapshot_however_old() {
        let f = Fallback::default();
        assert_eq!(f.client_key(), None, "nothing known yet");
        let mut s = snapshot(&["a:1"], false);
        let key = ClientKey::from_key("k");
        s.client_key_sha256 = key.digest().to_vec();
        f.update(SystemTime::UNIX_EPOCH, s);
        assert_eq!(f.client_key(), Some(key));
        f.update(SystemTime::UNIX_EPOCH, snapshot(&["a:1"], false));
        assert_eq!(f.client_key(), None, "no longer required");
    }

    #[test]
    fn round_robin_over_a_recent_list_only() {
        let f = Fallback::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let age = Duration::from_secs(60);
        assert_eq!(f.choose(t0, age, 2), None, "nothing known yet");
        f.update(t0, snapshot(&["a:1", "b:2", "c:3"], false));
        let firsts: Vec<String> = (0..3)
            .map(|_| f.choose(t0, age, 2).unwrap().endpoints[0].clone())
            .collect();
        assert_eq!(firsts, ["a:1", "b:2", "c:3"]);
        assert_eq!(f.choose(t0, age, 1).unwrap().endpoints, ["a:1", "b:2"]);
        let later = t0 + Duration::from_secs(61);
        assert_eq!(f.choose(later, age, 2), None, "too old to trust");
        f.update(t0, snapshot(&["a:1"], true));
        assert_eq!(f.choose(t0, age, 2), None, "PD without prefill workers");
        let mut pd = snapshot(&["d:1", "d:2"], true);
        pd.prefill = vec![PrefillEndpoint {
            endpoint: "p:1".into(),
            host: "p".into(),
            bootstrap_port: 8998,
        }];
        f.update(t0, pd);
        let c = f.choose(t0, age, 0).unwrap();
        assert_eq!(c.endpoints.len(), 1);
        assert_eq!(c.prefill.map(|p| p.endpoint), Some("p:1".to_string()));
    }

    #[test]
    fn profiles_come_from_the_snapshot_else_the_default() {
        let f = Fallback::default();
        let t0 = SystemTime::UNIX_EPOCH;
        let mut pd = snapshot(&["d:1"], true);
        pd.prefill = vec![PrefillEndpoint {
            endpoint: "p:1".into(),
            host: "p".into(),
            bootstrap_port: 0,
        }];
        f.update(t0, pd.clone());
        let c = f.choose(t0, Duration::from_secs(1), 0).unwrap();
        assert_eq!(c.profiles, Profiles::default(), "not said: the default");
        pd.wire_profiles = [
            (
                "d:1".to_string(),
                sglang_envoy_proto::WireProfile::Legacy as i32,
            ),
            (
                "p:1".to_string(),
                sglang_envoy_proto::WireProfile::Upstream as i32,
            ),
        ]
        .into();
        f.update(t0, pd);
        let c = f.choose(t0, Duration::from_secs(1), 0).unwrap();
        assert_eq!(c.profiles.serving, WireProfile::Legacy);
        assert_eq!(c.profiles.prefill, WireProfile::Upstream);
    }
}
