//! A tenant's configuration as the data plane uses it: the published snapshot plus what is
//! derived from it once per version (decrypted credentials, prepared for their provider
//! adapter; parsed upstream URLs). Built off the request path; shared by `Arc`.
//!
//! Never logs or formats a credential: `Debug` leaves them out and header values are marked
//! sensitive.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use shield_core::snapshot::Snapshot;
use shield_core::target::{AuthMode, Target};
use shield_core::url_safety;
use shield_core::vault::{Keyring, secret_aad};
use url::Url;

use crate::egress::CallUrl;
use crate::provider::{self, Credential};

pub struct TenantConfig {
    pub snapshot: Snapshot,
    /// Per vault-mode target: its credential, only when its secret decrypted and is bound to
    /// the target's host (ROUTING.md: a key goes only to a host it is bound to).
    credentials: BTreeMap<String, Credential>,
    /// Per target: the chat completions URL, or why it cannot be called.
    endpoints: BTreeMap<String, Result<Arc<CallUrl>, &'static str>>,
    pub vault_ready: BTreeSet<String>,
}

impl std::fmt::Debug for TenantConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantConfig")
            .field("tenant", &self.snapshot.tenant)
            .field("version", &self.snapshot.version)
            .field("vault_ready", &self.vault_ready)
            .finish_non_exhaustive()
    }
}

impl TenantConfig {
    pub fn build(snapshot: Snapshot, keyring: &Keyring) -> TenantConfig {
        let mut credentials = BTreeMap::new();
        let mut endpoints = BTreeMap::new();
        for (id, target) in &snapshot.targets {
            let endpoint = provider::for_target(target).endpoint(target);
            if let (Ok(url), AuthMode::Vault) = (&endpoint, target.auth.mode) {
                match vault_credential(&snapshot, target, url, keyring) {
                    Ok(credential) => {
                        credentials.insert(id.clone(), credential);
                    }
                    Err(why) => {
                        tracing::warn!(tenant = %snapshot.tenant, target = %id, why, "vault credential unavailable")
                    }
                }
            }
            endpoints.insert(id.clone(), endpoint.map(|url| Arc::new(CallUrl::new(url))));
        }
        let vault_ready = credentials.keys().cloned().collect();
        TenantConfig { snapshot, credentials, endpoints, vault_ready }
    }

    /// The route a caller's `model` names, when it exists and is enabled.
    pub fn enabled_route(&self, name: &str) -> Option<&shield_core::route::Route> {
        self.snapshot.routes.get(name).filter(|route| route.enabled)
    }

    pub fn target(&self, id: &str) -> Option<&Target> {
        self.snapshot.targets.get(id)
    }

    pub fn endpoint(&self, id: &str) -> Result<&Arc<CallUrl>, &'static str> {
        match self.endpoints.get(id) {
            Some(Ok(url)) => Ok(url),
            Some(Err(why)) => Err(why),
            None => Err("unknown target"),
        }
    }

    pub fn vault_credential(&self, id: &str) -> Option<&Credential> {
        self.credentials.get(id)
    }
}

/// The credential of a vault target: the secret must be in the snapshot, decrypt for this
/// tenant and name, and be bound to the endpoint's host.
fn vault_credential(
    snapshot: &Snapshot,
    target: &Target,
    url: &Url,
    keyring: &Keyring,
) -> Result<Credential, &'static str> {
    let reference = target.auth.secret_ref.as_deref().ok_or("no secret_ref")?;
    let name = target.auth.secret_name().ok_or("malformed secret_ref")?;
    let published = snapshot.secrets.get(reference).ok_or("secret missing from the snapshot")?;
    let host = url_safety::binding_host(url).ok_or("no host")?;
    if !published.bindings.iter().any(|b| b.eq_ignore_ascii_case(&host)) {
        return Err("secret not bound to the target's host");
    }
    let sealed = published.sealed().ok_or("malformed sealed secret")?;
    let plaintext =
        keyring.open(&secret_aad(&snapshot.tenant, name), &sealed).map_err(|_| "secret does not decrypt")?;
    let value = String::from_utf8(plaintext).map_err(|_| "secret is not text")?;
    provider::for_target(target).credential(target, &value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use shield_core::snapshot::SnapshotSecret;
    use std::collections::BTreeMap;

    fn keyring() -> Keyring {
        Keyring::from_base64(&base64::engine::general_purpose::STANDARD.encode([3u8; 32]), 1).unwrap()
    }

    fn snapshot(bindings: &[&str], aad_tenant: &str) -> Snapshot {
        let target: Target = shield_core::parse::from_json_field(
            br#"{"id": "t", "base_url": "https://api.openai.com/v1", "model": "m", "auth": {"mode": "vault", "secret_ref": "shield://k"}}"#,
        )
        .unwrap();
        let sealed = keyring().seal(&secret_aad(aad_tenant, "k"), b"sk-live", [9; 12]);
        let secrets = BTreeMap::from([(
            "shield://k".to_string(),
            SnapshotSecret::from_sealed(&sealed, bindings.iter().map(|b| b.to_string()).collect()),
        )]);
        Snapshot::new(
            "acme".into(),
            1,
            0,
            BTreeMap::from([("t".to_string(), target)]),
            BTreeMap::new(),
            Default::default(),
            secrets,
        )
    }

    #[test]
    fn a_vault_key_is_ready_only_for_a_bound_host_and_the_right_tenant() {
        let config = TenantConfig::build(snapshot(&["api.openai.com"], "acme"), &keyring());
        let credential = config.vault_credential("t").expect("bound and decryptable");
        let mut headers = http::HeaderMap::new();
        provider::OPENAI.authenticate(
            credential,
            &url::Url::parse("https://api.openai.com/v1/chat/completions").unwrap(),
            &b"{}".to_vec().into(),
            &mut headers,
        );
        assert_eq!(headers["authorization"], "Bearer sk-live");
        assert!(headers["authorization"].is_sensitive());
        assert!(!format!("{credential:?}").contains("sk-live"), "Debug never shows a credential");
        assert!(!format!("{config:?}").contains("sk-live"), "Debug never shows a credential");
        assert!(
            TenantConfig::build(snapshot(&["evil.example.com"], "acme"), &keyring()).vault_ready.is_empty(),
            "not bound to the host"
        );
        assert!(
            TenantConfig::build(snapshot(&["api.openai.com"], "other"), &keyring()).vault_ready.is_empty(),
            "sealed for another tenant"
        );
    }
}
