//! Who may change the fleet through the admin API. Credentials, as
//! sglang-router takes them: the `--admin-token`, `--control-plane-api-keys`
//! (`keys.rs`) and JWTs from an OIDC issuer (`jwt.rs`); only an admin may
//! add or remove workers. `--control-plane-audit-enabled` logs every
//! attempt (`audit.rs`). The admin HTTP layer (`admin.rs`) asks
//! [`AdminAuth::authenticate`] and turns a [`Denial`] into its answer.

mod audit;
mod jwt;
mod keys;
#[cfg(test)]
mod tests;

pub use audit::{Audit, Outcome, TARGET as AUDIT_TARGET};
pub use jwt::JwtValidator;
pub use keys::ApiKeys;

use crate::config::AuthFlags;

/// What a principal may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything, including changing the fleet.
    Admin,
    /// Inference and reading only.
    User,
}

impl Role {
    /// `admin` or `user` (any case).
    pub fn parse(text: &str) -> Option<Role> {
        if text.eq_ignore_ascii_case("admin") {
            Some(Role::Admin)
        } else if text.eq_ignore_ascii_case("user") {
            Some(Role::User)
        } else {
            None
        }
    }
}

/// Someone who presented valid credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Who: the API key's id and name, the JWT's `sub`, or `admin-token`.
    pub id: String,
    /// How: `admin_token`, `api_key` or `jwt`.
    pub method: &'static str,
    /// What they may do.
    pub role: Role,
}

/// Why a change is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// No `Authorization: Bearer ...` at all.
    Missing,
    /// A JWT that does not validate (why).
    BadJwt(String),
    /// A token that is none of the configured credentials.
    Unknown,
    /// Valid credentials without the admin role.
    NotAdmin(Principal),
}

/// The admin API's credentials.
pub struct AdminAuth {
    token: Option<Box<str>>,
    keys: ApiKeys,
    jwt: Option<JwtValidator>,
    audit: Audit,
}

impl AdminAuth {
    /// From `--admin-token` and the control-plane authentication flags.
    pub fn from_flags(admin_token: Option<&str>, flags: &AuthFlags) -> Result<AdminAuth, String> {
        Ok(AdminAuth {
            token: admin_token.map(Box::from),
            keys: ApiKeys::parse(&flags.control_plane_api_keys)?,
            jwt: JwtValidator::from_flags(flags)?,
            audit: Audit::new(flags.control_plane_audit_enabled),
        })
    }

    /// True when some credential is configured. Without one, changes are
    /// served on the admin port only (see `admin.rs`).
    pub fn is_configured(&self) -> bool {
        self.token.is_some() || !self.keys.is_empty() || self.jwt.is_some()
    }

    /// The audit log.
    pub fn audit(&self) -> Audit {
        self.audit
    }

    /// Checks `bearer` (the token of `Authorization: Bearer`) and requires
    /// the admin role. A token shaped like a JWT is judged as one when JWTs
    /// are accepted, as sglang-router does, so a bad JWT is reported as such.
    pub async fn authenticate(&self, bearer: Option<&str>) -> Result<Principal, Denial> {
        let token = bearer
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(Denial::Missing)?;
        let principal = self.identify(token).await?;
        match principal.role {
            Role::Admin => Ok(principal),
            Role::User => Err(Denial::NotAdmin(principal)),
        }
    }

    async fn identify(&self, token: &str) -> Result<Principal, Denial> {
        if let Some(expected) = &self.token {
            if constant_time_eq(token.as_bytes(), expected.as_bytes()) {
                return Ok(Principal {
                    id: "admin-token".into(),
                    method: "admin_token",
                    role: Role::Admin,
                });
            }
        }
        if let Some(p) = self.keys.find(token) {
            return Ok(p);
        }
        if let Some(jwt) = &self.jwt {
            if token.split('.').count() == 3 {
                return jwt.validate(token).await.map_err(Denial::BadJwt);
            }
        }
        Err(Denial::Unknown)
    }
}

/// Compares without an early exit, so response time does not tell how much
/// of a guessed token was right.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}
