//! The keyed hash the tenant memos key texts by (issue 33): XXH3-128 under a 192-byte secret
//! drawn at random and never shown, so that no caller can aim a text at another text's entry.
//!
//! One function, two implementations chosen by length. `xxhash-rust` is compiled for the CPU
//! the build assumes (SSE2 on x86-64: this build does not assume AVX2); `twox-hash` picks AVX2
//! at run time where the CPU has it and hashes a long text in about half the time (209 KB in
//! 3.6 µs against 7.0 on AMD EPYC), but its short-input path is slower (100 bytes in 18 ns
//! against 7.5). XXH3 itself changes path above 240 bytes, and so does this module. Both are
//! XXH3-128 with the secret and the default seed, the same hash (a property test holds them to
//! it), so the cut-off is only speed. Streaming stays with `xxhash-rust`: `twox-hash`'s
//! streaming hasher falls back to the default secret for inputs of 240 bytes or fewer, as the
//! reference's "secret and seed" variant does, which would leave a short text unkeyed.

use xxhash_rust::xxh3::{Xxh3, xxh3_128_with_secret};

/// The secret's length: above XXH3's minimum of 136 bytes, as its default secret is.
pub const SECRET_BYTES: usize = 192;

/// XXH3's last length hashed on its short-input path.
const SHORT: usize = 240;

/// A secret drawn at random, and the hash under it.
pub struct HashKey(Box<[u8; SECRET_BYTES]>);

impl HashKey {
    /// A key drawn from the operating system's random source.
    pub fn random() -> HashKey {
        let mut secret = Box::new([0u8; SECRET_BYTES]);
        rand::fill(&mut secret[..]);
        HashKey(secret)
    }

    /// The keyed hash of `bytes`.
    pub fn hash(&self, bytes: &[u8]) -> u128 {
        if bytes.len() > SHORT {
            // The secret is longer than twox-hash's minimum, so this never falls back.
            if let Ok(hash) = twox_hash::XxHash3_128::oneshot_with_secret(&self.0[..], bytes) {
                return hash;
            }
        }
        xxh3_128_with_secret(bytes, &self.0[..])
    }

    /// A streaming hasher under this key: its digest of bytes written in pieces is
    /// [`HashKey::hash`] of them joined.
    pub fn hasher(&self) -> Xxh3 {
        Xxh3::with_secret(*self.0)
    }
}

impl std::fmt::Debug for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HashKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Either implementation, and the streaming hasher over any split, give one hash.
        #[test]
        fn one_hash_whatever_the_path(bytes in prop::collection::vec(any::<u8>(), 0..4096), cut in any::<prop::sample::Index>()) {
            let key = HashKey::random();
            let reference = xxh3_128_with_secret(&bytes, &key.0[..]);
            prop_assert_eq!(key.hash(&bytes), reference);
            let at = cut.index(bytes.len() + 1);
            let mut hasher = key.hasher();
            hasher.update(&bytes[..at]);
            hasher.update(&bytes[at..]);
            prop_assert_eq!(hasher.digest128(), reference);
        }
    }

    #[test]
    fn keys_differ_and_never_print_their_secret() {
        let (a, b) = (HashKey::random(), HashKey::random());
        for len in [0, 16, SHORT, SHORT + 1, 5000] {
            let text = vec![b'x'; len];
            assert_ne!(a.hash(&text), b.hash(&text), "at {len} bytes the secret keys the hash");
        }
        assert_eq!(format!("{a:?}"), "HashKey(..)");
    }
}
