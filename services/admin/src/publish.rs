//! Snapshot publishing: after every committed config write the tenant's snapshot goes to
//! `gw_snapshot:{tenant}` and is announced on `gw_config`; API keys go to `gw_key:<sha256>`.
//!
//! Postgres is the truth. A publish that fails (Redis down) never fails the write: the tenant
//! is marked dirty and retried every second, and a full comparison of every tenant's version
//! in Redis against Postgres runs at start and every `republish_every`, so Redis converges
//! whatever happened while it was away. Publishing is conditional on the version (a Lua
//! script), so a slow publisher can never overwrite a newer snapshot with an older one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use redis::AsyncCommands;
use shield_core::keys::RedisKeys;
use shield_core::snapshot::{ApiKeyRecord, ConfigMessage, Snapshot, SnapshotSecret};
use shield_store::Pool as RedisPool;
use sqlx::PgPool;

use crate::repo::{config, keys, secrets, tenants};

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("Redis is unreachable: {0}")]
    RedisPool(#[from] shield_store::PoolError),
    #[error("Redis refused the write: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("could not read the configuration: {0}")]
    Database(#[from] sqlx::Error),
    #[error("tenant {0} no longer exists")]
    NoTenant(i64),
}

/// SET the snapshot only when it is newer than what Redis holds, then announce it.
const PUBLISH_SNAPSHOT: &str = r#"
local current = redis.call('GET', KEYS[1])
if current then
  local ok, decoded = pcall(cjson.decode, current)
  if ok and type(decoded) == 'table' and tonumber(decoded['version']) and tonumber(decoded['version']) >= tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
"#;

/// SET a key record only when Redis holds none of a later version: publishes that overlap
/// (a PATCH and a revocation, two rotations, a background republish) cannot land out of order.
const PUBLISH_KEY: &str = r#"
local current = redis.call('GET', KEYS[1])
if current then
  local ok, decoded = pcall(cjson.decode, current)
  if ok and type(decoded) == 'table' and tonumber(decoded['version']) and tonumber(decoded['version']) > tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"#;

pub struct Publisher {
    db: PgPool,
    redis: RedisPool,
    keys: RedisKeys,
    script: redis::Script,
    key_script: redis::Script,
    dirty: Mutex<BTreeSet<i64>>,
}

impl Publisher {
    pub fn new(db: PgPool, redis: RedisPool, keys: RedisKeys) -> Publisher {
        Publisher {
            db,
            redis,
            keys,
            script: redis::Script::new(PUBLISH_SNAPSHOT),
            key_script: redis::Script::new(PUBLISH_KEY),
            dirty: Mutex::new(BTreeSet::new()),
        }
    }

    /// Publishes after a committed write. Never fails the caller: on error the tenant is
    /// retried in the background.
    pub async fn after_write(&self, tenant_id: i64) {
        if let Err(err) = self.publish(tenant_id, false).await {
            tracing::warn!(tenant_id, error = %err, "snapshot not published yet; will retry");
            self.dirty.lock().insert(tenant_id);
        }
    }

    /// Publishes a key's records (its secret's, and a rotated key's previous secret's) after
    /// it was created, changed, rotated or revoked, so the change reaches proxies at once; on
    /// failure the tenant is fully republished in the background.
    /// `version` is the write's config version ([`crate::write::ConfigWrite::version`]).
    pub async fn key_changed(&self, tenant_id: i64, tenant_slug: &str, key: &keys::KeyMeta, version: i64) {
        if let Err(err) = self.set_records(key_records(tenant_slug, key, version)).await {
            tracing::warn!(tenant_id, error = %err, "key not published yet; will retry");
            self.dirty.lock().insert(tenant_id);
        }
    }

    /// Publishes `records` (key hash → record), announcing each; stops at the first failure.
    pub async fn set_records(&self, records: Vec<(String, ApiKeyRecord)>) -> Result<(), PublishError> {
        let mut conn = self.redis.get().await?;
        for (hash, record) in &records {
            self.set_key(&mut conn, hash, record).await?;
        }
        Ok(())
    }

    /// Publishes the tenant's snapshot; with `with_keys`, every API key record too (for
    /// convergence, when Redis may have lost them).
    #[allow(clippy::expect_used, reason = "serialising derived structs of strings and numbers cannot fail")]
    pub async fn publish(&self, tenant_id: i64, with_keys: bool) -> Result<(), PublishError> {
        let (snapshot, key_records) = self.build(tenant_id, with_keys).await?;
        let mut conn = self.redis.get().await?;
        let message = serde_json::to_string(&ConfigMessage::Tenant {
            tenant: snapshot.tenant.clone(),
            version: snapshot.version,
        })
        .expect("config message serialises");
        let body = serde_json::to_string(&snapshot).expect("snapshot serialises");
        let _: i64 = self
            .script
            .key(self.keys.snapshot(&snapshot.tenant))
            .arg(snapshot.version)
            .arg(body)
            .arg(self.keys.config_channel())
            .arg(message)
            .invoke_async(&mut conn)
            .await?;
        for (hash, record) in key_records {
            self.set_key(&mut conn, &hash, &record).await?;
        }
        Ok(())
    }

    #[allow(clippy::expect_used, reason = "serialising derived structs of strings and numbers cannot fail")]
    async fn set_key(
        &self,
        conn: &mut shield_store::Connection,
        key_hash: &str,
        record: &ApiKeyRecord,
    ) -> Result<(), PublishError> {
        let body = serde_json::to_string(record).expect("key record serialises");
        let message = serde_json::to_string(&ConfigMessage::Key { key_hash: key_hash.to_string() })
            .expect("config message serialises");
        // Two commands, not one script: the key and the channel hash to different cluster slots.
        let written: i64 =
            self.key_script.key(self.keys.api_key(key_hash)).arg(record.version).arg(body).invoke_async(conn).await?;
        if written == 1 {
            let _: i64 = conn.publish(self.keys.config_channel(), message).await?;
        }
        Ok(())
    }

    async fn build(
        &self,
        tenant_id: i64,
        with_keys: bool,
    ) -> Result<(Snapshot, Vec<(String, ApiKeyRecord)>), PublishError> {
        let mut tx = self.db.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY").execute(&mut *tx).await?;
        let tenant = tenants::by_id(&mut *tx, tenant_id).await?.ok_or(PublishError::NoTenant(tenant_id))?;
        let targets = config::targets(&mut *tx, tenant_id).await?;
        let routes: BTreeMap<_, _> =
            config::routes(&mut *tx, tenant_id).await?.into_iter().map(|r| (r.name.clone(), r)).collect();
        let guardrails = config::guardrails(&mut *tx, tenant_id).await?;
        let limits = tenants::limits(&mut *tx, tenant_id).await?;
        let responses = tenants::response_retention(&mut *tx, tenant_id).await?;
        let budget = tenants::budget(&mut *tx, tenant_id).await?;
        let referenced: BTreeSet<&str> = targets.values().filter_map(|t| t.auth.secret_name()).collect();
        let mut sealed_secrets = BTreeMap::new();
        for row in secrets::sealed(&mut *tx, tenant_id).await? {
            if let (true, Some(sealed)) = (referenced.contains(row.name.as_str()), row.sealed()) {
                let reference = format!("{}{}", shield_core::target::SECRET_REF_SCHEME, row.name);
                sealed_secrets.insert(reference, SnapshotSecret::from_sealed(&sealed, row.bindings.clone()));
            }
        }
        let all_keys = if with_keys { keys::list(&mut *tx, tenant_id).await? } else { Vec::new() };
        let version = tenant.config_version;
        let key_records = all_keys.iter().flat_map(|k| key_records(&tenant.slug, k, version)).collect();
        tx.commit().await?;
        let now = chrono::Utc::now().timestamp();
        let snapshot =
            Snapshot::new(tenant.slug, tenant.config_version, now, targets, routes, guardrails, sealed_secrets)
                .with_limits(limits)
                .with_responses(responses)
                .with_budget(budget);
        Ok((snapshot, key_records))
    }

    /// Republishes every tenant whose snapshot in Redis is missing or older than Postgres.
    /// Returns how many were republished.
    pub async fn converge(&self) -> Result<usize, PublishError> {
        let all = tenants::list(&self.db).await?;
        let mut conn = self.redis.get().await?;
        let mut republished = 0;
        for tenant in all {
            let stored: Option<String> = conn.get(self.keys.snapshot(&tenant.slug)).await?;
            let stored_version = stored
                .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
                .and_then(|v| v.get("version").and_then(|v| v.as_i64()));
            if stored_version.is_none_or(|v| v < tenant.config_version) {
                self.publish(tenant.id, true).await?;
                republished += 1;
            }
        }
        Ok(republished)
    }

    async fn retry_dirty(&self) {
        let pending: Vec<i64> = std::mem::take(&mut *self.dirty.lock()).into_iter().collect();
        for tenant_id in pending {
            if let Err(err) = self.publish(tenant_id, true).await {
                tracing::debug!(tenant_id, error = %err, "republish still failing");
                self.dirty.lock().insert(tenant_id);
            } else {
                tracing::info!(tenant_id, "snapshot published after Redis came back");
            }
        }
    }

    /// The Redis server's `run_id` (in a cluster, every master's): it changes when Redis
    /// restarts or a replica takes over a master (and may have lost data).
    async fn redis_run_id(&self) -> Option<String> {
        self.redis.identity().await
    }

    /// Runs until the process ends. Every second: retry dirty tenants, and when Redis was away
    /// or restarted since the last look (a new `run_id`), converge at once rather than waiting
    /// for the periodic pass. A full convergence also runs at start and every `every`.
    pub fn spawn(self: Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut last_full: Option<tokio::time::Instant> = None;
            let mut seen_run_id: Option<String> = None;
            let mut redis_down_logged = false;
            loop {
                let run_id = self.redis_run_id().await;
                let redis_changed = run_id.is_some() && run_id != seen_run_id;
                if redis_changed || last_full.is_none_or(|at| at.elapsed() >= every) {
                    match self.converge().await {
                        Ok(n) => {
                            if n > 0 {
                                tracing::info!(republished = n, "republished lagging snapshots");
                            }
                            redis_down_logged = false;
                            seen_run_id = run_id;
                            last_full = Some(tokio::time::Instant::now());
                        }
                        Err(err) => {
                            if !redis_down_logged {
                                tracing::warn!(error = %err, "cannot compare snapshots with Redis; retrying every second");
                                redis_down_logged = true;
                            }
                        }
                    }
                }
                self.retry_dirty().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    }
}

/// What the proxy reads for a key's current secret, as of the tenant's config `version`.
pub fn key_record(tenant_slug: &str, key: &keys::KeyMeta, version: i64) -> ApiKeyRecord {
    ApiKeyRecord {
        tenant: tenant_slug.to_string(),
        key_id: key.id.to_string(),
        name: key.name.clone(),
        agent: key.agent.clone(),
        role: key.role.clone(),
        revoked: key.revoked_at.is_some(),
        limits: key.limits,
        routes: key.routes.clone(),
        expires_at: key.expires_at.map(|at| at.timestamp()),
        rotated: false,
        budget: key.budget,
        version,
    }
}

/// Every record of a key, by secret hash: its current secret's and, after a rotation, its
/// previous secret's — the same key (id, settings, spend) that stops at the grace's end.
pub fn key_records(tenant_slug: &str, key: &keys::KeyMeta, version: i64) -> Vec<(String, ApiKeyRecord)> {
    let current = key_record(tenant_slug, key, version);
    let mut records = Vec::with_capacity(2);
    if let (Some(hash), Some(until)) = (&key.previous_key_hash, key.previous_until) {
        let until = until.timestamp();
        let ends = current.expires_at.map_or(until, |at| at.min(until));
        let previous = ApiKeyRecord { expires_at: Some(ends), rotated: true, ..current.clone() };
        records.push((hash.clone(), previous));
    }
    records.push((key.key_hash.clone(), current));
    records
}
