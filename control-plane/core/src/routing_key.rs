//! A client's sticky-session key (`X-SMG-Routing-Key`), as the policies and
//! the load accounting see it.
//!
//! Only a 64-bit hash of the header is kept, never the header itself: the
//! `manual` policy remembers every key for hours (`--max-idle-secs`), and a
//! key's memory must not grow with what a client chose to send (headers may
//! be tens of KiB). The hash is keyed with a secret drawn once per process,
//! so clients cannot craft two keys that share an entry; accidental
//! collisions are about n²/2⁶⁵ for n keys.

use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

/// The hash of one non-empty routing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoutingKey(u64);

impl RoutingKey {
    /// The key a request's header value stands for; `None` for an absent or
    /// empty header (sglang-router treats both as "no key").
    pub fn from_header(value: &str) -> Option<RoutingKey> {
        if value.is_empty() {
            return None;
        }
        static SECRET: OnceLock<RandomState> = OnceLock::new();
        Some(RoutingKey(
            SECRET.get_or_init(RandomState::new).hash_one(value),
        ))
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
    }
}
