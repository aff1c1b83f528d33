//! The admin API's credentials against a real JWKS server on loopback and
//! tokens signed here (ES256, keys made at run time).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::routing::get;
use axum::{Json, Router};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{json, Value};

use super::{AdminAuth, Denial, Role};
use crate::config::AuthFlags;

/// An ES256 signing key and its public JWK.
struct Signer {
    key: EncodingKey,
    jwk: Value,
    kid: String,
}

impl Signer {
    fn new(kid: &str) -> Signer {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let raw = pair.public_key_raw();
        // Uncompressed point: 0x04, then x and y, 32 bytes each.
        let (x, y) = raw[1..].split_at(32);
        Signer {
            key: EncodingKey::from_ec_der(&pair.serialize_der()),
            jwk: json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
                        "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y)}),
            kid: kid.to_string(),
        }
    }

    fn token(&self, claims: Value) -> String {
        let mut header = Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        encode(&header, &claims, &self.key).unwrap()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Serves `/.well-known/openid-configuration` and `/jwks` with the
/// signers' keys; counts JWKS fetches. Returns the issuer URL.
async fn idp(keys: Vec<Value>, fetches: Arc<AtomicUsize>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let jwks_uri = format!("{base}/jwks");
    let app = Router::new()
        .route(
            "/.well-known/openid-configuration",
            get(move || {
                let uri = jwks_uri.clone();
                async move { Json(json!({"jwks_uri": uri})) }
            }),
        )
        .route(
            "/jwks",
            get(move || {
                fetches.fetch_add(1, Ordering::SeqCst);
                let keys = keys.clone();
                async move { Json(json!({ "keys": keys })) }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

fn flags(issuer: &str) -> AuthFlags {
    AuthFlags {
        control_plane_api_keys: vec!["ci:CI:admin:ci-key".into(), "mon:Mon:user:mon-key".into()],
        control_plane_audit_enabled: true,
        jwt_issuer: Some(issuer.to_string()),
        jwt_audience: Some("sglang-envoy".into()),
        jwt_jwks_uri: None,
        jwt_role_mapping: vec!["Gateway.Admin=admin".into(), "Gateway.User=user".into()],
    }
}

fn claims(issuer: &str, roles: &[&str]) -> Value {
    json!({"iss": issuer, "aud": "sglang-envoy", "sub": "alice", "exp": now() + 600, "roles": roles})
}

#[tokio::test]
async fn jwts_of_the_issuer_are_judged_by_signature_claims_and_role() {
    let signer = Signer::new("k1");
    let stranger = Signer::new("k1");
    let fetches = Arc::new(AtomicUsize::new(0));
    let issuer = idp(vec![signer.jwk.clone()], fetches.clone()).await;
    let auth = AdminAuth::from_flags(None, &flags(&issuer)).unwrap();

    let admin = signer.token(claims(&issuer, &["Gateway.Admin"]));
    let who = auth.authenticate(Some(&admin)).await.unwrap();
    assert_eq!(
        (who.id.as_str(), who.method, who.role),
        ("alice", "jwt", Role::Admin)
    );

    let user = signer.token(claims(&issuer, &["Gateway.User"]));
    assert!(
        matches!(auth.authenticate(Some(&user)).await, Err(Denial::NotAdmin(p)) if p.role == Role::User)
    );

    let mut wrong_aud = claims(&issuer, &["Gateway.Admin"]);
    wrong_aud["aud"] = json!("someone-else");
    let mut wrong_iss = claims(&issuer, &["Gateway.Admin"]);
    wrong_iss["iss"] = json!("https://elsewhere");
    let mut expired = claims(&issuer, &["Gateway.Admin"]);
    expired["exp"] = json!(now() - 3600);
    for (what, token) in [
        ("audience", signer.token(wrong_aud)),
        ("issuer", signer.token(wrong_iss)),
        ("expiry", signer.token(expired)),
        (
            "signature",
            stranger.token(claims(&issuer, &["Gateway.Admin"])),
        ),
    ] {
        let r = auth.authenticate(Some(&token)).await;
        assert!(matches!(r, Err(Denial::BadJwt(_))), "{what}: {r:?}");
    }
    // A shared-secret token is refused whatever it claims.
    let hs = encode(
        &Header::default(),
        &claims(&issuer, &["Gateway.Admin"]),
        &EncodingKey::from_secret(b"guess"),
    )
    .unwrap();
    assert!(
        matches!(auth.authenticate(Some(&hs)).await, Err(Denial::BadJwt(e)) if e.contains("HS256"))
    );
    // The keys were found through discovery and fetched once.
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn unknown_key_ids_fetch_the_keys_again_at_most_every_ten_seconds() {
    let signer = Signer::new("k1");
    let fetches = Arc::new(AtomicUsize::new(0));
    let issuer = idp(vec![signer.jwk.clone()], fetches.clone()).await;
    let auth = AdminAuth::from_flags(None, &flags(&issuer)).unwrap();
    let rotated = Signer::new("k2");
    for _ in 0..20 {
        let r = auth
            .authenticate(Some(&rotated.token(claims(&issuer, &["Gateway.Admin"]))))
            .await;
        assert!(matches!(r, Err(Denial::BadJwt(_))), "{r:?}");
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn admin_token_and_api_keys_need_the_admin_role() {
    let auth = AdminAuth::from_flags(
        Some("root-token"),
        &AuthFlags {
            control_plane_api_keys: vec![
                "ci:CI:admin:ci-key".into(),
                "mon:Mon:user:mon-key".into(),
            ],
            ..AuthFlags::default()
        },
    )
    .unwrap();
    assert!(auth.is_configured());
    assert_eq!(
        auth.authenticate(Some("root-token")).await.unwrap().method,
        "admin_token"
    );
    assert_eq!(
        auth.authenticate(Some("ci-key")).await.unwrap().role,
        Role::Admin
    );
    assert!(matches!(
        auth.authenticate(Some("mon-key")).await,
        Err(Denial::NotAdmin(_))
    ));
    assert_eq!(auth.authenticate(None).await, Err(Denial::Missing));
    assert_eq!(auth.authenticate(Some("  ")).await, Err(Denial::Missing));
    assert_eq!(
        auth.authenticate(Some("ci-key2")).await,
        Err(Denial::Unknown)
    );
    // Without --jwt-issuer a JWT-shaped token is just an unknown token.
    assert_eq!(auth.authenticate(Some("a.b.c")).await, Err(Denial::Unknown));
    assert!(!AdminAuth::from_flags(None, &AuthFlags::default())
        .unwrap()
        .is_configured());
}

#[test]
fn bad_flags_are_refused_with_their_name() {
    for (f, says) in [
        (
            AuthFlags {
                jwt_audience: Some("a".into()),
                ..AuthFlags::default()
            },
            "need --jwt-issuer",
        ),
        (
            AuthFlags {
                jwt_issuer: Some("https://idp".into()),
                jwt_role_mapping: vec!["Admins".into()],
                ..AuthFlags::default()
            },
            "--jwt-role-mapping takes",
        ),
        (
            AuthFlags {
                jwt_issuer: Some("https://idp".into()),
                jwt_role_mapping: vec!["Admins=root".into()],
                ..AuthFlags::default()
            },
            "admin or user",
        ),
        (
            AuthFlags {
                control_plane_api_keys: vec!["x".into()],
                ..AuthFlags::default()
            },
            "--control-plane-api-keys",
        ),
    ] {
        let e = AdminAuth::from_flags(None, &f).err().unwrap();
        assert!(e.contains(says), "{e}");
    }
}

#[tokio::test]
async fn an_explicit_jwks_uri_is_used_instead_of_discovery() {
    let signer = Signer::new("k1");
    let fetches = Arc::new(AtomicUsize::new(0));
    let served = idp(vec![signer.jwk.clone()], fetches.clone()).await;
    // The issuer named in tokens has no discovery document at all.
    let issuer = "https://idp.invalid/realms/x";
    let auth = AdminAuth::from_flags(
        None,
        &AuthFlags {
            jwt_jwks_uri: Some(format!("{served}/jwks")),
            ..flags(issuer)
        },
    )
    .unwrap();
    let token = signer.token(claims(issuer, &["Gateway.Admin"]));
    assert_eq!(
        auth.authenticate(Some(&token)).await.unwrap().role,
        Role::Admin
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
}
