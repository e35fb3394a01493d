//! Tenants, their config version and their rate-limit ceiling.

use chrono::{DateTime, Utc};
use serde::Serialize;
use shield_core::key_access::MonthlyBudget;
use shield_core::limits::Limits;
use shield_core::snapshot::ResponseRetention;
use sqlx::types::Json;
use sqlx::{PgExecutor, Postgres, Transaction};

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Tenant {
    #[serde(skip)]
    pub id: i64,
    pub slug: String,
    pub name: String,
    pub config_version: i64,
    pub created_at: DateTime<Utc>,
}

macro_rules! columns {
    () => {
        "id, slug, name, config_version, created_at"
    };
}

pub async fn by_slug(db: impl PgExecutor<'_>, slug: &str) -> sqlx::Result<Option<Tenant>> {
    sqlx::query_as(concat!("SELECT ", columns!(), " FROM tenants WHERE slug = $1")).bind(slug).fetch_optional(db).await
}

pub async fn by_id(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<Tenant>> {
    sqlx::query_as(concat!("SELECT ", columns!(), " FROM tenants WHERE id = $1")).bind(id).fetch_optional(db).await
}

pub async fn list(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Tenant>> {
    sqlx::query_as(concat!("SELECT ", columns!(), " FROM tenants ORDER BY slug")).fetch_all(db).await
}

/// Inserts a tenant; `None` when the slug is taken.
pub async fn insert(db: impl PgExecutor<'_>, slug: &str, name: &str) -> sqlx::Result<Option<Tenant>> {
    sqlx::query_as(concat!(
        "INSERT INTO tenants (slug, name) VALUES ($1, $2) ON CONFLICT (slug) DO NOTHING RETURNING ",
        columns!(),
        ""
    ))
    .bind(slug)
    .bind(name)
    .fetch_optional(db)
    .await
}

/// Starts a config write: bumps the tenant's version and holds its row lock until commit, so
/// writes to one tenant are serialised (limits and cross-references stay consistent) and every
/// committed write has its own version. Returns the new version.
pub async fn begin_write(tx: &mut Transaction<'_, Postgres>, tenant_id: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar("UPDATE tenants SET config_version = config_version + 1 WHERE id = $1 RETURNING config_version")
        .bind(tenant_id)
        .fetch_one(&mut **tx)
        .await
}

/// The tenant's own limits (issue 18): a ceiling over all its keys and routes; empty when none.
pub async fn limits(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Limits> {
    let row: Option<Option<Json<Limits>>> =
        sqlx::query_scalar("SELECT limits FROM tenants WHERE id = $1").bind(id).fetch_optional(db).await?;
    Ok(row.flatten().map(|Json(limits)| limits).unwrap_or_default())
}

/// The operator's monthly cap on the tenant's spend (issue 32); `None` when there is none.
pub async fn budget(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<MonthlyBudget>> {
    let row: Option<Option<Json<MonthlyBudget>>> =
        sqlx::query_scalar("SELECT budget FROM tenants WHERE id = $1").bind(id).fetch_optional(db).await?;
    Ok(row.flatten().map(|Json(budget)| budget))
}

pub async fn set_budget(db: impl PgExecutor<'_>, id: i64, budget: Option<MonthlyBudget>) -> sqlx::Result<()> {
    sqlx::query("UPDATE tenants SET budget = $2 WHERE id = $1").bind(id).bind(budget.map(Json)).execute(db).await?;
    Ok(())
}

/// How long the tenant's stored responses are kept (issue 29).
pub async fn response_retention(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<ResponseRetention> {
    let row: Option<i32> = sqlx::query_scalar("SELECT responses_retention_s FROM tenants WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await?;
    Ok(row.map_or_else(ResponseRetention::default, |s| ResponseRetention { retention_s: s.max(0).unsigned_abs() }))
}

pub async fn set_response_retention(
    db: impl PgExecutor<'_>,
    id: i64,
    retention: ResponseRetention,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE tenants SET responses_retention_s = $2 WHERE id = $1")
        .bind(id)
        .bind(i32::try_from(retention.retention_s).unwrap_or(i32::MAX))
        .execute(db)
        .await?;
    Ok(())
}

/// Replaces the tenant's limits; empty ones are stored as NULL.
pub async fn set_limits(db: impl PgExecutor<'_>, id: i64, limits: &Limits) -> sqlx::Result<()> {
    sqlx::query("UPDATE tenants SET limits = $2 WHERE id = $1")
        .bind(id)
        .bind((!limits.is_empty()).then_some(Json(limits)))
        .execute(db)
        .await?;
    Ok(())
}
