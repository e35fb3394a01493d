//! The published configuration: what the admin writes to `gw_snapshot:{tenant}` and
//! `gw_key:<sha256>`, and what the proxy reads. Secrets travel only as ciphertext.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::guardrails::GuardrailPolicy;
use crate::key_access::MonthlyBudget;
use crate::limits::Limits;
use crate::route::Route;
use crate::target::Target;
use crate::vault::{NONCE_LEN, Sealed};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub tenant: String,
    /// Per-tenant, strictly increasing with every committed config write.
    pub version: i64,
    /// SHA-256 of the configuration (targets, routes, guardrails, secrets), hex.
    pub digest: String,
    /// Unix seconds.
    pub published_at: i64,
    pub targets: BTreeMap<String, Target>,
    pub routes: BTreeMap<String, Route>,
    pub guardrails: GuardrailPolicy,
    /// The tenant's own ceiling over all its keys and routes (issue 18).
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// Keyed by the reference targets use (`shield://name`); only referenced secrets.
    pub secrets: BTreeMap<String, SnapshotSecret>,
    /// How long the data plane keeps Responses-API responses stored with `store: true`
    /// (issue 29); absent in snapshots of tenants that kept the default.
    #[serde(default, skip_serializing_if = "ResponseRetention::is_default")]
    pub responses: ResponseRetention,
    /// The platform operator's monthly cap on the tenant's spend over all its routes (issue
    /// 32); absent when none is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<MonthlyBudget>,
}

/// The tenant's retention of stored responses (`/v1/tenant/me/responses`): seconds a response
/// stored with `store: true` stays readable by `previous_response_id`, `item_reference` and
/// `GET /v1/responses/{id}`. 0 keeps nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseRetention {
    pub retention_s: u32,
}

impl ResponseRetention {
    /// A day, as OpenAI's own default for stored responses is counted in days.
    pub const DEFAULT_S: u32 = 86_400;
    /// 30 days: long enough for any agent session, short enough that stored prompts do not
    /// become an archive.
    pub const MAX_S: u32 = 30 * 86_400;

    pub fn is_default(&self) -> bool {
        self.retention_s == Self::DEFAULT_S
    }

    pub fn validate(&self) -> Result<(), Vec<crate::FieldError>> {
        if self.retention_s > Self::MAX_S {
            return Err(vec![crate::FieldError::new(
                "retention_s",
                format!("must be between 0 and {} seconds (30 days)", Self::MAX_S),
            )]);
        }
        Ok(())
    }
}

impl Default for ResponseRetention {
    fn default() -> Self {
        ResponseRetention { retention_s: Self::DEFAULT_S }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSecret {
    /// base64
    pub ciphertext: String,
    /// base64
    pub nonce: String,
    pub key_version: u32,
    pub bindings: Vec<String>,
}

impl SnapshotSecret {
    pub fn from_sealed(sealed: &Sealed, bindings: Vec<String>) -> Self {
        SnapshotSecret {
            ciphertext: B64.encode(&sealed.ciphertext),
            nonce: B64.encode(sealed.nonce),
            key_version: sealed.key_version,
            bindings,
        }
    }

    pub fn sealed(&self) -> Option<Sealed> {
        let nonce: [u8; NONCE_LEN] = B64.decode(&self.nonce).ok()?.try_into().ok()?;
        Some(Sealed { ciphertext: B64.decode(&self.ciphertext).ok()?, nonce, key_version: self.key_version })
    }
}

impl Snapshot {
    /// Builds a snapshot and computes its digest.
    pub fn new(
        tenant: String,
        version: i64,
        published_at: i64,
        targets: BTreeMap<String, Target>,
        routes: BTreeMap<String, Route>,
        guardrails: GuardrailPolicy,
        secrets: BTreeMap<String, SnapshotSecret>,
    ) -> Snapshot {
        let mut snapshot = Snapshot {
            tenant,
            version,
            digest: String::new(),
            published_at,
            targets,
            routes,
            guardrails,
            limits: Limits::default(),
            secrets,
            responses: ResponseRetention::default(),
            budget: None,
        };
        snapshot.digest = snapshot.compute_digest();
        snapshot
    }

    /// The same snapshot with the tenant's limits (part of its digest).
    pub fn with_limits(mut self, limits: Limits) -> Snapshot {
        self.limits = limits;
        self.digest = self.compute_digest();
        self
    }

    /// The same snapshot with the tenant's response retention (part of its digest).
    pub fn with_responses(mut self, responses: ResponseRetention) -> Snapshot {
        self.responses = responses;
        self.digest = self.compute_digest();
        self
    }

    /// The same snapshot with the operator's cap on the tenant (part of its digest).
    pub fn with_budget(mut self, budget: Option<MonthlyBudget>) -> Snapshot {
        self.budget = budget;
        self.digest = self.compute_digest();
        self
    }

    pub fn compute_digest(&self) -> String {
        let mut content = serde_json::json!({
            "targets": self.targets, "routes": self.routes, "guardrails": self.guardrails, "secrets": self.secrets,
        });
        // Only when set: a tenant without limits keeps the digest it had before limits existed.
        if !self.limits.is_empty()
            && let Some(content) = content.as_object_mut()
        {
            content.insert("limits".into(), serde_json::json!(self.limits));
        }
        if !self.responses.is_default()
            && let Some(content) = content.as_object_mut()
        {
            content.insert("responses".into(), serde_json::json!(self.responses));
        }
        if let (Some(budget), Some(content)) = (&self.budget, content.as_object_mut()) {
            content.insert("budget".into(), serde_json::json!(budget));
        }
        hex::encode(Sha256::digest(content.to_string().as_bytes()))
    }
}

/// `gw_key:<sha256 hex>`: what the proxy needs to authenticate a caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    pub tenant: String,
    pub key_id: String,
    pub name: String,
    pub agent: Option<String>,
    pub role: Option<String>,
    pub revoked: bool,
    /// This key's own limits (issue 18); absent in records published before them.
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// The route names and patterns the key may name (issue 32); absent: every route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<Vec<String>>,
    /// Unix seconds after which the key stops working; absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// This secret was replaced by a rotation: it works until `expires_at` (the grace's end).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rotated: bool,
    /// The key's monthly spend budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<MonthlyBudget>,
    /// The tenant's config version the record was written at: a publish never replaces a
    /// record of a later version (a late PATCH cannot undo a revocation); 0 in records
    /// published before versions.
    #[serde(default)]
    pub version: i64,
}

impl ApiKeyRecord {
    /// Whether the key has stopped working by `now` (Unix seconds).
    pub fn expired(&self, now: i64) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }

    /// Whether the key may name `route` (or send `model` down the default path).
    pub fn may_use(&self, route: &str) -> bool {
        crate::key_access::allows(self.routes.as_deref(), route)
    }
}

/// A message on `gw_config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ConfigMessage {
    Tenant {
        tenant: String,
        version: i64,
    },
    Key {
        key_hash: String,
    },
    /// An operator cleared a target's exhaustion cooldown and circuit.
    Reset {
        tenant: String,
        reset: String,
    },
}

/// SHA-256 hex of a tenant API key: how keys are stored and looked up.
pub fn key_hash(key: &str) -> String {
    // Into a fixed buffer: every request hashes its key, and `hex::encode`'s per-character
    // iterator showed in the profile (issue 19). The length is right by construction, so the
    // encoding cannot fail; its digits are ASCII, checked as such (`from_utf8_lossy`, which
    // walked them as chunks, was ~500 instructions a request; issue 33).
    let mut out = [0u8; 64];
    let _ = hex::encode_to_slice(Sha256::digest(key.as_bytes()), &mut out);
    std::str::from_utf8(&out).unwrap_or_default().to_owned()
}

/// Tenant keys are `sk-shield-` + 43 characters of base64url (32 random bytes).
pub const API_KEY_PREFIX: &str = "sk-shield-";

pub fn format_api_key(random: &[u8; 32]) -> String {
    format!("{API_KEY_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random))
}

#[cfg(test)]
mod tests {
    #[test]
    fn key_hashes_are_sha256_in_lowercase_hex() {
        use sha2::Digest;
        for key in ["", "sk-shield-abc", "ünïcode"] {
            assert_eq!(super::key_hash(key), hex::encode(sha2::Sha256::digest(key.as_bytes())));
        }
    }

    use super::*;

    #[test]
    fn digest_depends_on_content_only() {
        let a = Snapshot::new(
            "t".into(),
            1,
            100,
            BTreeMap::new(),
            BTreeMap::new(),
            GuardrailPolicy::default(),
            BTreeMap::new(),
        );
        let b = Snapshot::new(
            "t".into(),
            2,
            200,
            BTreeMap::new(),
            BTreeMap::new(),
            GuardrailPolicy::default(),
            BTreeMap::new(),
        );
        assert_eq!(a.digest, b.digest);
        let mut policy = GuardrailPolicy::default();
        policy.tools.kill_switch = true;
        let c = Snapshot::new("t".into(), 3, 300, BTreeMap::new(), BTreeMap::new(), policy, BTreeMap::new());
        assert_ne!(a.digest, c.digest);
    }

    #[test]
    fn keys_look_right() {
        let key = format_api_key(&[0xAB; 32]);
        assert!(key.starts_with("sk-shield-"));
        assert_eq!(key.len(), 10 + 43);
        assert_eq!(key_hash(&key).len(), 64);
        let msg: ConfigMessage = serde_json::from_str(r#"{"key_hash":"ab"}"#).unwrap();
        assert_eq!(msg, ConfigMessage::Key { key_hash: "ab".into() });
    }
}
