//! Targets, routes and the guardrail policy, stored as JSON bodies that shield-core validated.

use std::collections::BTreeMap;

use shield_core::guardrails::GuardrailPolicy;
use shield_core::route::Route;
use shield_core::target::Target;
use sqlx::PgExecutor;
use sqlx::types::Json;

pub async fn targets(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<BTreeMap<String, Target>> {
    let rows: Vec<(String, Json<Target>)> =
        sqlx::query_as("SELECT id, body FROM targets WHERE tenant_id = $1 ORDER BY id")
            .bind(tenant_id)
            .fetch_all(db)
            .await?;
    Ok(rows.into_iter().map(|(id, Json(t))| (id, t)).collect())
}

pub async fn target(db: impl PgExecutor<'_>, tenant_id: i64, id: &str) -> sqlx::Result<Option<Target>> {
    let row: Option<(Json<Target>,)> = sqlx::query_as("SELECT body FROM targets WHERE tenant_id = $1 AND id = $2")
        .bind(tenant_id)
        .bind(id)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|(Json(t),)| t))
}

pub async fn target_count(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT count(*) FROM targets WHERE tenant_id = $1").bind(tenant_id).fetch_one(db).await
}

/// Creates or replaces; `true` when created.
pub async fn put_target(db: impl PgExecutor<'_>, tenant_id: i64, target: &Target) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "INSERT INTO targets (tenant_id, id, body) VALUES ($1, $2, $3)
         ON CONFLICT (tenant_id, id) DO UPDATE SET body = EXCLUDED.body, updated_at = now()
         RETURNING (xmax = 0)",
    )
    .bind(tenant_id)
    .bind(&target.id)
    .bind(Json(target))
    .fetch_one(db)
    .await
}

pub async fn delete_target(db: impl PgExecutor<'_>, tenant_id: i64, id: &str) -> sqlx::Result<bool> {
    let done = sqlx::query("DELETE FROM targets WHERE tenant_id = $1 AND id = $2")
        .bind(tenant_id)
        .bind(id)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

pub async fn routes(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<Vec<Route>> {
    let rows: Vec<(Json<Route>,)> = sqlx::query_as("SELECT body FROM routes WHERE tenant_id = $1 ORDER BY name")
        .bind(tenant_id)
        .fetch_all(db)
        .await?;
    Ok(rows.into_iter().map(|(Json(r),)| r).collect())
}

pub async fn route(db: impl PgExecutor<'_>, tenant_id: i64, name: &str) -> sqlx::Result<Option<Route>> {
    let row: Option<(Json<Route>,)> = sqlx::query_as("SELECT body FROM routes WHERE tenant_id = $1 AND name = $2")
        .bind(tenant_id)
        .bind(name)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|(Json(r),)| r))
}

pub async fn route_count(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT count(*) FROM routes WHERE tenant_id = $1").bind(tenant_id).fetch_one(db).await
}

pub async fn put_route(db: impl PgExecutor<'_>, tenant_id: i64, route: &Route) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "INSERT INTO routes (tenant_id, name, body) VALUES ($1, $2, $3)
         ON CONFLICT (tenant_id, name) DO UPDATE SET body = EXCLUDED.body, updated_at = now()
         RETURNING (xmax = 0)",
    )
    .bind(tenant_id)
    .bind(&route.name)
    .bind(Json(route))
    .fetch_one(db)
    .await
}

pub async fn delete_route(db: impl PgExecutor<'_>, tenant_id: i64, name: &str) -> sqlx::Result<bool> {
    let done = sqlx::query("DELETE FROM routes WHERE tenant_id = $1 AND name = $2")
        .bind(tenant_id)
        .bind(name)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

pub async fn guardrails(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<GuardrailPolicy> {
    let row: Option<(Json<GuardrailPolicy>,)> =
        sqlx::query_as("SELECT body FROM guardrail_policies WHERE tenant_id = $1")
            .bind(tenant_id)
            .fetch_optional(db)
            .await?;
    Ok(row.map(|(Json(p),)| p).unwrap_or_default())
}

pub async fn put_guardrails(db: impl PgExecutor<'_>, tenant_id: i64, policy: &GuardrailPolicy) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO guardrail_policies (tenant_id, body) VALUES ($1, $2)
         ON CONFLICT (tenant_id) DO UPDATE SET body = EXCLUDED.body, updated_at = now()",
    )
    .bind(tenant_id)
    .bind(Json(policy))
    .execute(db)
    .await?;
    Ok(())
}
