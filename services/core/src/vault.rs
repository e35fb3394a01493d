//! Vault crypto: AES-256-GCM with a fresh random nonce per secret (the caller supplies it; this
//! crate has no RNG) and a key version for rotation. The additional authenticated data binds
//! each ciphertext to its tenant and secret name, so a ciphertext copied to another tenant or
//! name does not decrypt. Nothing here logs or formats a plaintext.

use std::collections::BTreeMap;
use std::fmt;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

pub const NONCE_LEN: usize = 12;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VaultError {
    #[error("SHIELD_VAULT_KEY must be base64 of exactly 32 bytes")]
    BadMasterKey,
    #[error("no vault key with version {0} is configured")]
    UnknownKeyVersion(u32),
    #[error("the secret does not decrypt with this key (wrong key, tenant or name, or tampered)")]
    Undecryptable,
}

/// The master keys by version; new secrets are sealed with `current`.
#[derive(Clone)]
pub struct Keyring {
    current: u32,
    keys: BTreeMap<u32, [u8; 32]>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("current", &self.current)
            .field("versions", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A sealed secret as stored in Postgres and published in snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub ciphertext: Vec<u8>,
    pub nonce: [u8; NONCE_LEN],
    pub key_version: u32,
}

impl Keyring {
    /// One key (`SHIELD_VAULT_KEY`, base64 of 32 bytes) as version `version`.
    pub fn from_base64(master_key: &str, version: u32) -> Result<Keyring, VaultError> {
        let bytes = B64.decode(master_key.trim()).map_err(|_| VaultError::BadMasterKey)?;
        let key: [u8; 32] = bytes.try_into().map_err(|_| VaultError::BadMasterKey)?;
        Ok(Keyring { current: version, keys: BTreeMap::from([(version, key)]) })
    }

    /// Adds an older key so secrets sealed with it still open after a rotation.
    pub fn with_previous(mut self, master_key: &str, version: u32) -> Result<Keyring, VaultError> {
        let previous = Keyring::from_base64(master_key, version)?;
        self.keys.extend(previous.keys);
        Ok(self)
    }

    pub fn current_version(&self) -> u32 {
        self.current
    }

    #[allow(
        clippy::expect_used,
        reason = "a Keyring is built with its current key, and AES-GCM fails only past 64 GiB of input"
    )]
    pub fn seal(&self, aad: &str, plaintext: &[u8], nonce: [u8; NONCE_LEN]) -> Sealed {
        let cipher = self.cipher(self.current).expect("the current key is always present");
        let ciphertext = cipher
            .encrypt(&Nonce::from(nonce), Payload { msg: plaintext, aad: aad.as_bytes() })
            .expect("AES-GCM encryption cannot fail for inputs under 64 GiB");
        Sealed { ciphertext, nonce, key_version: self.current }
    }

    /// The same keyring with each key replaced by a subkey for `purpose` (HMAC-SHA256 of the
    /// purpose under the key): what Shield seals for other purposes than provider secrets
    /// (reasoning handed to callers, at volume) never spends the secrets' keys' nonce budget,
    /// and neither use can open the other's.
    pub fn derive(&self, purpose: &str) -> Keyring {
        use hmac::{Hmac, Mac};
        let keys = self
            .keys
            .iter()
            .map(|(version, key)| {
                let subkey = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key)
                    .map(|mut mac| {
                        mac.update(purpose.as_bytes());
                        <[u8; 32]>::from(mac.finalize().into_bytes())
                    })
                    .unwrap_or(*key);
                (*version, subkey)
            })
            .collect();
        Keyring { current: self.current, keys }
    }

    pub fn open(&self, aad: &str, sealed: &Sealed) -> Result<Vec<u8>, VaultError> {
        let cipher = self.cipher(sealed.key_version)?;
        cipher
            .decrypt(&Nonce::from(sealed.nonce), Payload { msg: &sealed.ciphertext, aad: aad.as_bytes() })
            .map_err(|_| VaultError::Undecryptable)
    }

    fn cipher(&self, version: u32) -> Result<Aes256Gcm, VaultError> {
        let key = self.keys.get(&version).ok_or(VaultError::UnknownKeyVersion(version))?;
        Aes256Gcm::new_from_slice(key).map_err(|_| VaultError::BadMasterKey)
    }
}

/// The associated data that ties a ciphertext to one tenant's secret name.
pub fn secret_aad(tenant: &str, name: &str) -> String {
    format!("shield-secret:{tenant}/{name}")
}

/// At most the last 4 characters, and only for values long enough that 4 characters reveal
/// little (16+); shorter secrets show nothing.
pub fn hint(value: &str) -> Option<String> {
    let chars: Vec<char> = value.chars().collect();
    (chars.len() >= 16)
        .then(|| format!("…{}", chars.get(chars.len() - 4..).unwrap_or_default().iter().collect::<String>()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring() -> Keyring {
        Keyring::from_base64(&B64.encode([7u8; 32]), 1).unwrap()
    }

    #[test]
    fn a_derived_keyring_neither_opens_nor_is_opened_by_its_parent() {
        let k = keyring();
        let derived = k.derive("shield-reasoning");
        let sealed = derived.seal("aad", b"thinking", [2; 12]);
        assert_eq!(derived.open("aad", &sealed).unwrap(), b"thinking");
        assert!(k.open("aad", &sealed).is_err());
        assert!(derived.open("aad", &k.seal("aad", b"secret", [3; 12])).is_err());
        assert!(k.derive("other").open("aad", &sealed).is_err());
        assert_eq!(k.derive("shield-reasoning").open("aad", &sealed).unwrap(), b"thinking", "deterministic");
    }

    #[test]
    fn seal_and_open() {
        let k = keyring();
        let sealed = k.seal(&secret_aad("acme", "openai"), b"sk-live-123", [1; 12]);
        assert_ne!(sealed.ciphertext, b"sk-live-123");
        assert_eq!(k.open(&secret_aad("acme", "openai"), &sealed).unwrap(), b"sk-live-123");
    }

    #[test]
    fn ciphertext_is_bound_to_tenant_name_and_key() {
        let k = keyring();
        let sealed = k.seal(&secret_aad("acme", "openai"), b"sk-live-123", [1; 12]);
        assert_eq!(k.open(&secret_aad("evil", "openai"), &sealed), Err(VaultError::Undecryptable));
        assert_eq!(k.open(&secret_aad("acme", "other"), &sealed), Err(VaultError::Undecryptable));
        let other = Keyring::from_base64(&B64.encode([8u8; 32]), 1).unwrap();
        assert_eq!(other.open(&secret_aad("acme", "openai"), &sealed), Err(VaultError::Undecryptable));
        let mut tampered = sealed.clone();
        tampered.ciphertext[0] ^= 1;
        assert_eq!(k.open(&secret_aad("acme", "openai"), &tampered), Err(VaultError::Undecryptable));
    }

    #[test]
    fn rotation_keeps_old_secrets_readable() {
        let old = keyring();
        let sealed = old.seal("a", b"v", [2; 12]);
        let new =
            Keyring::from_base64(&B64.encode([9u8; 32]), 2).unwrap().with_previous(&B64.encode([7u8; 32]), 1).unwrap();
        assert_eq!(new.open("a", &sealed).unwrap(), b"v");
        assert_eq!(new.seal("a", b"v", [3; 12]).key_version, 2);
        assert_eq!(Keyring::from_base64("c2hvcnQ=", 1).unwrap_err(), VaultError::BadMasterKey);
    }

    #[test]
    fn hints_reveal_little() {
        assert_eq!(hint("sk-proj-abcdefghijklmnop1234").as_deref(), Some("…1234"));
        assert_eq!(hint("short-secret"), None);
    }
}
