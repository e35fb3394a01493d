//! Creating tenants and API keys: shared by the admin API and the CLI so both follow one path
//! (validation, hashing, audit, publishing).

use chrono::{DateTime, Utc};
use shield_core::FieldError;
use shield_core::error::Problems;
use shield_core::key_access;
use shield_core::names::check_tenant_slug;
use shield_core::snapshot::{API_KEY_PREFIX, format_api_key, key_hash};
use sqlx::PgPool;

use crate::auth::hash_password;
use crate::error::ApiError;
use crate::publish::Publisher;
use crate::random;
use crate::repo::audit::{self, Action};
use crate::repo::keys::{self, KeyMeta, KeySettings, NewKey};
use crate::repo::tenants::{self, Tenant};
use crate::repo::users;
use crate::write::{ConfigWrite, digest_of};

pub struct CreatedTenant {
    pub tenant: Tenant,
    pub admin_email: String,
    /// Generated; shown once.
    pub password: String,
}

pub fn check_email(email: &str) -> Result<(), ApiError> {
    let ok = email.len() <= 254
        && !email.chars().any(|c| c.is_whitespace() || c.is_control())
        && email
            .split_once('@')
            .is_some_and(|(user, domain)| !user.is_empty() && domain.contains('.') && !domain.contains('@'));
    if ok { Ok(()) } else { Err(ApiError::validation("admin_email", "is not an e-mail address")) }
}

/// Creates a tenant and its owner admin with a generated password.
pub async fn create_tenant(
    db: &PgPool,
    slug: &str,
    name: &str,
    admin_email: &str,
    actor: &str,
) -> Result<CreatedTenant, ApiError> {
    check_tenant_slug(slug).map_err(|why| ApiError::validation("slug", why))?;
    check_email(admin_email)?;
    let name = if name.trim().is_empty() { slug } else { name.trim() };
    if name.len() > 200 {
        return Err(ApiError::validation("name", "must be at most 200 characters"));
    }
    let password = random::b64url(18);
    let mut tx = db.begin().await?;
    let tenant = tenants::insert(&mut *tx, slug, name).await?.ok_or_else(|| ApiError::Conflict {
        message: format!("tenant {slug:?} already exists"),
        key: "tenants",
        names: vec![],
    })?;
    if !users::insert(&mut *tx, Some(tenant.id), admin_email, &hash_password(&password), "owner").await? {
        return Err(ApiError::Conflict {
            message: format!("admin {admin_email:?} already exists"),
            key: "users",
            names: vec![],
        });
    }
    audit::record(&mut *tx, tenant.id, actor, Action::TenantCreated, slug, (None, None), None).await?;
    tx.commit().await?;
    Ok(CreatedTenant { tenant, admin_email: admin_email.to_lowercase(), password })
}

pub struct CreatedKey {
    pub meta: KeyMeta,
    /// `sk-shield-…`; shown once, stored only as its SHA-256.
    pub key: String,
}

fn check_label(field: &str, value: Option<&str>) -> Result<(), ApiError> {
    match value {
        Some(v) if v.trim().is_empty() || v.len() > 128 || v.chars().any(char::is_control) => {
            Err(ApiError::validation(field, "must be 1-128 characters without control characters"))
        }
        _ => Ok(()),
    }
}

/// What a new API key is made of (`POST /v1/tenant/me/keys`, `shield key create`).
#[derive(Debug, Clone, Default)]
pub struct KeySpec<'a> {
    pub name: &'a str,
    pub agent: Option<&'a str>,
    pub role: Option<&'a str>,
    /// Its rate limits (issue 18), allow-list, expiry, budget and metadata (issue 32).
    pub settings: KeySettings,
}

/// A new secret: `(key, its SHA-256 hex, its recognisable prefix)`.
pub fn new_secret() -> (String, String, String) {
    let key = format_api_key(&random::bytes::<32>());
    let hash = key_hash(&key);
    let prefix = key.get(..API_KEY_PREFIX.len() + 4).unwrap_or_default().to_string();
    (key, hash, prefix)
}

/// Every problem of a key's settings, by field; `now` for the expiry.
pub fn check_settings(settings: &KeySettings, now: DateTime<Utc>) -> Result<(), Vec<FieldError>> {
    let mut p = Problems::default();
    settings.limits.check(&mut p, "limits");
    if let Some(routes) = &settings.routes {
        key_access::check_routes(routes, &mut p, "routes");
    }
    if settings.expires_at.is_some_and(|at| at <= now) {
        p.push("expires_at", "must be in the future");
    }
    if let Some(budget) = &settings.budget {
        budget.check(&mut p, "budget");
    }
    key_access::check_metadata(&settings.metadata, &mut p, "metadata");
    p.into_result()
}

/// A key's settings as the audit log digests them (never a secret).
pub fn settings_digest(settings: &KeySettings) -> String {
    digest_of(&serde_json::json!({
        "limits": settings.limits, "routes": settings.routes, "expires_at": settings.expires_at,
        "budget": settings.budget, "metadata": settings.metadata,
    }))
}

/// An audit row's details for a key: what people know it by.
pub fn audit_details(key: &KeyMeta) -> serde_json::Value {
    serde_json::json!({"name": key.name, "prefix": key.prefix, "metadata": key.metadata})
}

/// Creates an API key for `tenant`, records it in the audit log (a digest of its settings,
/// its name and metadata) and publishes it.
pub async fn create_key(
    db: &PgPool,
    publisher: &Publisher,
    tenant: &Tenant,
    spec: KeySpec<'_>,
    actor: &str,
) -> Result<CreatedKey, ApiError> {
    let KeySpec { name, agent, role, settings } = spec;
    check_label("name", Some(name))?;
    check_label("agent", agent)?;
    check_label("role", role)?;
    check_settings(&settings, Utc::now())?;
    let (key, hash, prefix) = new_secret();
    let mut write = ConfigWrite::begin(db, publisher, tenant, actor).await?;
    let new = NewKey { name, agent, role, key_hash: &hash, prefix: &prefix, settings: &settings };
    let meta = keys::insert(write.conn(), tenant.id, new).await?;
    let after = Some(settings_digest(&settings));
    let version = write.version();
    write.commit_with(Action::KeyCreated, &meta.id.to_string(), (None, after), Some(audit_details(&meta))).await?;
    publisher.key_changed(tenant.id, &tenant.slug, &meta, version).await;
    Ok(CreatedKey { meta, key })
}
