//! sglang-router's control-plane credentials through Envoy: a launch line
//! with `--jwt-*`, `--control-plane-api-keys` and
//! `--control-plane-audit-enabled` starts the control plane; changing the
//! fleet through Envoy's client port then takes an admin JWT of the issuer
//! (keys fetched from a small OIDC provider run here) or an admin API key,
//! and every attempt is audited.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::routing::get;
use axum::{Json, Router};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;
use sglang_envoy_e2e::{
    expect_bearer_challenge, expect_openai_error, SimWorker, Stack, StackOptions,
};

const AUDIENCE: &str = "sglang-envoy-e2e";

/// An OIDC provider: discovery, a JWKS with one ES256 key, and tokens
/// signed with it.
struct Idp {
    issuer: String,
    key: EncodingKey,
    jwks_fetches: Arc<AtomicUsize>,
}

impl Idp {
    async fn start() -> Idp {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let raw = pair.public_key_raw();
        let (x, y) = raw[1..].split_at(32);
        let jwk = json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": "e2e",
                         "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y)});
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}/realms/e2e", listener.local_addr().unwrap());
        let jwks_uri = format!("{issuer}/protocol/openid-connect/certs");
        let fetches = Arc::new(AtomicUsize::new(0));
        let counted = fetches.clone();
        let app = Router::new()
            .route(
                "/realms/e2e/.well-known/openid-configuration",
                get(move || {
                    let uri = jwks_uri.clone();
                    async move { Json(json!({ "jwks_uri": uri })) }
                }),
            )
            .route(
                "/realms/e2e/protocol/openid-connect/certs",
                get(move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let jwk = jwk.clone();
                    async move { Json(json!({ "keys": [jwk] })) }
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Idp {
            issuer,
            key: EncodingKey::from_ec_der(&pair.serialize_der()),
            jwks_fetches: fetches,
        }
    }

    /// A token for `sub` with `roles`, valid for `ttl_secs` (negative:
    /// expired that long ago).
    fn token(&self, sub: &str, roles: &[&str], ttl_secs: i64) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("e2e".into());
        let claims = json!({"iss": self.issuer, "aud": AUDIENCE, "sub": sub,
                            "exp": now + ttl_secs, "roles": roles});
        encode(&header, &claims, &self.key).unwrap()
    }
}

#[tokio::test]
async fn admin_jwts_and_api_keys_guard_the_fleet_through_envoy() {
    let idp = Idp::start().await;
    // A launch line as sglang-router's authentication docs write it.
    let cp_args: Vec<String> = [
        "--jwt-issuer",
        &idp.issuer,
        "--jwt-audience",
        AUDIENCE,
        "--jwt-role-mapping",
        "Gateway.Admin=admin",
        "Gateway.User=user",
        "--control-plane-api-keys",
        "ci:CI pipeline:admin:ci-secret-1",
        "mon:Monitoring:user:mon-secret-2",
        "--control-plane-audit-enabled",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let stack = Stack::start(StackOptions {
        workers: 1,
        cp_args,
        ..Default::default()
    })
    .await
    .unwrap();
    let extra = SimWorker::start(&stack.dir, &[]).await.unwrap();
    let client = reqwest::Client::new();
    let add = || {
        client
            .post(stack.url("/workers"))
            .json(&json!({ "url": extra.url }))
    };

    // No credential: a JSON 401 asking for a bearer token.
    expect_bearer_challenge(add().send().await.unwrap()).await;
    // Tokens of the issuer that are not good enough.
    let expired = idp.token("alice", &["Gateway.Admin"], -600);
    let message = expect_openai_error(add().bearer_auth(expired).send().await.unwrap(), 401).await;
    assert!(message.contains("JWT"), "{message}");
    let user = idp.token("bob", &["Gateway.User"], 600);
    expect_openai_error(add().bearer_auth(user).send().await.unwrap(), 403).await;
    expect_openai_error(add().bearer_auth("mon-secret-2").send().await.unwrap(), 403).await;
    expect_openai_error(add().bearer_auth("ci-secret-").send().await.unwrap(), 403).await;
    let listed = stack.get_json("/list_workers").await;
    assert_eq!(listed["urls"].as_array().unwrap().len(), 1, "{listed}");

    // An admin JWT adds the worker, an admin API key removes it.
    let admin = idp.token("alice", &["Gateway.Admin", "Other"], 600);
    let r = add().bearer_auth(&admin).send().await.unwrap();
    assert_eq!(r.status(), 202);
    let accepted: serde_json::Value = r.json().await.unwrap();
    let id = accepted["worker_id"].as_str().unwrap().to_string();
    let mut added = false;
    for _ in 0..100 {
        let listed = stack.get_json("/list_workers").await;
        if listed["urls"].as_array().unwrap().len() == 2 {
            added = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(added, "the admin JWT's worker was registered");
    let r = client
        .delete(stack.url(&format!("/workers/{id}")))
        .bearer_auth("ci-secret-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{:?}", r.text().await);
    let listed = stack.get_json("/list_workers").await;
    assert_eq!(listed["urls"].as_array().unwrap().len(), 1, "{listed}");
    // The provider's keys were fetched once, for the first token.
    assert_eq!(idp.jwks_fetches.load(Ordering::SeqCst), 1);

    // Every attempt was audited.
    let log = stack.control_plane_log();
    let audit: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("control plane audit"))
        .collect();
    assert_eq!(audit.len(), 7, "{audit:#?}");
    assert_eq!(
        audit.iter().filter(|l| l.contains("Denied")).count(),
        5,
        "{audit:#?}"
    );
    assert!(audit
        .iter()
        .any(|l| l.contains("Allowed") && l.contains("\"alice\"")));
    assert!(audit
        .iter()
        .any(|l| l.contains("Allowed") && l.contains("ci (CI pipeline)")));
    assert!(audit
        .iter()
        .any(|l| l.contains("Denied") && l.contains("\"bob\"")));
}
