//! A tenant's configuration as the data plane uses it: the published snapshot plus what is
//! derived from it once per version (decrypted credentials as ready-made header values, parsed
//! upstream URLs). Built off the request path; shared by `Arc`.
//!
//! Never logs or formats a credential: `Debug` leaves them out and header values are marked
//! sensitive.

use std::collections::{BTreeMap, BTreeSet};

use http::header::{HeaderName, HeaderValue};
use shield_core::snapshot::Snapshot;
use shield_core::target::{AuthMode, Flavor, Target};
use shield_core::url_safety;
use shield_core::vault::{Keyring, secret_aad};
use url::Url;

pub struct TenantConfig {
    pub snapshot: Snapshot,
    /// Per vault-mode target: the header to send, only when its secret decrypted and is bound
    /// to the target's host (ROUTING.md: a key goes only to a host it is bound to).
    credentials: BTreeMap<String, (HeaderName, HeaderValue)>,
    /// Per target: the chat completions URL, or why it cannot be called.
    endpoints: BTreeMap<String, Result<Url, &'static str>>,
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
            let endpoint = chat_url(target);
            if let (Ok(url), AuthMode::Vault) = (&endpoint, target.auth.mode) {
                match vault_header(&snapshot, target, url, keyring) {
                    Ok(header) => {
                        credentials.insert(id.clone(), header);
                    }
                    Err(why) => {
                        tracing::warn!(tenant = %snapshot.tenant, target = %id, why, "vault credential unavailable")
                    }
                }
            }
            endpoints.insert(id.clone(), endpoint);
        }
        let vault_ready = credentials.keys().cloned().collect();
        TenantConfig { snapshot, credentials, endpoints, vault_ready }
    }

    pub fn target(&self, id: &str) -> Option<&Target> {
        self.snapshot.targets.get(id)
    }

    pub fn endpoint(&self, id: &str) -> Result<&Url, &'static str> {
        match self.endpoints.get(id) {
            Some(Ok(url)) => Ok(url),
            Some(Err(why)) => Err(why),
            None => Err("unknown target"),
        }
    }

    pub fn vault_credential(&self, id: &str) -> Option<&(HeaderName, HeaderValue)> {
        self.credentials.get(id)
    }
}

/// `{base}/chat/completions`, or Azure's deployment URL with its `api-version`.
fn chat_url(target: &Target) -> Result<Url, &'static str> {
    let base = url_safety::parse_outbound_url(&target.base_url).map_err(|_| "invalid base_url")?;
    let base = base.as_str().trim_end_matches('/');
    let url = match (target.flavor, &target.azure) {
        (Flavor::Azure, Some(azure)) => {
            let mut url = Url::parse(&format!("{base}/openai/deployments/{}/chat/completions", azure.deployment))
                .map_err(|_| "invalid azure deployment")?;
            url.query_pairs_mut().append_pair("api-version", &azure.api_version);
            url
        }
        (Flavor::Azure, None) => return Err("azure target without deployment"),
        (Flavor::Openai, _) => Url::parse(&format!("{base}/chat/completions")).map_err(|_| "invalid base_url")?,
    };
    Ok(url)
}

/// The auth header for a vault target: the secret must be in the snapshot, decrypt for this
/// tenant and name, and be bound to the endpoint's host.
fn vault_header(
    snapshot: &Snapshot,
    target: &Target,
    url: &Url,
    keyring: &Keyring,
) -> Result<(HeaderName, HeaderValue), &'static str> {
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
    auth_header(&target.auth.header, &target.auth.scheme, &value).ok_or("secret is not a valid header value")
}

/// `{header}: {scheme} {key}` (or the bare key when the scheme is empty), marked sensitive.
pub fn auth_header(header: &str, scheme: &str, key: &str) -> Option<(HeaderName, HeaderValue)> {
    let name = HeaderName::from_bytes(header.as_bytes()).ok()?;
    let text = if scheme.is_empty() { key.to_string() } else { format!("{scheme} {key}") };
    let mut value = HeaderValue::from_str(&text).ok()?;
    value.set_sensitive(true);
    Some((name, value))
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
        let (name, value) = config.vault_credential("t").expect("bound and decryptable");
        assert_eq!((name.as_str(), value.to_str().unwrap()), ("authorization", "Bearer sk-live"));
        assert!(value.is_sensitive());
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

    #[test]
    fn azure_urls() {
        let target: Target = shield_core::parse::from_json_field(
            br#"{"id": "az", "base_url": "https://x.openai.azure.com/", "flavor": "azure", "model": "m",
                "azure": {"deployment": "gpt4o", "api_version": "2024-06-01"}, "auth": {"mode": "none"}}"#,
        )
        .unwrap();
        assert_eq!(
            chat_url(&target).unwrap().as_str(),
            "https://x.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-06-01"
        );
    }
}
