//! Webhooks and their delivery log.

use chrono::{DateTime, Utc};
use serde::Serialize;
use shield_core::vault::{NONCE_LEN, Sealed};
use sqlx::PgExecutor;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct WebhookMeta {
    pub id: Uuid,
    pub url: String,
    pub events: Vec<String>,
    pub allow_private: bool,
    pub created_at: DateTime<Utc>,
}

/// A webhook with its sealed signing secret, for the deliverer.
#[derive(sqlx::FromRow)]
pub struct WebhookTarget {
    pub id: Uuid,
    pub url: String,
    pub allow_private: bool,
    pub secret_ciphertext: Vec<u8>,
    pub secret_nonce: Vec<u8>,
    pub secret_key_version: i32,
}

impl WebhookTarget {
    pub fn sealed(&self) -> Option<Sealed> {
        let nonce: [u8; NONCE_LEN] = self.secret_nonce.as_slice().try_into().ok()?;
        Some(Sealed {
            ciphertext: self.secret_ciphertext.clone(),
            nonce,
            key_version: u32::try_from(self.secret_key_version).ok()?,
        })
    }
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Delivery {
    pub delivery_id: String,
    pub event_type: String,
    pub attempt: i32,
    pub status: Option<i32>,
    pub error: Option<String>,
    pub outcome: String,
    pub at: DateTime<Utc>,
}

pub async fn insert(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    id: Uuid,
    url: &str,
    events: &[String],
    allow_private: bool,
    sealed: &Sealed,
) -> sqlx::Result<WebhookMeta> {
    sqlx::query_as(
        "INSERT INTO webhooks (id, tenant_id, url, events, allow_private, secret_ciphertext, secret_nonce, secret_key_version)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id, url, events, allow_private, created_at",
    )
    .bind(id)
    .bind(tenant_id)
    .bind(url)
    .bind(events)
    .bind(allow_private)
    .bind(&sealed.ciphertext)
    .bind(sealed.nonce.as_slice())
    .bind(sealed.key_version as i32)
    .fetch_one(db)
    .await
}

pub async fn list(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<Vec<WebhookMeta>> {
    sqlx::query_as(
        "SELECT id, url, events, allow_private, created_at FROM webhooks WHERE tenant_id = $1 ORDER BY created_at, id",
    )
    .bind(tenant_id)
    .fetch_all(db)
    .await
}

pub async fn delete(db: impl PgExecutor<'_>, tenant_id: i64, id: Uuid) -> sqlx::Result<bool> {
    let done = sqlx::query("DELETE FROM webhooks WHERE tenant_id = $1 AND id = $2")
        .bind(tenant_id)
        .bind(id)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

pub async fn exists(db: impl PgExecutor<'_>, tenant_id: i64, id: Uuid) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM webhooks WHERE tenant_id = $1 AND id = $2)")
        .bind(tenant_id)
        .bind(id)
        .fetch_one(db)
        .await
}

/// The webhooks of the tenant `slug` subscribed to `event`.
pub async fn subscribed(db: impl PgExecutor<'_>, slug: &str, event: &str) -> sqlx::Result<Vec<WebhookTarget>> {
    sqlx::query_as(
        "SELECT w.id, w.url, w.allow_private, w.secret_ciphertext, w.secret_nonce, w.secret_key_version
         FROM webhooks w JOIN tenants t ON t.id = w.tenant_id WHERE t.slug = $1 AND $2 = ANY (w.events)",
    )
    .bind(slug)
    .bind(event)
    .fetch_all(db)
    .await
}

/// One delivery attempt, as recorded.
pub struct AttemptRecord<'a> {
    pub delivery_id: &'a str,
    pub event_type: &'a str,
    pub attempt: i32,
    pub status: Option<i32>,
    pub error: Option<&'a str>,
    pub outcome: &'a str,
}

pub async fn record(db: impl PgExecutor<'_>, webhook_id: Uuid, a: AttemptRecord<'_>) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO webhook_deliveries (webhook_id, delivery_id, event_type, attempt, status, error, outcome)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(webhook_id)
    .bind(a.delivery_id)
    .bind(a.event_type)
    .bind(a.attempt)
    .bind(a.status)
    .bind(a.error)
    .bind(a.outcome)
    .execute(db)
    .await?;
    Ok(())
}

pub async fn deliveries(db: impl PgExecutor<'_>, webhook_id: Uuid, limit: i64) -> sqlx::Result<Vec<Delivery>> {
    sqlx::query_as(
        "SELECT delivery_id, event_type, attempt, status, error, outcome, at FROM webhook_deliveries
         WHERE webhook_id = $1 ORDER BY id DESC LIMIT $2",
    )
    .bind(webhook_id)
    .bind(limit)
    .fetch_all(db)
    .await
}
