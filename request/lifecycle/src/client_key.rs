//! sglang-router's `--api-key`: inference requests must carry
//! `Authorization: Bearer <key>`. Only the key's SHA-256 travels and is
//! kept (the control plane hands the digest to the filter with its worker
//! list), and a presented key is compared digest to digest without an
//! early exit.

use sha2::{Digest, Sha256};

use crate::reply::LocalReply;

/// The digest of the key clients must present.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ClientKey([u8; 32]);

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the digest: logs have no use for it.
        f.write_str("ClientKey(..)")
    }
}

impl ClientKey {
    /// The key `key` (the `--api-key` value).
    pub fn from_key(key: &str) -> ClientKey {
        ClientKey(Sha256::digest(key.as_bytes()).into())
    }

    /// A digest as the control plane sends it; `None` unless 32 bytes.
    pub fn from_digest(digest: &[u8]) -> Option<ClientKey> {
        <[u8; 32]>::try_from(digest).ok().map(ClientKey)
    }

    /// The digest, to send on.
    pub fn digest(&self) -> &[u8; 32] {
        &self.0
    }

    /// The SHA-256 of the key `authorization` (the header's value)
    /// presents as `Bearer <key>`, if it does: smg names an authenticated
    /// request's tenant after it.
    pub fn presented(authorization: &str) -> Option<[u8; 32]> {
        let token = authorization
            .get(..7)
            .filter(|scheme| scheme.eq_ignore_ascii_case("bearer "))
            .and_then(|_| authorization.get(7..))?;
        Some(Sha256::digest(token.trim().as_bytes()).into())
    }

    /// True when `authorization` (the header's value) is `Bearer <key>`.
    pub fn admits(&self, authorization: &str) -> bool {
        let Some(presented) = ClientKey::presented(authorization) else {
            return false;
        };
        let diff = presented
            .iter()
            .zip(self.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        diff == 0
    }

    /// The answer to a request without the key, as sglang-router's (401).
    pub fn refusal() -> LocalReply {
        LocalReply::new(
            401,
            "invalid_request_error",
            "missing or incorrect API key: send `Authorization: Bearer <key>`",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::ClientKey;
    use crate::{HeadStep, Lifecycle, RequestHead, Settings};

    #[test]
    fn the_presented_key_is_its_digest() {
        let key = ClientKey::from_key("k");
        assert_eq!(
            ClientKey::presented("bearer k").as_ref(),
            Some(key.digest())
        );
        assert_eq!(ClientKey::presented("Basic k"), None);
    }

    fn head<'a>(path: &'a str, method: &'a str, authorization: &'a str) -> RequestHead<'a> {
        RequestHead {
            method,
            path,
            end_of_stream: false,
            content_length: None,
            request_id: "",
            routing_key: "",
            authorization,
            traceparent: "",
            tenant: "",
            priority: "",
            client_address: "",
        }
    }

    #[test]
    fn inference_requests_need_the_key_at_their_head_and_info_ones_do_not() {
        let settings = Settings {
            max_body_bytes: 100,
            body_while_head_held: true,
            client_key: Some(ClientKey::from_key("sk-1")),
        };
        let mut lc = Lifecycle::new(1, settings);
        match lc.on_request_head(head("/v1/chat/completions", "POST", "Bearer sk-2")) {
            HeadStep::Reply(r) => assert_eq!(r.status, 401),
            other => panic!("{other:?}"),
        }
        assert!(lc.replied());
        let mut lc = Lifecycle::new(2, settings);
        let step = lc.on_request_head(head("/generate", "POST", "Bearer sk-1"));
        assert_eq!(step, HeadStep::ReadBody);
        let mut lc = Lifecycle::new(3, settings);
        let step = lc.on_request_head(head("/v1/models", "GET", ""));
        assert!(matches!(step, HeadStep::Ask(_)), "{step:?}");
        // Without a key known, the head passes and the question carries
        // the header for the control plane to check.
        let open = Settings {
            client_key: None,
            ..settings
        };
        let mut lc = Lifecycle::new(4, open);
        let step = lc.on_request_head(head("/generate", "POST", "Bearer x"));
        assert_eq!(step, HeadStep::ReadBody);
    }

    #[test]
    fn only_the_bearer_key_is_admitted() {
        let key = ClientKey::from_key("sk-router-1");
        assert!(key.admits("Bearer sk-router-1"));
        assert!(key.admits("bearer sk-router-1"));
        for wrong in [
            "",
            "Bearer",
            "Bearer ",
            "sk-router-1",
            "Basic sk-router-1",
            "Bearer sk-router-2",
            "Bearer sk-router-10",
            "Bearer é",
        ] {
            assert!(!key.admits(wrong), "{wrong:?}");
        }
        assert_eq!(ClientKey::from_digest(key.digest()), Some(key));
        assert_eq!(ClientKey::from_digest(&[0; 31]), None);
        assert_eq!(format!("{key:?}"), "ClientKey(..)");
        assert_eq!(ClientKey::refusal().status, 401);
    }
}
