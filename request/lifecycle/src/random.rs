//! Randomness for tickets, request ids and bootstrap rooms, in the wasm VM
//! and natively alike.

use sglang_envoy_body::Route;

/// Characters of a request id's random part.
const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Fills `bytes` from the system's entropy. Without an entropy source
/// (a wasm host that offers none) the `clock` (nanoseconds) stands in:
/// values then still differ from one call and one VM to the next.
pub fn fill(bytes: &mut [u8], clock: impl Fn() -> u64) {
    if getrandom::fill(bytes).is_err() {
        let nanos = clock();
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (nanos.rotate_left(i as u32 * 7) >> (i % 8)) as u8;
        }
    }
}

/// A random `u64` (see [`fill`] for `clock`).
pub fn u64(clock: impl Fn() -> u64) -> u64 {
    let mut bytes = [0u8; 8];
    fill(&mut bytes, clock);
    u64::from_le_bytes(bytes)
}

/// A request id in sglang-router's format: the route's prefix (`chatcmpl-`,
/// `cmpl-`, `gnt-`, `req-`), 24 random alphanumerics, `-` and `suffix`
/// (the router's address, so ids of several routers differ and say where
/// they came from). Each character is drawn without modulo bias.
pub fn rid(route: Route, suffix: &str, clock: impl Fn() -> u64) -> String {
    let mut id = String::with_capacity(route.rid_prefix().len() + 25 + suffix.len());
    id.push_str(route.rid_prefix());
    let mut chosen = 0;
    while chosen < 24 {
        let mut bytes = [0u8; 32];
        fill(&mut bytes, &clock);
        // 248 = 4 * 62: bytes above it would favour the first characters.
        for b in bytes.into_iter().filter(|b| *b < 248).take(24 - chosen) {
            id.push(ALPHANUMERIC[usize::from(b) % ALPHANUMERIC.len()] as char);
            chosen += 1;
        }
    }
    id.push('-');
    id.push_str(suffix);
    id
}

/// The clock of a host without one to offer: zero.
pub fn no_clock() -> u64 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_prefix_24_alphanumerics_and_suffix() {
        let a = rid(Route::ChatCompletions, "10.0.0.7", no_clock);
        let rest = a.strip_prefix("chatcmpl-").unwrap();
        let (random, suffix) = rest.split_once('-').unwrap();
        assert_eq!(random.len(), 24);
        assert!(random.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_eq!(suffix, "10.0.0.7");
        assert_ne!(a, rid(Route::ChatCompletions, "10.0.0.7", no_clock));
        assert!(rid(Route::Generate, "h", no_clock).starts_with("gnt-"));
        assert!(rid(Route::Completions, "h", no_clock).starts_with("cmpl-"));
        assert!(rid(Route::Embeddings, "h", no_clock).starts_with("req-"));
    }

    #[test]
    fn id_characters_are_drawn_evenly() {
        // 62 characters, 24 per id: over 2,000 ids each character is
        // expected ~774 times; a modulo-biased draw (256 % 62 = 8 favoured
        // characters) gives the first eight ~25% more.
        let mut counts = [0u32; 62];
        for _ in 0..2_000 {
            let id = rid(Route::Generate, "h", no_clock);
            for c in id["gnt-".len()..][..24].bytes() {
                let i = ALPHANUMERIC.iter().position(|a| *a == c).unwrap();
                counts[i] += 1;
            }
        }
        let first: u32 = counts[..8].iter().sum();
        let last: u32 = counts[54..].iter().sum();
        let ratio = f64::from(first) / f64::from(last);
        assert!((0.9..1.1).contains(&ratio), "{ratio} {counts:?}");
    }
}
