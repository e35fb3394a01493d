//! Randomness from the OS, in the shapes the admin needs (nonces, keys, passwords, salts).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;

pub fn bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rand::rng().fill_bytes(&mut out);
    out
}

/// `n` random bytes as unpadded base64url.
pub fn b64url(n: usize) -> String {
    let mut out = vec![0u8; n];
    rand::rng().fill_bytes(&mut out);
    URL_SAFE_NO_PAD.encode(out)
}
