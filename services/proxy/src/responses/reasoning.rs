//! The reasoning round trip (issue 29): an Anthropic target's thinking blocks must come back
//! unchanged, signatures and all, on the next turn of a tool-using conversation, and a
//! Responses caller (Codex) carries reasoning between turns only as `reasoning` items with an
//! opaque `encrypted_content`. Shield seals the blocks into that field with a subkey of the
//! vault's keyring (`Keyring::derive`; AES-256-GCM, the tenant in the associated data, a fresh
//! nonce each time) and opens
//! it when it comes back: so any proxy of the fleet can read it, another tenant's cannot, and
//! content Shield did not produce (OpenAI's own, a forgery, a tampered copy) does not open
//! and is dropped rather than forwarded.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde_json::{Value, json};
use shield_core::exchange::Part;
use shield_core::vault::{Keyring, NONCE_LEN, Sealed};

/// What marks `encrypted_content` as Shield's (and its format's version).
const PREFIX: &str = "shield1.";

/// Seals and opens one tenant's reasoning.
#[derive(Clone)]
pub struct Sealer {
    keyring: Arc<Keyring>,
    tenant: String,
}

impl Sealer {
    pub fn new(keyring: Arc<Keyring>, tenant: &str) -> Sealer {
        Sealer { keyring, tenant: tenant.to_string() }
    }

    fn aad(&self) -> String {
        // A subkey of its own, and not a secret's associated data (`vault::secret_aad`)
        // either: a sealed secret never opens as reasoning, nor reasoning as a secret.
        format!("shield-reasoning:{}", self.tenant)
    }

    /// Anthropic content blocks (`thinking` with its signature, `redacted_thinking`) as
    /// `encrypted_content`.
    pub fn seal(&self, blocks: &[Value]) -> String {
        let plaintext = Value::Array(blocks.to_vec()).to_string();
        let nonce: [u8; NONCE_LEN] = rand::random();
        let sealed = self.keyring.seal(&self.aad(), plaintext.as_bytes(), nonce);
        let mut bytes = Vec::with_capacity(4 + NONCE_LEN + sealed.ciphertext.len());
        bytes.extend_from_slice(&sealed.key_version.to_be_bytes());
        bytes.extend_from_slice(&sealed.nonce);
        bytes.extend_from_slice(&sealed.ciphertext);
        format!("{PREFIX}{}", B64.encode(bytes))
    }

    /// The typed thinking parts of `encrypted_content`, or `None` when it is not Shield's for
    /// this tenant.
    pub fn open(&self, content: &str) -> Option<Vec<Part>> {
        let bytes = B64.decode(content.strip_prefix(PREFIX)?).ok()?;
        let (version, rest) = bytes.split_first_chunk::<4>()?;
        let (nonce, ciphertext) = rest.split_first_chunk::<NONCE_LEN>()?;
        let sealed =
            Sealed { ciphertext: ciphertext.to_vec(), nonce: *nonce, key_version: u32::from_be_bytes(*version) };
        let plaintext = self.keyring.open(&self.aad(), &sealed).ok()?;
        let blocks: Vec<Value> = serde_json::from_slice(&plaintext).ok()?;
        let text = |block: &Value, key: &str| block.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
        Some(
            blocks
                .iter()
                .filter_map(|block| match block.get("type").and_then(Value::as_str) {
                    Some("thinking") => {
                        Some(Part::Thinking { thinking: text(block, "thinking"), signature: text(block, "signature") })
                    }
                    Some("redacted_thinking") => Some(Part::RedactedThinking(text(block, "data"))),
                    _ => None,
                })
                .collect(),
        )
    }
}

/// A thinking block as Anthropic's content block.
pub fn thinking_block(thinking: &str, signature: &str) -> Value {
    json!({"type": "thinking", "thinking": thinking, "signature": signature})
}

pub fn redacted_block(data: &str) -> Value {
    json!({"type": "redacted_thinking", "data": data})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> String {
        base64::engine::general_purpose::STANDARD.encode([byte; 32])
    }

    fn keyring() -> Arc<Keyring> {
        Arc::new(Keyring::from_base64(&key(7), 1).unwrap())
    }

    #[test]
    fn sealed_reasoning_opens_for_its_tenant_only_and_never_when_tampered() {
        let sealer = Sealer::new(keyring(), "acme");
        let sealed = sealer.seal(&[thinking_block("Let me think.", "c2ln"), redacted_block("b3BhcXVl")]);
        assert!(sealed.starts_with(PREFIX));
        assert_eq!(
            sealer.open(&sealed),
            Some(vec![
                Part::Thinking { thinking: "Let me think.".into(), signature: "c2ln".into() },
                Part::RedactedThinking("b3BhcXVl".into())
            ])
        );
        assert_ne!(sealer.seal(&[thinking_block("a", "b")]), sealer.seal(&[thinking_block("a", "b")]), "fresh nonce");
        assert_eq!(Sealer::new(keyring(), "other").open(&sealed), None, "another tenant's");
        let other_key = Arc::new(Keyring::from_base64(&key(8), 1).unwrap());
        assert_eq!(Sealer::new(other_key, "acme").open(&sealed), None, "another deployment's");
        let mut tampered = sealed.clone().into_bytes();
        let last = tampered.len() - 2;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(sealer.open(&String::from_utf8(tampered).unwrap()), None);
        for foreign in ["gAAAAABo-openai-content", "", PREFIX, "shield1.!!!"] {
            assert_eq!(sealer.open(foreign), None, "{foreign}");
        }
    }
}
