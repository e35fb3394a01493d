//! The audit log: who changed what, when, with digests of before and after. Never a body with
//! a secret and never a secret value.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    TenantCreated,
    TargetSet,
    TargetDeleted,
    TargetReset,
    RouteSet,
    RouteDeleted,
    SecretSet,
    SecretDeleted,
    KeyCreated,
    KeyRevoked,
    KeyLimitsSet,
    KeyUpdated,
    KeyRotated,
    TenantBudgetSet,
    TenantLimitsSet,
    GuardrailsSet,
    ResponseRetentionSet,
    WebhookCreated,
    WebhookDeleted,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::TenantCreated => "tenant_created",
            Action::TargetSet => "gateway_target_set",
            Action::TargetDeleted => "gateway_target_deleted",
            Action::TargetReset => "gateway_target_reset",
            Action::RouteSet => "gateway_route_set",
            Action::RouteDeleted => "gateway_route_deleted",
            Action::SecretSet => "secret_set",
            Action::SecretDeleted => "secret_deleted",
            Action::KeyCreated => "key_created",
            Action::KeyRevoked => "key_revoked",
            Action::KeyLimitsSet => "key_limits_set",
            Action::KeyUpdated => "key_updated",
            Action::KeyRotated => "key_rotated",
            Action::TenantBudgetSet => "tenant_budget_set",
            Action::TenantLimitsSet => "tenant_limits_set",
            Action::GuardrailsSet => "guardrails_set",
            Action::ResponseRetentionSet => "response_retention_set",
            Action::WebhookCreated => "webhook_created",
            Action::WebhookDeleted => "webhook_deleted",
        }
    }
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Entry {
    pub id: i64,
    pub actor: String,
    pub action: String,
    pub object: String,
    pub before_digest: Option<String>,
    pub after_digest: Option<String>,
    /// What the change was about, beyond its digests: a key's name and metadata (issue 32).
    /// Never a secret.
    pub details: Option<serde_json::Value>,
    pub at: DateTime<Utc>,
}

pub async fn record(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    actor: &str,
    action: Action,
    object: &str,
    (before, after): (Option<String>, Option<String>),
    details: Option<&serde_json::Value>,
) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO audit_log (tenant_id, actor, action, object, before_digest, after_digest, details) VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(tenant_id)
        .bind(actor)
        .bind(action.as_str())
        .bind(object)
        .bind(before)
        .bind(after)
        .bind(details)
        .execute(db)
        .await?;
    Ok(())
}

pub async fn list(db: impl PgExecutor<'_>, tenant_id: i64, limit: i64) -> sqlx::Result<Vec<Entry>> {
    sqlx::query_as(
        "SELECT id, actor, action, object, before_digest, after_digest, details, at FROM audit_log
         WHERE tenant_id = $1 ORDER BY id DESC LIMIT $2",
    )
    .bind(tenant_id)
    .bind(limit)
    .fetch_all(db)
    .await
}
