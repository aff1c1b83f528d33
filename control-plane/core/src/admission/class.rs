//! smg's priority classes (`--priority-scheduler-*`): what a request asks
//! for in `x-smg-priority`, clamped to what its tenant may have, and how
//! each class's queue behaves.

use std::time::Duration;

use serde::Deserialize;

/// A priority class, lowest first: the derived order is the priority, so
/// a tenant's clamp is `min(asked, allowed)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Batch work; served last.
    Bulk = 0,
    /// What a request without (or with an unknown) `x-smg-priority` gets.
    #[default]
    Default = 1,
    /// Latency-sensitive traffic.
    Interactive = 2,
    /// The highest; only tenants allowed it get it.
    System = 3,
}

/// Why a class name was not understood (flags and YAML only: a request's
/// header never fails, it falls back to `default` as smg's does).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown priority class {0:?} (system, interactive, default or bulk)")]
pub struct UnknownClass(pub String);

impl Class {
    /// All classes, lowest first.
    pub const ALL: [Class; 4] = [
        Class::Bulk,
        Class::Default,
        Class::Interactive,
        Class::System,
    ];

    /// The class a request's `x-smg-priority` asks for: case and
    /// surrounding blanks do not matter; anything else is `Default`, so a
    /// typo in an optional header never refuses a request.
    pub fn from_header(value: &str) -> Class {
        Class::from_name(value.trim()).unwrap_or(Class::Default)
    }

    /// A class by its name, for flags and configuration.
    pub fn from_name(name: &str) -> Result<Class, UnknownClass> {
        Class::ALL
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(name))
            .ok_or_else(|| UnknownClass(name.to_string()))
    }

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Bulk => "bulk",
            Class::Default => "default",
            Class::Interactive => "interactive",
            Class::System => "system",
        }
    }
}

impl std::str::FromStr for Class {
    type Err = UnknownClass;
    fn from_str(s: &str) -> Result<Class, UnknownClass> {
        Class::from_name(s)
    }
}

/// How one class's queue behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassQueue {
    /// Requests of this class that may wait; past it, 429.
    pub size: usize,
    /// Longest wait; past it, 408.
    pub timeout: Duration,
    /// A waiter at the head of this class's queue older than this goes
    /// before higher classes, so a busy high class cannot starve it.
    pub starvation: Duration,
}

impl ClassQueue {
    /// smg 1.13.0's built-in values for `class` (its scheduler's
    /// `ClassConfig` defaults), used unless the YAML overrides them.
    pub fn smg_default(class: Class) -> ClassQueue {
        let (size, timeout, starvation) = match class {
            Class::System => (64, 30, 5),
            Class::Interactive => (256, 30, 5),
            Class::Default => (512, 60, 30),
            Class::Bulk => (1024, 300, 120),
        };
        ClassQueue {
            size,
            timeout: Duration::from_secs(timeout),
            starvation: Duration::from_secs(starvation),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_never_fails_and_ignores_case_and_blanks() {
        assert_eq!(Class::from_header(" Interactive\t"), Class::Interactive);
        assert_eq!(Class::from_header("BULK"), Class::Bulk);
        assert_eq!(Class::from_header("urgent"), Class::Default);
        assert_eq!(Class::from_header(""), Class::Default);
    }

    #[test]
    fn the_order_is_the_priority() {
        assert!(Class::Bulk < Class::Default && Class::Default < Class::Interactive);
        assert!(Class::Interactive < Class::System);
        assert!(Class::from_name("urgent").is_err());
    }
}
