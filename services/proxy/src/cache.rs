//! In-process caches of API keys and tenant configuration, read from Redis.
//!
//! The request path reads memory only once an entry is cached; the first request for a key or
//! a tenant fetches it once. A background refresher re-reads every cached entry every
//! `SHIELD_LLM_ROUTING_CACHE_S` (stale-while-revalidate) and `gw_config` messages refresh an
//! entry at once. When Redis is away, cached entries keep serving.

use crate::FastMap as HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use shield_core::keys::RedisKeys;
use shield_core::snapshot::{ApiKeyRecord, ConfigMessage, Snapshot};
use shield_core::vault::Keyring;

use crate::tenant::TenantConfig;

/// How long a Redis read may take before the store counts as unreachable.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// Unknown keys are remembered at most this many; beyond, they are forgotten first, so random
/// keys cannot grow memory without bound.
const MAX_UNKNOWN_KEYS: usize = 100_000;

#[derive(Debug, thiserror::Error)]
#[error("Redis is unreachable: {0}")]
pub struct StoreDown(String);

pub enum KeyLookup {
    Valid(Arc<ApiKeyRecord>),
    Invalid,
    /// Not cached and Redis cannot be asked: fail closed with 503, never a misleading 401.
    Unavailable,
}

#[derive(Clone)]
enum KeyEntry {
    Known(Arc<ApiKeyRecord>),
    Unknown(Instant),
}

#[derive(Clone)]
enum TenantEntry {
    Loaded(Arc<TenantConfig>),
    /// The tenant has published no snapshot: it has no routes.
    Absent,
}

/// One tenant's flushed spend this month, in micro-USD.
#[derive(Default)]
struct MonthSpend {
    /// `yyyymm`.
    month: String,
    routes: HashMap<String, i64>,
    /// By key id (issue 32).
    keys: HashMap<String, i64>,
    total: i64,
    /// The ticket of the read that fetched it: a read never replaces a later one's figures.
    read: u64,
}

pub struct Caches {
    redis: shield_store::Pool,
    pub redis_keys: RedisKeys,
    keyring: Keyring,
    every: Duration,
    api_keys: RwLock<HashMap<String, KeyEntry>>,
    tenants: RwLock<HashMap<String, TenantEntry>>,
    /// Each cached tenant's flushed month spend per route, per key and in total, refreshed
    /// with the configuration (seed §3.3).
    spend: RwLock<HashMap<String, MonthSpend>>,
    /// Tickets for spend reads, in the order they start.
    spend_reads: AtomicU64,
    /// The monthly budget of every cached key with one, in micro-USD, by key id: what a flush
    /// claims a key's alert against.
    key_budgets: RwLock<HashMap<String, i64>>,
    /// Redis has answered at least once (readiness).
    ready: AtomicBool,
    unknown_keys: AtomicU64,
}

impl Caches {
    pub fn new(redis: shield_store::Pool, redis_keys: RedisKeys, keyring: Keyring, every: Duration) -> Caches {
        Caches {
            redis,
            redis_keys,
            keyring,
            every,
            api_keys: RwLock::default(),
            tenants: RwLock::default(),
            spend: RwLock::default(),
            spend_reads: AtomicU64::new(0),
            key_budgets: RwLock::default(),
            ready: AtomicBool::new(false),
            unknown_keys: AtomicU64::new(0),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    fn answered(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Resolves a key by its SHA-256 hex.
    pub async fn key(&self, hash: &str) -> KeyLookup {
        let cached = self.api_keys.read().get(hash).cloned();
        match cached {
            Some(KeyEntry::Known(record)) => {
                return if record.revoked { KeyLookup::Invalid } else { KeyLookup::Valid(record) };
            }
            Some(KeyEntry::Unknown(at)) if at.elapsed() < self.every => return KeyLookup::Invalid,
            _ => {}
        }
        // Boxed: the miss path's Redis future is large, and inline it would make every request's
        // future (moved into the heap by actix) that much larger; misses are rare.
        match Box::pin(self.fetch_key(hash)).await {
            Ok(Some(record)) => {
                let record = Arc::new(record);
                self.remember(hash, record.clone());
                if record.revoked { KeyLookup::Invalid } else { KeyLookup::Valid(record) }
            }
            Ok(None) => {
                let mut keys = self.api_keys.write();
                if self.unknown_keys.fetch_add(1, Ordering::Relaxed) as usize >= MAX_UNKNOWN_KEYS {
                    keys.retain(|_, entry| matches!(entry, KeyEntry::Known(_)));
                    self.unknown_keys.store(0, Ordering::Relaxed);
                }
                keys.insert(hash.to_string(), KeyEntry::Unknown(Instant::now()));
                KeyLookup::Invalid
            }
            Err(_) => KeyLookup::Unavailable,
        }
    }

    /// The tenant's configuration: `Ok(None)` when it has published none; `Err` when it is not
    /// cached and Redis cannot be asked.
    pub async fn tenant(&self, tenant: &str) -> Result<Option<Arc<TenantConfig>>, StoreDown> {
        let cached = self.tenants.read().get(tenant).cloned();
        match cached {
            Some(TenantEntry::Loaded(config)) => Ok(Some(config)),
            Some(TenantEntry::Absent) => Ok(None),
            None => {
                let entry = Box::pin(self.load_tenant(tenant)).await?;
                self.tenants.write().insert(tenant.to_string(), entry.clone());
                Ok(match entry {
                    TenantEntry::Loaded(config) => Some(config),
                    TenantEntry::Absent => None,
                })
            }
        }
    }

    /// Caches a key's record, and its budget by key id.
    fn remember(&self, hash: &str, record: Arc<ApiKeyRecord>) {
        let budget = record.budget.map(|b| b.monthly.micros());
        match budget {
            Some(micros) => self.key_budgets.write().insert(record.key_id.clone(), micros),
            None => self.key_budgets.write().remove(&record.key_id),
        };
        self.api_keys.write().insert(hash.to_string(), KeyEntry::Known(record));
    }

    /// Reads `f` of the tenant's flushed spend when it is of this month (else nothing: a new
    /// month).
    fn this_month<T: Default>(&self, tenant: &str, f: impl FnOnce(&MonthSpend) -> T) -> T {
        let today = crate::calendar::today();
        match self.spend.read().get(tenant) {
            Some(spend) if spend.month == today.month() => f(spend),
            _ => T::default(),
        }
    }

    /// The month spend of `route` as last flushed by all processes (0 for a new month).
    pub fn month_spend(&self, tenant: &str, route: &str) -> i64 {
        self.this_month(tenant, |spend| spend.routes.get(route).copied().unwrap_or(0))
    }

    /// The month spend of the key, and of its whole tenant, as last flushed by all processes.
    pub fn key_and_tenant_spend(&self, tenant: &str, key_id: &str) -> (i64, i64) {
        self.this_month(tenant, |spend| (spend.keys.get(key_id).copied().unwrap_or(0), spend.total))
    }

    /// Reads the tenant's flushed spend from Redis into the cache; `false` when Redis could not
    /// be read. Reads overlap (the refresher, a tenant's first load, the flusher): a read that
    /// started earlier, and may miss a flush that landed since, never replaces a later one's.
    pub async fn refresh_spend(&self, tenant: &str) -> bool {
        let ticket = self.spend_reads.fetch_add(1, Ordering::Relaxed) + 1;
        let month = crate::calendar::this_month();
        let read = async {
            let mut conn = self.redis.get().await.ok()?;
            let all = |key: String| redis::cmd("HGETALL").arg(key).to_owned();
            let routes = all(self.redis_keys.spend(tenant, &month));
            let keys = all(self.redis_keys.key_spend(tenant, &month));
            let total = all(self.redis_keys.tenant_spend(tenant, &month));
            let decode = shield_core::records::spend::decode;
            let routes = decode(routes.query_async::<Vec<(String, String)>>(&mut conn).await.ok()?);
            let keys = decode(keys.query_async::<Vec<(String, String)>>(&mut conn).await.ok()?);
            let total = decode(total.query_async::<Vec<(String, String)>>(&mut conn).await.ok()?);
            Some(MonthSpend {
                month: month.clone(),
                routes: routes.into_iter().collect(),
                keys: keys.into_iter().collect(),
                total: total.get(shield_core::records::spend::TOTAL).copied().unwrap_or(0),
                read: ticket,
            })
        };
        let Ok(Some(spend)) = tokio::time::timeout(STORE_TIMEOUT, read).await else { return false };
        let mut cached = self.spend.write();
        if cached.get(tenant).is_none_or(|known| known.read < spend.read) {
            cached.insert(tenant.to_string(), spend);
        }
        true
    }

    async fn load_tenant(&self, tenant: &str) -> Result<TenantEntry, StoreDown> {
        let snapshot = self.fetch_snapshot(tenant).await?;
        self.refresh_spend(tenant).await;
        Ok(match snapshot {
            Some(snapshot) => TenantEntry::Loaded(Arc::new(TenantConfig::build(snapshot, &self.keyring))),
            None => TenantEntry::Absent,
        })
    }

    async fn get(&self, key: String) -> Result<Option<String>, StoreDown> {
        let read = async {
            let mut conn = self.redis.get().await.map_err(|e| StoreDown(e.to_string()))?;
            conn.get::<_, Option<String>>(key).await.map_err(|e| StoreDown(e.to_string()))
        };
        let value = tokio::time::timeout(STORE_TIMEOUT, read).await.map_err(|_| StoreDown("timed out".into()))??;
        self.answered();
        Ok(value)
    }

    async fn fetch_key(&self, hash: &str) -> Result<Option<ApiKeyRecord>, StoreDown> {
        let text = self.get(self.redis_keys.api_key(hash)).await?;
        Ok(text.and_then(|t| match serde_json::from_str(&t) {
            Ok(record) => Some(record),
            Err(err) => {
                tracing::error!(error = %err, "unreadable key record in Redis; treating the key as unknown");
                None
            }
        }))
    }

    async fn fetch_snapshot(&self, tenant: &str) -> Result<Option<Snapshot>, StoreDown> {
        let text = self.get(self.redis_keys.snapshot(tenant)).await?;
        match text.map(|t| serde_json::from_str::<Snapshot>(&t)) {
            None => Ok(None),
            Some(Ok(snapshot)) => Ok(Some(snapshot)),
            Some(Err(err)) => Err(StoreDown(format!("unreadable snapshot for {tenant}: {err}"))),
        }
    }

    /// Re-reads one tenant; keeps the cached entry when Redis cannot be asked.
    async fn refresh_tenant(&self, tenant: &str, min_version: Option<i64>) {
        let cached_version = match self.tenants.read().get(tenant) {
            Some(TenantEntry::Loaded(config)) => Some(config.snapshot.version),
            Some(TenantEntry::Absent) => None,
            None if min_version.is_some() => return, // not a tenant this process serves
            None => None,
        };
        if let (Some(cached), Some(wanted)) = (cached_version, min_version)
            && cached >= wanted
        {
            return;
        }
        match self.fetch_snapshot(tenant).await {
            Ok(Some(snapshot)) if Some(snapshot.version) == cached_version => {}
            Ok(fetched) => {
                let entry = match fetched {
                    Some(snapshot) => TenantEntry::Loaded(Arc::new(TenantConfig::build(snapshot, &self.keyring))),
                    None => TenantEntry::Absent,
                };
                self.tenants.write().insert(tenant.to_string(), entry);
            }
            Err(err) => {
                tracing::debug!(tenant, error = %err, "snapshot refresh failed; serving the cached one")
            }
        }
    }

    async fn refresh_key(&self, hash: &str) {
        match self.fetch_key(hash).await {
            Ok(Some(record)) => self.remember(hash, Arc::new(record)),
            Ok(None) => {
                self.api_keys.write().remove(hash);
            }
            Err(err) => tracing::debug!(error = %err, "key refresh failed; serving the cached one"),
        }
    }

    /// Re-reads every cached key and tenant (the stale-while-revalidate half).
    pub async fn refresh_all(&self) {
        let keys: Vec<String> = self
            .api_keys
            .read()
            .iter()
            .filter(|(_, e)| matches!(e, KeyEntry::Known(_)))
            .map(|(k, _)| k.clone())
            .collect();
        for hash in keys {
            self.refresh_key(&hash).await;
        }
        let tenants: Vec<String> = self.tenants.read().keys().cloned().collect();
        for tenant in tenants {
            self.refresh_tenant(&tenant, None).await;
            self.refresh_spend(&tenant).await;
        }
    }

    pub async fn on_message(&self, message: ConfigMessage) {
        match message {
            ConfigMessage::Tenant { tenant, version } => self.refresh_tenant(&tenant, Some(version)).await,
            ConfigMessage::Reset { .. } => {}
            ConfigMessage::Key { key_hash } => {
                let cached = self.api_keys.read().contains_key(&key_hash);
                if cached {
                    self.refresh_key(&key_hash).await;
                }
            }
        }
    }

    /// `published_at` of every cached snapshot, by tenant (for the snapshot-age gauge).
    pub fn snapshot_times(&self) -> Vec<(String, i64)> {
        let tenants = self.tenants.read();
        tenants
            .iter()
            .filter_map(|(tenant, entry)| match entry {
                TenantEntry::Loaded(config) => Some((tenant.clone(), config.snapshot.published_at)),
                TenantEntry::Absent => None,
            })
            .collect()
    }

    /// Answers whether Redis is reachable now (and marks readiness when it is).
    pub async fn ping(&self) -> bool {
        let ping = async {
            let mut conn = self.redis.get().await.ok()?;
            redis::cmd("PING").query_async::<String>(&mut conn).await.ok()
        };
        let ok = tokio::time::timeout(STORE_TIMEOUT, ping).await.ok().flatten().is_some();
        if ok {
            self.answered();
        }
        ok
    }
}

/// The budgets of cached routes, keys and tenants in micro-USD (0: none), for budget alerts.
impl crate::flush::Budgets for Caches {
    fn route(&self, tenant: &str, route: &str) -> i64 {
        match self.tenants.read().get(tenant) {
            Some(TenantEntry::Loaded(config)) => config
                .snapshot
                .routes
                .get(route)
                .and_then(|r| r.budget.as_ref())
                .map(|b| b.monthly.micros())
                .unwrap_or(0),
            _ => 0,
        }
    }

    fn key(&self, _tenant: &str, key_id: &str) -> i64 {
        self.key_budgets.read().get(key_id).copied().unwrap_or(0)
    }

    fn tenant(&self, tenant: &str) -> i64 {
        match self.tenants.read().get(tenant) {
            Some(TenantEntry::Loaded(config)) => config.snapshot.budget.map_or(0, |b| b.monthly.micros()),
            _ => 0,
        }
    }
}
