//! Admin users (portal and API logins).

use sqlx::PgExecutor;
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct User {
    pub id: Uuid,
    pub tenant_slug: Option<String>,
    pub email: String,
    pub password_hash: String,
    pub role: String,
}

pub async fn by_email(db: impl PgExecutor<'_>, email: &str) -> sqlx::Result<Option<User>> {
    sqlx::query_as(
        "SELECT u.id, t.slug AS tenant_slug, u.email, u.password_hash, u.role
         FROM admin_users u LEFT JOIN tenants t ON t.id = u.tenant_id WHERE u.email = $1",
    )
    .bind(email.to_lowercase())
    .fetch_optional(db)
    .await
}

/// Inserts a user; `false` when the e-mail is taken.
pub async fn insert(
    db: impl PgExecutor<'_>,
    tenant_id: Option<i64>,
    email: &str,
    password_hash: &str,
    role: &str,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "INSERT INTO admin_users (id, tenant_id, email, password_hash, role) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (email) DO NOTHING",
    )
    .bind(Uuid::new_v4())
    .bind(tenant_id)
    .bind(email.to_lowercase())
    .bind(password_hash)
    .bind(role)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub async fn set_password(db: impl PgExecutor<'_>, email: &str, password_hash: &str) -> sqlx::Result<()> {
    sqlx::query("UPDATE admin_users SET password_hash = $2 WHERE email = $1")
        .bind(email.to_lowercase())
        .bind(password_hash)
        .execute(db)
        .await?;
    Ok(())
}
