//! One committed config write, the only way tenant configuration changes:
//! begin (bump the tenant's version, holding its row lock) → the change → one audit row →
//! commit → publish the snapshot (never failing the write; see [`crate::publish`]).

use serde::Serialize;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use crate::error::ApiResult;
use crate::publish::Publisher;
use crate::repo::audit::{self, Action};
use crate::repo::tenants::{self, Tenant};

pub struct ConfigWrite<'a> {
    tx: Transaction<'static, Postgres>,
    publisher: &'a Publisher,
    tenant_id: i64,
    actor: String,
    version: i64,
}

impl<'a> ConfigWrite<'a> {
    pub async fn begin(
        db: &PgPool,
        publisher: &'a Publisher,
        tenant: &Tenant,
        actor: &str,
    ) -> ApiResult<ConfigWrite<'a>> {
        let mut tx = db.begin().await?;
        let version = tenants::begin_write(&mut tx, tenant.id).await?;
        Ok(ConfigWrite { tx, publisher, tenant_id: tenant.id, actor: actor.to_string(), version })
    }

    /// The tenant's config version this write makes (what key records are published at).
    pub fn version(&self) -> i64 {
        self.version
    }

    /// The transaction, for reads and writes that must see (and be part of) this change.
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// Records the audit row, commits and publishes. `before`/`after` are digests, never bodies.
    pub async fn commit(
        self,
        action: Action,
        object: &str,
        before: Option<String>,
        after: Option<String>,
    ) -> ApiResult<()> {
        self.commit_with(action, object, (before, after), None).await
    }

    /// [`ConfigWrite::commit`] with the audit row's details (a key's name and metadata).
    pub async fn commit_with(
        mut self,
        action: Action,
        object: &str,
        (before, after): (Option<String>, Option<String>),
        details: Option<serde_json::Value>,
    ) -> ApiResult<()> {
        let details = details.as_ref();
        audit::record(&mut *self.tx, self.tenant_id, &self.actor, action, object, (before, after), details).await?;
        self.tx.commit().await?;
        self.publisher.after_write(self.tenant_id).await;
        Ok(())
    }
}

/// SHA-256 hex of a value's JSON: what audit rows record instead of bodies.
pub fn digest_of(value: &impl Serialize) -> String {
    crate::repo::digest(&serde_json::to_value(value).unwrap_or_default())
}
