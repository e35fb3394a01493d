//! Tenant API keys: only the SHA-256 of a key is stored, with a short prefix to recognise it.
//! A key's rate limits are stored as NULL when it has none and read back as `{}`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use shield_core::limits::Limits;
use sqlx::PgExecutor;
use sqlx::types::Json;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct KeyMeta {
    pub id: Uuid,
    pub name: String,
    /// The first characters of the key, to recognise it in a list.
    pub prefix: String,
    pub agent: Option<String>,
    pub role: Option<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// The key's own rate limits; `{}` when it has none.
    #[sqlx(json)]
    pub limits: Limits,
    #[serde(skip)]
    pub key_hash: String,
}

macro_rules! columns {
    () => {
        "id, name, prefix, agent, role, created_at, revoked_at, COALESCE(limits, '{}'::jsonb) AS limits, key_hash"
    };
}

/// What is stored for a key's limits: NULL when there are none.
fn stored(limits: &Limits) -> Option<Json<&Limits>> {
    (!limits.is_empty()).then_some(Json(limits))
}

pub struct NewKey<'a> {
    pub name: &'a str,
    pub agent: Option<&'a str>,
    pub role: Option<&'a str>,
    pub key_hash: &'a str,
    pub prefix: &'a str,
    pub limits: &'a Limits,
}

pub async fn insert(db: impl PgExecutor<'_>, tenant_id: i64, key: NewKey<'_>) -> sqlx::Result<KeyMeta> {
    sqlx::query_as(concat!("INSERT INTO api_keys (id, tenant_id, name, key_hash, prefix, agent, role, limits) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING ", columns!(), ""))
    .bind(Uuid::new_v4())
    .bind(tenant_id)
    .bind(key.name)
    .bind(key.key_hash)
    .bind(key.prefix)
    .bind(key.agent)
    .bind(key.role)
    .bind(stored(key.limits))
    .fetch_one(db)
    .await
}

pub async fn list(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<Vec<KeyMeta>> {
    sqlx::query_as(concat!("SELECT ", columns!(), " FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id"))
        .bind(tenant_id)
        .fetch_all(db)
        .await
}

pub async fn get(db: impl PgExecutor<'_>, tenant_id: i64, id: Uuid) -> sqlx::Result<Option<KeyMeta>> {
    sqlx::query_as(concat!("SELECT ", columns!(), " FROM api_keys WHERE tenant_id = $1 AND id = $2"))
        .bind(tenant_id)
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Marks the key revoked (idempotent); `None` when it is not this tenant's key.
pub async fn revoke(db: impl PgExecutor<'_>, tenant_id: i64, id: Uuid) -> sqlx::Result<Option<KeyMeta>> {
    sqlx::query_as(concat!(
        "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now()) WHERE tenant_id = $1 AND id = $2 RETURNING ",
        columns!(),
        ""
    ))
    .bind(tenant_id)
    .bind(id)
    .fetch_optional(db)
    .await
}

/// Replaces the key's limits (an empty value clears them); `None` when it is not this tenant's key.
pub async fn set_limits(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    id: Uuid,
    limits: &Limits,
) -> sqlx::Result<Option<KeyMeta>> {
    sqlx::query_as(concat!(
        "UPDATE api_keys SET limits = $3 WHERE tenant_id = $1 AND id = $2 RETURNING ",
        columns!(),
        ""
    ))
    .bind(tenant_id)
    .bind(id)
    .bind(stored(limits))
    .fetch_optional(db)
    .await
}
