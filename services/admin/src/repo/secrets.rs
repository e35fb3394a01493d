//! Vault rows: ciphertext, nonce, key version and host bindings. Reads for the API return
//! [`SecretMeta`], which has no field that could hold a value.

use chrono::{DateTime, Utc};
use serde::Serialize;
use shield_core::validate::SecretBindings;
use shield_core::vault::{NONCE_LEN, Sealed};
use sqlx::PgExecutor;

/// What the API shows of a secret: never the value.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct SecretMeta {
    pub name: String,
    pub bindings: Vec<String>,
    /// At most the last 4 characters (`…abcd`), and only for values of 16+ characters.
    pub hint: Option<String>,
    pub key_version: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
pub struct SealedRow {
    pub name: String,
    pub ciphertext: Vec<u8>,
    pub nonce: Vec<u8>,
    pub key_version: i32,
    pub bindings: Vec<String>,
}

impl SealedRow {
    pub fn sealed(&self) -> Option<Sealed> {
        let nonce: [u8; NONCE_LEN] = self.nonce.as_slice().try_into().ok()?;
        Some(Sealed { ciphertext: self.ciphertext.clone(), nonce, key_version: u32::try_from(self.key_version).ok()? })
    }
}

macro_rules! meta {
    () => {
        "name, bindings, hint, key_version, created_at, updated_at"
    };
}

pub async fn list(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<Vec<SecretMeta>> {
    sqlx::query_as(concat!("SELECT ", meta!(), " FROM secrets WHERE tenant_id = $1 ORDER BY name"))
        .bind(tenant_id)
        .fetch_all(db)
        .await
}

pub async fn get(db: impl PgExecutor<'_>, tenant_id: i64, name: &str) -> sqlx::Result<Option<SecretMeta>> {
    sqlx::query_as(concat!("SELECT ", meta!(), " FROM secrets WHERE tenant_id = $1 AND name = $2"))
        .bind(tenant_id)
        .bind(name)
        .fetch_optional(db)
        .await
}

pub async fn bindings(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<SecretBindings> {
    let rows: Vec<(String, Vec<String>)> =
        sqlx::query_as("SELECT name, bindings FROM secrets WHERE tenant_id = $1").bind(tenant_id).fetch_all(db).await?;
    Ok(rows.into_iter().collect())
}

pub async fn sealed(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<Vec<SealedRow>> {
    sqlx::query_as("SELECT name, ciphertext, nonce, key_version, bindings FROM secrets WHERE tenant_id = $1")
        .bind(tenant_id)
        .fetch_all(db)
        .await
}

pub async fn put(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    name: &str,
    sealed: &Sealed,
    bindings: &[String],
    hint: Option<&str>,
) -> sqlx::Result<(SecretMeta, bool)> {
    let (meta, created): (SecretMeta, bool) = {
        #[derive(sqlx::FromRow)]
        struct Row {
            #[sqlx(flatten)]
            meta: SecretMeta,
            created: bool,
        }
        let row: Row = sqlx::query_as(concat!("INSERT INTO secrets (tenant_id, name, ciphertext, nonce, key_version, bindings, hint)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (tenant_id, name) DO UPDATE SET ciphertext = EXCLUDED.ciphertext, nonce = EXCLUDED.nonce,
                 key_version = EXCLUDED.key_version, bindings = EXCLUDED.bindings, hint = EXCLUDED.hint, updated_at = now()
             RETURNING ", meta!(), ", (xmax = 0) AS created"))
        .bind(tenant_id)
        .bind(name)
        .bind(&sealed.ciphertext)
        .bind(sealed.nonce.as_slice())
        .bind(sealed.key_version as i32)
        .bind(bindings)
        .bind(hint)
        .fetch_one(db)
        .await?;
        (row.meta, row.created)
    };
    Ok((meta, created))
}

pub async fn delete(db: impl PgExecutor<'_>, tenant_id: i64, name: &str) -> sqlx::Result<bool> {
    let done = sqlx::query("DELETE FROM secrets WHERE tenant_id = $1 AND name = $2")
        .bind(tenant_id)
        .bind(name)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}
