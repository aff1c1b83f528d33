//! `--control-plane-api-keys`: named keys with a role, as sglang-router
//! takes them (`id:name:role:key`). Only a key's SHA-256 is kept, and a
//! presented token is compared digest to digest without an early exit.

use ring::digest::{digest, SHA256};

use super::{Principal, Role};

/// One configured key.
#[derive(Debug, Clone)]
struct Entry {
    id: String,
    name: String,
    role: Role,
    sha256: Vec<u8>,
}

/// The configured keys.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys {
    entries: Vec<Entry>,
}

impl ApiKeys {
    /// Parses `id:name:role:key` entries (the key is everything after the
    /// third colon, so it may hold colons itself).
    pub fn parse(specs: &[String]) -> Result<ApiKeys, String> {
        let mut entries = Vec::with_capacity(specs.len());
        for spec in specs {
            let mut parts = spec.splitn(4, ':');
            let (Some(id), Some(name), Some(role), Some(key)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(format!(
                    "--control-plane-api-keys takes `id:name:role:key`, got an entry with {} part(s)",
                    spec.split(':').count()
                ));
            };
            let role = Role::parse(role).ok_or_else(|| {
                format!(
                    "--control-plane-api-keys: role of `{id}` must be admin or user, got `{role}`"
                )
            })?;
            if id.is_empty() || key.is_empty() {
                return Err(
                    "--control-plane-api-keys: an entry's id and key must not be empty".into(),
                );
            }
            if entries.iter().any(|e: &Entry| e.id == id) {
                return Err(format!(
                    "--control-plane-api-keys: id `{id}` is given twice"
                ));
            }
            entries.push(Entry {
                id: id.to_string(),
                name: name.to_string(),
                role,
                sha256: digest(&SHA256, key.as_bytes()).as_ref().to_vec(),
            });
        }
        Ok(ApiKeys { entries })
    }

    /// True when no key is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The key's holder, when `token` is one of the keys. Every entry is
    /// compared, so the time taken does not say which one matched.
    pub fn find(&self, token: &str) -> Option<Principal> {
        let presented = digest(&SHA256, token.as_bytes());
        let mut found = None;
        for e in &self.entries {
            if super::constant_time_eq(presented.as_ref(), &e.sha256) && found.is_none() {
                found = Some(Principal {
                    id: format!("{} ({})", e.id, e.name),
                    method: "api_key",
                    role: e.role,
                });
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(specs: &[&str]) -> Result<ApiKeys, String> {
        ApiKeys::parse(&specs.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn entries_are_found_by_key_with_their_role() {
        let k = keys(&["ci:CI pipeline:admin:s3:cret", "mon:Prometheus:user:watch"]).unwrap();
        let admin = k.find("s3:cret").unwrap();
        assert_eq!(admin.role, Role::Admin);
        assert_eq!(admin.id, "ci (CI pipeline)");
        assert_eq!(k.find("watch").unwrap().role, Role::User);
        assert!(k.find("s3").is_none());
        assert!(k.find("").is_none());
    }

    #[test]
    fn malformed_entries_are_refused_by_name() {
        for (spec, says) in [
            ("ci:admin:secret", "`id:name:role:key`"),
            ("ci:CI:root:secret", "admin or user"),
            (":CI:admin:secret", "must not be empty"),
            ("ci:CI:admin:", "must not be empty"),
        ] {
            let e = keys(&[spec]).unwrap_err();
            assert!(e.contains(says), "{spec}: {e}");
        }
        let e = keys(&["a:A:admin:x", "a:B:user:y"]).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
    }
}
