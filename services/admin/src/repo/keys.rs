//! Tenant API keys: only the SHA-256 of a key is stored, with a short prefix to recognise it.
//! A key's rate limits are stored as NULL when it has none and read back as `{}`. A rotated
//! key keeps its id, settings and spend; its previous secret's hash is kept for the grace.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use shield_core::key_access::MonthlyBudget;
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
    /// Route names and `*` patterns the key may name; `null`: every route.
    pub routes: Option<Vec<String>>,
    /// When the key stops working; `null`: never.
    pub expires_at: Option<DateTime<Utc>>,
    /// The key's monthly spend budget; `null`: none.
    #[sqlx(json(nullable))]
    pub budget: Option<MonthlyBudget>,
    /// Labels of the key's holder (owner, team, purpose); `{}` when none.
    #[sqlx(json)]
    pub metadata: BTreeMap<String, String>,
    /// When the key was last rotated.
    pub rotated_at: Option<DateTime<Utc>>,
    /// Until when the secret it had before its last rotation keeps working.
    pub previous_until: Option<DateTime<Utc>>,
    #[serde(skip)]
    pub key_hash: String,
    #[serde(skip)]
    pub previous_key_hash: Option<String>,
}

macro_rules! columns {
    () => {
        "id, name, prefix, agent, role, created_at, revoked_at, COALESCE(limits, '{}'::jsonb) AS limits, routes, \
         expires_at, budget, metadata, rotated_at, previous_until, key_hash, previous_key_hash"
    };
}

/// What is stored for a key's limits: NULL when there are none.
fn stored(limits: &Limits) -> Option<Json<&Limits>> {
    (!limits.is_empty()).then_some(Json(limits))
}

/// What a key may do, as stored: set at creation, changed by `PATCH` (issue 32).
#[derive(Debug, Clone, Default)]
pub struct KeySettings {
    pub limits: Limits,
    pub routes: Option<Vec<String>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub budget: Option<MonthlyBudget>,
    pub metadata: BTreeMap<String, String>,
}

impl KeySettings {
    pub fn of(meta: &KeyMeta) -> KeySettings {
        KeySettings {
            limits: meta.limits,
            routes: meta.routes.clone(),
            expires_at: meta.expires_at,
            budget: meta.budget,
            metadata: meta.metadata.clone(),
        }
    }
}

pub struct NewKey<'a> {
    pub name: &'a str,
    pub agent: Option<&'a str>,
    pub role: Option<&'a str>,
    pub key_hash: &'a str,
    pub prefix: &'a str,
    pub settings: &'a KeySettings,
}

pub async fn insert(db: impl PgExecutor<'_>, tenant_id: i64, key: NewKey<'_>) -> sqlx::Result<KeyMeta> {
    let settings = key.settings;
    sqlx::query_as(concat!(
        "INSERT INTO api_keys (id, tenant_id, name, key_hash, prefix, agent, role, limits, routes, expires_at, budget, metadata) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING ",
        columns!(),
        ""
    ))
    .bind(Uuid::new_v4())
    .bind(tenant_id)
    .bind(key.name)
    .bind(key.key_hash)
    .bind(key.prefix)
    .bind(key.agent)
    .bind(key.role)
    .bind(stored(&settings.limits))
    .bind(&settings.routes)
    .bind(settings.expires_at)
    .bind(settings.budget.map(Json))
    .bind(Json(&settings.metadata))
    .fetch_one(db)
    .await
}

pub async fn list(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<Vec<KeyMeta>> {
    sqlx::query_as(concat!("SELECT ", columns!(), " FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id"))
        .bind(tenant_id)
        .fetch_all(db)
        .await
}

/// The key, its row locked until the transaction ends (a change reads, checks and writes it).
pub async fn get(db: impl PgExecutor<'_>, tenant_id: i64, id: Uuid) -> sqlx::Result<Option<KeyMeta>> {
    sqlx::query_as(concat!("SELECT ", columns!(), " FROM api_keys WHERE tenant_id = $1 AND id = $2 FOR UPDATE"))
        .bind(tenant_id)
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Replaces what the key may do; `None` when it is not this tenant's key.
pub async fn set_settings(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    id: Uuid,
    settings: &KeySettings,
) -> sqlx::Result<Option<KeyMeta>> {
    sqlx::query_as(concat!(
        "UPDATE api_keys SET limits = $3, routes = $4, expires_at = $5, budget = $6, metadata = $7 \
         WHERE tenant_id = $1 AND id = $2 RETURNING ",
        columns!(),
        ""
    ))
    .bind(tenant_id)
    .bind(id)
    .bind(stored(&settings.limits))
    .bind(&settings.routes)
    .bind(settings.expires_at)
    .bind(settings.budget.map(Json))
    .bind(Json(&settings.metadata))
    .fetch_optional(db)
    .await
}

/// Gives the key a new secret; the one it had works until `previous_until` (a secret kept
/// from an earlier rotation is forgotten: the caller retires it).
pub async fn rotate(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    id: Uuid,
    (key_hash, prefix): (&str, &str),
    previous_until: DateTime<Utc>,
) -> sqlx::Result<Option<KeyMeta>> {
    sqlx::query_as(concat!(
        "UPDATE api_keys SET previous_key_hash = key_hash, previous_until = $5, key_hash = $3, prefix = $4, \
         rotated_at = now() WHERE tenant_id = $1 AND id = $2 RETURNING ",
        columns!(),
        ""
    ))
    .bind(tenant_id)
    .bind(id)
    .bind(key_hash)
    .bind(prefix)
    .bind(previous_until)
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
