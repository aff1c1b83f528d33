//! A 64-bit hash that is the same in every process, on every machine and
//! after every rebuild, for placing keys on workers.
//!
//! `std`'s hashers are either keyed per process (`RandomState`) or
//! documented as free to change between Rust releases (`DefaultHasher`).
//! Placement must not change with either: two control planes serving one
//! fleet, or one restarted, must send a routing key or a prompt prefix to
//! the same worker, or every restart scatters the workers' prefix caches.
//!
//! FNV-1a (64 bit) over the bytes, then MurmurHash3's 64-bit finaliser:
//! FNV alone mixes its last bytes poorly into the high bits, which the
//! finaliser fixes. Nothing here is secret, so a client can aim keys at a
//! worker; it can do that anyway by sending one key, so placement needs
//! spread, not secrecy. (`RoutingKey`'s map hash stays keyed.)

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The stable hash of `bytes`.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h = FNV_OFFSET;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    mix(h)
}

/// MurmurHash3's `fmix64`: a bijection on 64 bits in which every input bit
/// flips each output bit with probability about one half.
pub fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_values_never_change() {
        // FNV-1a's published value for "a" is 0xaf63dc4c8601ec8c; these
        // pin the finalised values so a change of algorithm, which would
        // move every key of a running fleet, fails here first.
        assert_eq!(mix(0xaf63_dc4c_8601_ec8c), stable_hash(b"a"));
        assert_eq!(stable_hash(b""), mix(FNV_OFFSET));
        assert_ne!(stable_hash(b"user-1"), stable_hash(b"user-2"));
    }

    #[test]
    fn low_bits_spread() {
        // Keys differing in their last character fill 16 buckets of the
        // low bits about evenly (expected 256 each).
        let mut buckets = [0u32; 16];
        for i in 0..4096 {
            buckets[(stable_hash(format!("key-{i}").as_bytes()) & 15) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&n| (180..=330).contains(&n)),
            "{buckets:?}"
        );
    }
}
