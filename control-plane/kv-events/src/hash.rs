//! The block hashes SGLang puts in `BlockStored` / `BlockRemoved`, so a router
//! can compute a prompt's hashes itself and look them up in the [`crate::index`].
//!
//! Read in SGLang 0.5.23 (PyPI wheel): `sglang/srt/mem_cache/events.py`
//! (`KVCacheEventRecorder.record_store` / `record_remove`),
//! `sglang/srt/mem_cache/utils.py` (`get_hash_str`, `hash_str_to_int64`,
//! `compute_node_hash_values`, `compute_node_event_hash_values`),
//! `sglang/srt/mem_cache/cpp_utils/hash_binding.cpp` (the native hasher
//! `get_hash_str` calls) and `sglang/srt/disaggregation/kv_events.py`
//! (`kv_event_namespace_seed`, `namespaced_block_hash`). The same chain, in
//! pure Python, is `get_hash_str` in 0.5.10's `mem_cache/hicache_storage.py`;
//! the golden values below were checked against that function.
//!
//! # The chain
//!
//! Tokens are cut into pages of `page_size` (the events' `block_size`). Page
//! `k`'s digest is `SHA-256(digest[k-1] ‖ tokens)`, where `digest[k-1]` is
//! the previous page's 32-byte digest (absent for the first page) and
//! `tokens` is each token id as 4 bytes little-endian. If any token of the
//! page exceeds `u32::MAX`, the page is instead hashed as `SHA-256(prior ‖
//! 0xff ‖ each token as 8 bytes little-endian)` (the odd byte keeps the two
//! encodings apart); ids above `i64::MAX` are refused. A bigram (EAGLE) page
//! hashes each pair `(a, b)` as `a` then `b`, i.e. the pairs flattened.
//!
//! The event's block hash is the digest's first 8 bytes read as a
//! big-endian **signed** int64 (`hash_str_to_int64` takes the first 16 hex
//! digits). `parent_block_hash` is the previous page's hash, None on the
//! first page under the tree root.
//!
//! These hashes are reproducible across processes and machines: SHA-256 of
//! token bytes, no per-process seed; 0.5.10 already published this chain.
//! (Older revisions of `radix_cache.py`'s `_record_store_event` published
//! Python's `hash(tuple(page_tokens))`, unchained: deterministic for int
//! tuples, as hash randomisation only salts str/bytes, but specific to the
//! CPython version and colliding for equal pages at different positions.
//! This crate does not reproduce it; an index fed such events still works,
//! keyed by the hashes they carry, but prompt hashes computed here will not
//! match them.)
//!
//! # Namespaces (what a router can and cannot recompute)
//!
//! * Plain request: the chain above from no prior. [`ChainStart::plain`].
//! * Request with `cache_salt`: the first prior is `SHA-256("sglang-cache-salt-v1\0"
//!   ‖ salt)` (`compute_node_event_hash_values`). [`ChainStart::salted`].
//! * Request with a caller `extra_key` and no LoRA: the default event format
//!   *omits* the extra key, so such blocks carry the same hashes as the
//!   plain request's although SGLang keeps them apart in its tree.
//! * LoRA request (default format) and everything in the `"dynamo"` event
//!   format: each hash `h` above is replaced by the first 8 bytes (signed,
//!   big-endian) of `SHA-256(seed ‖ h as 8 bytes big-endian)`, with `seed =
//!   SHA-256("sglang-kv-event-namespace-v1" ‖ part(extra_key) ‖
//!   part(cache_salt))`, `part(None) = 0x00`, `part(s) = 0x01 ‖ len(s) as 8
//!   bytes LE ‖ s`. For LoRA the extra key ends with SGLang's internal
//!   adapter uuid, which a router never sees: those hashes are opaque. The
//!   index keys blocks by the hashes the events carry, so it holds them
//!   anyway; matching a LoRA prompt needs another key (`lora_name` plus
//!   parent/tokens from the events), left for later. [`ChainStart::dynamo`]
//!   covers the computable dynamo case (extra key known, e.g. None).
//!
//! Only full pages are hashed here: SGLang's radix cache stores
//! page-aligned keys, so events describe full pages, and a partial tail page
//! can never be matched anyway.

use sha2::{Digest as _, Sha256};

use crate::error::HashError;

/// A page's SHA-256 digest, the link to the next page.
pub type Digest = [u8; 32];

/// Hash one page given the previous page's digest.
pub fn page_digest(prior: Option<&Digest>, tokens: &[u64]) -> Result<Digest, HashError> {
    let mut h = Sha256::new();
    if let Some(p) = prior {
        h.update(p);
    }
    let mut wide = false;
    for &t in tokens {
        if t > i64::MAX as u64 {
            return Err(HashError::TokenOutOfRange { token: t });
        }
        wide |= t > u64::from(u32::MAX);
    }
    if wide {
        h.update([0xff]);
        for &t in tokens {
            h.update(t.to_le_bytes());
        }
    } else {
        for &t in tokens {
            // Checked above: every token fits u32 on this branch.
            h.update((t as u32).to_le_bytes());
        }
    }
    Ok(h.finalize().into())
}

/// The int64 an event carries for a page digest.
pub fn event_hash(digest: &Digest) -> i64 {
    let [a, b, c, d, e, f, g, h, ..] = *digest;
    i64::from_be_bytes([a, b, c, d, e, f, g, h])
}

/// The chain's first prior for a salted request.
pub fn cache_salt_seed(cache_salt: &str) -> Digest {
    let mut h = Sha256::new();
    h.update(b"sglang-cache-salt-v1\0");
    h.update(cache_salt.as_bytes());
    h.finalize().into()
}

/// The namespace seed of `kv_event_namespace_seed`; None when both are None.
pub fn namespace_seed(extra_key: Option<&str>, cache_salt: Option<&str>) -> Option<Digest> {
    if extra_key.is_none() && cache_salt.is_none() {
        return None;
    }
    let mut h = Sha256::new();
    h.update(b"sglang-kv-event-namespace-v1");
    for part in [extra_key, cache_salt] {
        match part {
            None => h.update([0u8]),
            Some(s) => {
                h.update([1u8]);
                h.update((s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
        }
    }
    Some(h.finalize().into())
}

/// Apply a namespace seed to an event hash (identity without a seed).
pub fn namespaced_block_hash(block_hash: i64, seed: Option<&Digest>) -> i64 {
    let Some(seed) = seed else {
        return block_hash;
    };
    let mut h = Sha256::new();
    h.update(seed);
    h.update(block_hash.to_be_bytes());
    let d: Digest = h.finalize().into();
    event_hash(&d)
}

/// Where a request's chain starts, and whether its hashes are namespaced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainStart {
    /// Prior digest of the first page.
    pub prior: Option<Digest>,
    /// Namespace seed applied to every published hash.
    pub namespace: Option<Digest>,
}

impl ChainStart {
    /// No salt, no LoRA, default event format.
    pub fn plain() -> Self {
        Self::default()
    }

    /// A request with `cache_salt`, default event format.
    pub fn salted(cache_salt: &str) -> Self {
        ChainStart {
            prior: Some(cache_salt_seed(cache_salt)),
            namespace: None,
        }
    }

    /// The `"dynamo"` event format: the chain as in the default format, then
    /// namespaced by (extra_key, cache_salt) when either is set.
    pub fn dynamo(extra_key: Option<&str>, cache_salt: Option<&str>) -> Self {
        ChainStart {
            prior: cache_salt.map(cache_salt_seed),
            namespace: namespace_seed(extra_key, cache_salt),
        }
    }
}

/// The event hashes of `tokens`' full pages, as SGLang would publish them.
pub fn block_hashes(
    tokens: &[u64],
    page_size: usize,
    start: &ChainStart,
) -> Result<Vec<i64>, HashError> {
    if page_size == 0 {
        return Err(HashError::ZeroPageSize);
    }
    let mut out = Vec::with_capacity(tokens.len() / page_size);
    let mut prior = start.prior;
    for page in tokens.chunks_exact(page_size) {
        let d = page_digest(prior.as_ref(), page)?;
        out.push(namespaced_block_hash(
            event_hash(&d),
            start.namespace.as_ref(),
        ));
        prior = Some(d);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // python3 -c 'import hashlib,struct; d=hashlib.sha256(struct.pack("<4I",1,2,3,4)).digest(); print(d.hex(), int.from_bytes(d[:8],"big",signed=True))'
    const D1_HEX: &str = "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72";
    const H1: i64 = -3488128144981237669;
    // python3 -c 'import hashlib,struct; d1=hashlib.sha256(struct.pack("<4I",1,2,3,4)).digest(); d=hashlib.sha256(d1+struct.pack("<4I",5,6,7,8)).digest(); print(int.from_bytes(d[:8],"big",signed=True))'
    const H2: i64 = 5674439469042975057;

    fn hex(d: &Digest) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn chain_matches_sglang_golden_values() {
        let d1 = page_digest(None, &[1, 2, 3, 4]).unwrap();
        assert_eq!(hex(&d1), D1_HEX);
        assert_eq!(event_hash(&d1), H1);
        let hs = block_hashes(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4, &ChainStart::plain()).unwrap();
        // The ninth token is a partial page: not hashed.
        assert_eq!(hs, vec![H1, H2]);
    }

    #[test]
    fn page_size_one_chains_every_token() {
        let hs = block_hashes(&[1, 2], 1, &ChainStart::plain()).unwrap();
        let d1 = page_digest(None, &[1]).unwrap();
        assert_eq!(
            hs,
            vec![
                event_hash(&d1),
                event_hash(&page_digest(Some(&d1), &[2]).unwrap())
            ]
        );
        assert_ne!(hs[0], hs[1]);
    }

    #[test]
    fn wide_tokens_use_the_tagged_u64_encoding() {
        // python3 -c 'import hashlib,struct; d1=hashlib.sha256(struct.pack("<4I",1,2,3,4)).digest(); w=hashlib.sha256(d1+b"\xff"+struct.pack("<4Q",5,2**32,7,8)).digest(); print(int.from_bytes(w[:8],"big",signed=True))'
        let hs = block_hashes(&[1, 2, 3, 4, 5, 1 << 32, 7, 8], 4, &ChainStart::plain()).unwrap();
        assert_eq!(hs, vec![H1, 923974391598649218]);
        assert_eq!(
            page_digest(None, &[u64::MAX]),
            Err(HashError::TokenOutOfRange { token: u64::MAX })
        );
    }

    #[test]
    fn salted_chain_starts_from_the_salt_seed() {
        // python3 -c 'import hashlib; print(hashlib.sha256(b"sglang-cache-salt-v1\0"+b"salt").hexdigest())'
        assert_eq!(
            hex(&cache_salt_seed("salt")),
            "4d2e631efd24acf17faef91354c92a3ae26823c4c8217e7ffce12316c00bbe95"
        );
        // python3 -c 'import hashlib,struct; s=hashlib.sha256(b"sglang-cache-salt-v1\0salt").digest(); d=hashlib.sha256(s+struct.pack("<4I",1,2,3,4)).digest(); print(int.from_bytes(d[:8],"big",signed=True))'
        let hs = block_hashes(&[1, 2, 3, 4], 4, &ChainStart::salted("salt")).unwrap();
        assert_eq!(hs, vec![2420881443615746796]);
    }

    #[test]
    fn namespace_seed_and_namespaced_hash_match_python() {
        // python3 -c 'import hashlib; d=hashlib.sha256(b"sglang-kv-event-namespace-v1"); e=b"lora-x"; d.update(b"\x01"+len(e).to_bytes(8,"little")+e); d.update(b"\x00"); print(d.hexdigest())'
        let seed = namespace_seed(Some("lora-x"), None).unwrap();
        assert_eq!(
            hex(&seed),
            "0180ef9b5627c75c427c4a8146078a5d253ae0a3f216fcc0977525f9d4565812"
        );
        // python3 -c 'import hashlib; s=bytes.fromhex("0180ef9b5627c75c427c4a8146078a5d253ae0a3f216fcc0977525f9d4565812"); h=-3488128144981237669; print(int.from_bytes(hashlib.sha256(s+h.to_bytes(8,"big",signed=True)).digest()[:8],"big",signed=True))'
        assert_eq!(namespaced_block_hash(H1, Some(&seed)), -6256176993411402678);
        assert_eq!(namespaced_block_hash(H1, None), H1);
        assert_eq!(namespace_seed(None, None), None);
        // ("a", None) and (None, "a") must differ: the presence byte separates them.
        assert_ne!(
            namespace_seed(Some("a"), None),
            namespace_seed(None, Some("a"))
        );
    }

    #[test]
    fn dynamo_salt_only_is_salted_chain_then_namespaced() {
        let plain_salted = block_hashes(&[1, 2, 3, 4], 4, &ChainStart::salted("salt")).unwrap();
        let dyn_hs =
            block_hashes(&[1, 2, 3, 4], 4, &ChainStart::dynamo(None, Some("salt"))).unwrap();
        let seed = namespace_seed(None, Some("salt"));
        assert_eq!(
            dyn_hs,
            vec![namespaced_block_hash(plain_salted[0], seed.as_ref())]
        );
        assert_ne!(dyn_hs, plain_salted);
        assert_eq!(
            block_hashes(&[1], 0, &ChainStart::plain()),
            Err(HashError::ZeroPageSize)
        );
    }
}
