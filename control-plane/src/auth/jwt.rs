//! `--jwt-issuer`, `--jwt-audience`, `--jwt-jwks-uri`, `--jwt-role-mapping`:
//! JWTs from an OIDC provider accepted by the admin API, as sglang-router
//! accepts them. The issuer's public keys (JWKS) are fetched over HTTP and
//! kept; an unknown key id fetches them again, at most every
//! [`REFETCH_EVERY`], so a client cannot make the control plane hammer the
//! provider.

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use parking_lot::RwLock;
use serde_json::Value;

use super::{Principal, Role};
use crate::config::AuthFlags;

/// Shortest time between two fetches of the JWKS.
pub const REFETCH_EVERY: Duration = Duration::from_secs(10);

/// Signature algorithms accepted: public-key ones only (a shared-secret
/// HS* token could be forged by anyone who knows the JWKS).
const ALGORITHMS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Claims a role may be read from, in the order sglang-router reads them.
const ROLE_CLAIMS: &[&str] = &["roles", "role", "groups", "group"];

/// Checks JWTs against one issuer's keys.
pub struct JwtValidator {
    issuer: String,
    audience: Option<String>,
    jwks_uri: Option<String>,
    role_mapping: Vec<(String, Role)>,
    http: reqwest::Client,
    keys: RwLock<JwkSet>,
    /// When the keys were last asked for (serialises fetches too).
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
}

impl JwtValidator {
    /// A validator for the flags, or `None` without `--jwt-issuer`.
    pub fn from_flags(flags: &AuthFlags) -> Result<Option<JwtValidator>, String> {
        let Some(issuer) = flags.jwt_issuer.clone() else {
            if flags.jwt_audience.is_some() || flags.jwt_jwks_uri.is_some() {
                return Err("--jwt-audience and --jwt-jwks-uri need --jwt-issuer".into());
            }
            return Ok(None);
        };
        let role_mapping = flags
            .jwt_role_mapping
            .iter()
            .map(|m| {
                let (idp, ours) = m.split_once('=').ok_or_else(|| {
                    format!("--jwt-role-mapping takes `idp_role=gateway_role`, got `{m}`")
                })?;
                let role = Role::parse(ours).ok_or_else(|| {
                    format!("--jwt-role-mapping: gateway role must be admin or user, got `{ours}`")
                })?;
                Ok((idp.to_string(), role))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("JWKS client: {e}"))?;
        Ok(Some(JwtValidator {
            issuer,
            audience: flags.jwt_audience.clone(),
            jwks_uri: flags.jwt_jwks_uri.clone(),
            role_mapping,
            http,
            keys: RwLock::new(JwkSet { keys: Vec::new() }),
            last_fetch: tokio::sync::Mutex::new(None),
        }))
    }

    /// The token's holder, or why the token is refused.
    pub async fn validate(&self, token: &str) -> Result<Principal, String> {
        let header = decode_header(token).map_err(|e| format!("not a JWT: {e}"))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(format!("algorithm {:?} is not accepted", header.alg));
        }
        let key = match self.key(header.kid.as_deref()) {
            Some(k) => k,
            None => {
                self.refresh().await?;
                self.key(header.kid.as_deref())
                    .ok_or_else(|| "no key of the issuer's JWKS signed this token".to_string())?
            }
        };
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_required_spec_claims(&["exp", "iss"]);
        match &self.audience {
            Some(aud) => validation.set_audience(&[aud]),
            None => validation.validate_aud = false,
        }
        let data = decode::<Value>(token, &key, &validation).map_err(|e| e.to_string())?;
        let subject = data
            .claims
            .get("sub")
            .and_then(Value::as_str)
            .unwrap_or("(no sub)")
            .to_string();
        Ok(Principal {
            id: subject,
            method: "jwt",
            role: self.role_of(&data.claims),
        })
    }

    /// The key `kid` names (or the only key, when the token names none).
    fn key(&self, kid: Option<&str>) -> Option<DecodingKey> {
        let keys = self.keys.read();
        let jwk = match kid {
            Some(kid) => keys.find(kid),
            None if keys.keys.len() == 1 => keys.keys.first(),
            None => None,
        }?;
        DecodingKey::from_jwk(jwk).ok()
    }

    /// Fetches the JWKS again, unless it was asked for less than
    /// [`REFETCH_EVERY`] ago.
    async fn refresh(&self) -> Result<(), String> {
        let mut last = self.last_fetch.lock().await;
        if last.is_some_and(|t| t.elapsed() < REFETCH_EVERY) {
            return Ok(());
        }
        *last = Some(Instant::now());
        let set = self.fetch().await?;
        *self.keys.write() = set;
        Ok(())
    }

    async fn fetch(&self) -> Result<JwkSet, String> {
        let uri = match &self.jwks_uri {
            Some(u) => u.clone(),
            None => {
                let discovery = format!(
                    "{}/.well-known/openid-configuration",
                    self.issuer.trim_end_matches('/')
                );
                let doc: Value = self.get_json(&discovery).await?;
                doc.get("jwks_uri")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("{discovery} names no jwks_uri"))?
                    .to_string()
            }
        };
        self.get_json(&uri).await
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, String> {
        let response = self
            .http
            .get(url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| format!("fetching {url}: {e}"))?;
        response
            .json()
            .await
            .map_err(|e| format!("reading {url}: {e}"))
    }

    /// Admin when one of the token's roles maps to admin (or, without a
    /// mapping, is `admin` itself); user otherwise.
    fn role_of(&self, claims: &Value) -> Role {
        let names = ROLE_CLAIMS
            .iter()
            .filter_map(|c| claims.get(*c))
            .flat_map(|v| match v {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            });
        for name in names {
            let role = if self.role_mapping.is_empty() {
                Role::parse(name)
            } else {
                self.role_mapping
                    .iter()
                    .find(|(idp, _)| idp == name)
                    .map(|(_, r)| *r)
            };
            if role == Some(Role::Admin) {
                return Role::Admin;
            }
        }
        Role::User
    }
}
