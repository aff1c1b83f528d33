//! A registered server's identity in the `/workers` API: a random (version 4)
//! UUID, as sglang-router gives its workers, kept in the `--state-file` so
//! it survives restarts.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A server's id; all DP-rank units of a server share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkerId(u128);

/// Why a text is not a worker id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a worker id (expected a UUID such as 67e55044-10b1-426f-9247-bb680e5fe0c8)")]
pub struct BadWorkerId(pub String);

impl WorkerId {
    /// A fresh random id (UUID version 4, RFC 9562 variant).
    pub fn random() -> WorkerId {
        let bits: u128 = rand::random();
        // Version 4 in bits 48..52 from the top, variant 0b10 in bits 64..66.
        let version = (bits & !(0xf << 76)) | (0x4 << 76);
        WorkerId((version & !(0x3 << 62)) | (0x2 << 62))
    }
}

impl fmt::Display for WorkerId {
    /// The usual lower-case `8-4-4-4-12` form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        write!(
            f,
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            v >> 96,
            (v >> 80) & 0xffff,
            (v >> 64) & 0xffff,
            (v >> 48) & 0xffff,
            v & 0xffff_ffff_ffff
        )
    }
}

impl FromStr for WorkerId {
    type Err = BadWorkerId;

    /// The `8-4-4-4-12` form (any case), or the 32 digits without hyphens.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadWorkerId(text.chars().take(64).filter(|c| !c.is_control()).collect());
        let hyphenated = text.len() == 36
            && [8, 13, 18, 23]
                .iter()
                .all(|&i| text.as_bytes().get(i) == Some(&b'-'));
        let digits: String = if hyphenated {
            text.chars().filter(|&c| c != '-').collect()
        } else {
            text.to_string()
        };
        if digits.len() != 32 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        u128::from_str_radix(&digits, 16)
            .map(WorkerId)
            .map_err(|_| bad())
    }
}

impl Serialize for WorkerId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for WorkerId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_version_4_uuids_and_round_trip() {
        let a = WorkerId::random();
        let text = a.to_string();
        assert_eq!(text.len(), 36);
        assert_eq!(&text[14..15], "4", "version nibble: {text}");
        assert!(
            matches!(&text[19..20], "8" | "9" | "a" | "b"),
            "variant: {text}"
        );
        assert_eq!(text.parse::<WorkerId>(), Ok(a));
        assert_eq!(text.to_uppercase().parse::<WorkerId>(), Ok(a));
        assert_eq!(text.replace('-', "").parse::<WorkerId>(), Ok(a));
        assert_ne!(a, WorkerId::random());
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<WorkerId>(&json).unwrap(), a);
    }

    #[test]
    fn known_text_and_garbage() {
        let id: WorkerId = "67e55044-10b1-426f-9247-bb680e5fe0c8".parse().unwrap();
        assert_eq!(id.to_string(), "67e55044-10b1-426f-9247-bb680e5fe0c8");
        for bad in [
            "",
            "not-a-uuid",
            "67e55044-10b1-426f-9247-bb680e5fe0c",
            "67e55044-10b1-426f-9247-bb680e5fe0c8a",
            "67e5504410b1-426f-9247-bb680e5fe0c8-",
            "g7e55044-10b1-426f-9247-bb680e5fe0c8",
            "+7e55044-10b1-426f-9247-bb680e5fe0c8",
            "http://127.0.0.1:8000",
        ] {
            assert!(bad.parse::<WorkerId>().is_err(), "{bad} accepted");
        }
        assert!(serde_json::from_str::<WorkerId>("\"x\"").is_err());
    }
}
