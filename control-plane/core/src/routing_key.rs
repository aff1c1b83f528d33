//! A client's sticky-session key (`X-SMG-Routing-Key`), as the policies and
//! the load accounting see it.
//!
//! Only 64-bit hashes of the header are kept, never the header itself: the
//! `manual` policy remembers every key for hours (`--max-idle-secs`), and a
//! key's memory must not grow with what a client chose to send (headers may
//! be tens of KiB). The hash is keyed with a secret drawn once per process,
//! so clients cannot craft two keys that share an entry; accidental
//! collisions are about n²/2⁶⁵ for n keys.
//!
//! A second, unkeyed hash of the same text ([`RoutingKey::placement`])
//! places the key on a worker for `consistent_hashing`: that placement must
//! be the same in every control plane and after a restart, which a
//! per-process secret would break. It is never a map key, so its lack of a
//! secret lets no client crowd a map.

use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

use crate::stable_hash::stable_hash;

/// The hashes of one non-empty routing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoutingKey {
    /// Keyed with the process's secret: what maps of keys are keyed by.
    keyed: u64,
    /// The same in every process: where the key is placed.
    placement: u64,
}

impl RoutingKey {
    /// The key a request's header value stands for; `None` for an absent or
    /// empty header (sglang-router treats both as "no key").
    pub fn from_header(value: &str) -> Option<RoutingKey> {
        if value.is_empty() {
            return None;
        }
        static SECRET: OnceLock<RandomState> = OnceLock::new();
        Some(RoutingKey {
            keyed: SECRET.get_or_init(RandomState::new).hash_one(value),
            placement: stable_hash(value.as_bytes()),
        })
    }

    /// The key's stable hash (the same in every process), for placing it
    /// on a worker.
    pub fn placement(&self) -> u64 {
        self.placement
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_text_same_key_and_empty_is_none() {
        assert_eq!(RoutingKey::from_header(""), None);
        let a = RoutingKey::from_header("user-1");
        assert!(a.is_some());
        assert_eq!(a, RoutingKey::from_header("user-1"));
        assert_ne!(a, RoutingKey::from_header("user-2"));
        assert_ne!(
            a,
            RoutingKey::from_header("User-1"),
            "keys are case-sensitive"
        );
        let a = a.unwrap();
        assert_eq!(
            a.placement(),
            stable_hash(b"user-1"),
            "placement is unkeyed"
        );
    }
}
