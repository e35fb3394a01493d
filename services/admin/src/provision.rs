//! Creating tenants and API keys: shared by the admin API and the CLI so both follow one path
//! (validation, hashing, audit, publishing).

use shield_core::limits::Limits;
use shield_core::names::check_tenant_slug;
use shield_core::snapshot::{API_KEY_PREFIX, format_api_key, key_hash};
use sqlx::PgPool;

use crate::auth::hash_password;
use crate::error::ApiError;
use crate::publish::{Publisher, key_record};
use crate::random;
use crate::repo::audit::{self, Action};
use crate::repo::keys::{self, KeyMeta, NewKey};
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
    audit::record(&mut *tx, tenant.id, actor, Action::TenantCreated, slug, None, None).await?;
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
#[derive(Debug, Clone, Copy, Default)]
pub struct KeySpec<'a> {
    pub name: &'a str,
    pub agent: Option<&'a str>,
    pub role: Option<&'a str>,
    /// Issue 18: the key's own rate limits (empty: none).
    pub limits: Limits,
}

/// Creates an API key for `tenant`, records it in the audit log (with a digest of its limits
/// when it has some) and publishes it.
pub async fn create_key(
    db: &PgPool,
    publisher: &Publisher,
    tenant: &Tenant,
    spec: KeySpec<'_>,
    actor: &str,
) -> Result<CreatedKey, ApiError> {
    let KeySpec { name, agent, role, limits } = spec;
    check_label("name", Some(name))?;
    check_label("agent", agent)?;
    check_label("role", role)?;
    limits.validate("limits")?;
    let key = format_api_key(&random::bytes::<32>());
    let hash = key_hash(&key);
    let prefix = &key[..API_KEY_PREFIX.len() + 4];
    let mut write = ConfigWrite::begin(db, publisher, tenant, actor).await?;
    let new = NewKey { name, agent, role, key_hash: &hash, prefix, limits: &limits };
    let meta = keys::insert(write.conn(), tenant.id, new).await?;
    let after = (!limits.is_empty()).then(|| digest_of(&limits));
    write.commit(Action::KeyCreated, &meta.id.to_string(), None, after).await?;
    publisher.key_changed(tenant.id, &hash, &key_record(&tenant.slug, &meta)).await;
    Ok(CreatedKey { meta, key })
}
