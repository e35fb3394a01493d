//! Writing this process's view to Redis, off the request path: the health flush every
//! `SHIELD_LLM_ROUTING_FLUSH_S` (`gw_health:{tenant}`, field `"{target}|{process}"`, TTL 1 h)
//! and `gateway_target_down` events to the `gw_events` stream as they come. Redis being away
//! only delays these writes; nothing on the request path waits for them.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use shield_core::keys::RedisKeys;
use shield_core::records;
use shield_core::records::events::GatewayEvent;

use crate::health::{Health, TargetDown};

const HEALTH_TTL_S: i64 = 3600;
/// `gw_events` is capped (approximately) at this many entries.
const EVENTS_MAX_LEN: usize = 100_000;

/// This process's name in `gw_health` and events: host, pid and a random suffix.
pub fn process_id() -> String {
    static ID: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let host =
            std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "host".into());
        let mut suffix = uuid::Uuid::new_v4().simple().to_string();
        suffix.truncate(6);
        format!("{host}-{}-{suffix}", std::process::id())
    });
    ID.clone()
}

/// What the flusher writes from.
#[derive(Clone)]
pub struct Flusher {
    pub health: Arc<Health>,
    pub usage: Arc<crate::usage::UsageBuffer>,
    pub caches: Arc<crate::cache::Caches>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub redis: shield_store::Pool,
    pub keys: RedisKeys,
}

impl Flusher {
    /// Every `every`: usage, then health. Events are written as they come.
    pub fn spawn(self, every: Duration, mut events: tokio::sync::mpsc::Receiver<TargetDown>) {
        let flusher = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(err) = flusher.flush_once().await {
                    tracing::debug!(error = %err, "flush failed; will retry");
                }
            }
        });
        tokio::spawn(async move {
            while let Some(down) = events.recv().await {
                // Retry until Redis takes it: an event must not be lost to a short outage.
                while let Err(err) = write_event(&down, &self.redis, &self.keys).await {
                    tracing::debug!(error = %err, "gw_events write failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        });
    }

    /// One flush of usage and health; returns the usage rows written.
    pub async fn flush_once(&self) -> Result<usize, String> {
        let _alone = self.usage.one_flush_at_a_time().await;
        let usage = flush_usage(&self.usage, &self.redis, &self.keys, self.caches.as_ref()).await;
        // What the flush took stays counted as unflushed until the cached totals hold it: read
        // back after the merge, then released (a tenant whose read fails keeps it in flight, and
        // is read again after the next flush). A budget check reads the unflushed spend before
        // the cached, so in between it counts the spend twice, never not at all.
        for tenant in self.usage.in_flight() {
            if self.caches.refresh_spend(&tenant).await {
                self.usage.landed(&tenant);
            }
        }
        self.metrics.usage_buffer_dropped.inc_by(self.usage.take_dropped());
        flush_health(&self.health, &self.redis, &self.keys).await?;
        usage
    }
}

pub async fn flush_health(health: &Health, redis: &shield_store::Pool, keys: &RedisKeys) -> Result<(), String> {
    let process = process_id();
    let rows = health.rows(&process);
    if rows.is_empty() {
        return Ok(());
    }
    // One pipeline to a single server; in a cluster one per tenant, so each stays in its slot.
    let mut pipes: Vec<redis::Pipeline> = Vec::new();
    for (tenant, targets) in rows {
        if pipes.is_empty() || redis.is_cluster() {
            pipes.push(redis::pipe());
        }
        let Some(pipe) = pipes.last_mut() else { continue };
        let key = keys.health(&tenant);
        for (target, row) in targets {
            pipe.hset(&key, records::health::field(&target, &process), row.encode()).ignore();
        }
        pipe.expire(&key, HEALTH_TTL_S).ignore();
    }
    let mut conn = redis.get().await.map_err(|e| e.to_string())?;
    for pipe in pipes {
        pipe.query_async::<()>(&mut conn).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn write_event(down: &TargetDown, redis: &shield_store::Pool, keys: &RedisKeys) -> Result<(), String> {
    let data = json!({"target": down.target, "process": process_id(), "failures": down.failures, "last_error": down.last_error});
    write_event_of(&down.tenant, records::events::GATEWAY_TARGET_DOWN, data, redis, keys).await
}

/// XADD one [`GatewayEvent`] (a new id, now) to `gw_events`, in shield-core's encoding.
pub async fn write_event_of(
    tenant: &str,
    kind: &str,
    data: serde_json::Value,
    redis: &shield_store::Pool,
    keys: &RedisKeys,
) -> Result<(), String> {
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let event = GatewayEvent {
        id: uuid::Uuid::new_v4().to_string(),
        tenant: tenant.to_string(),
        kind: kind.to_string(),
        at: i64::try_from(at).unwrap_or(i64::MAX),
        data,
    };
    let mut xadd = redis::cmd("XADD");
    xadd.arg(keys.events()).arg("MAXLEN").arg("~").arg(EVENTS_MAX_LEN).arg("*");
    for (field, value) in event.fields() {
        xadd.arg(field).arg(value);
    }
    let mut conn = redis.get().await.map_err(|e| e.to_string())?;
    xadd.query_async::<String>(&mut conn).await.map(|_| ()).map_err(|e| e.to_string())
}

const USAGE_TTL_S: i64 = 95 * 24 * 3600;
const SPEND_TTL_S: i64 = 400 * 24 * 3600;

/// The monthly budgets a flush claims alerts against, in micro-USD (0: none).
pub trait Budgets: Sync {
    fn route(&self, tenant: &str, route: &str) -> i64;
    fn key(&self, tenant: &str, key_id: &str) -> i64;
    fn tenant(&self, tenant: &str) -> i64;
}

/// Flushes the usage buffer: one merge per tenant, of its route rows, its key rows (issue 32)
/// and its spend per route, per key and in total; a tenant whose merge fails gets its rows
/// back for the next flush.
pub async fn flush_usage(
    buffer: &crate::usage::UsageBuffer,
    redis: &shield_store::Pool,
    keys: &RedisKeys,
    budgets: &dyn Budgets,
) -> Result<usize, String> {
    use std::collections::BTreeMap;
    let taken = buffer.take();
    if taken.is_empty() {
        return Ok(0);
    }
    let by_tenant = taken.by_tenant();
    let script = redis::Script::new(&records::usage::merge_script());
    let mut conn = match redis.get().await {
        Ok(conn) => conn,
        Err(err) => {
            by_tenant.into_values().for_each(|rows| buffer.restore(rows));
            return Err(err.to_string());
        }
    };
    let mut flushed = 0;
    let mut failure = None;
    for (tenant, rows) in by_tenant {
        let mut key_names: Vec<String> = Vec::new();
        let mut index = |name: String| match key_names.iter().position(|k| *k == name) {
            Some(i) => i + 1,
            None => {
                key_names.push(name);
                key_names.len()
            }
        };
        let mut usage = Vec::new();
        // (scope, month, name) → micros: a route's, a key's, the tenant's total. Ordered by
        // scope: every route entry precedes the tenant's total, which the script may seed from
        // the route spend it has just added to.
        let mut spend: BTreeMap<(Scope, String, String), i64> = BTreeMap::new();
        for ((_, day, route, target), row) in &rows.routes {
            let counters = records::usage::counters(row);
            usage.push(json!([index(keys.usage(&tenant, day)), records::usage::field(route, target), counters]));
            let month = day.get(..6).unwrap_or(day);
            *spend.entry((Scope::Route, month.to_string(), route.clone())).or_default() += row.cost_micros;
            *spend.entry((Scope::Tenant, month.to_string(), String::new())).or_default() += row.cost_micros;
        }
        for ((_, day, key_id, route), row) in &rows.keys {
            let counters = records::usage::counters(row);
            usage.push(json!([index(keys.key_usage(&tenant, day)), records::usage::field(key_id, route), counters]));
            let month = day.get(..6).unwrap_or(day);
            *spend.entry((Scope::Key, month.to_string(), key_id.clone())).or_default() += row.cost_micros;
        }
        let spend: Vec<serde_json::Value> = spend
            .into_iter()
            .map(|((scope, month, name), cost)| {
                let alert_key = index(keys.budget_alerted(&tenant, &month));
                let (spend_key, field, budget, alert) = match scope {
                    Scope::Route => (keys.spend(&tenant, &month), name.clone(), budgets.route(&tenant, &name), name),
                    Scope::Key => (
                        keys.key_spend(&tenant, &month),
                        name.clone(),
                        budgets.key(&tenant, &name),
                        records::spend::key_alert(&name),
                    ),
                    Scope::Tenant => (
                        keys.tenant_spend(&tenant, &month),
                        records::spend::TOTAL.to_string(),
                        budgets.tenant(&tenant),
                        records::spend::TENANT_ALERT.to_string(),
                    ),
                };
                let mut entry = json!([index(spend_key), field, cost, budget, alert_key, alert, month]);
                if let (Scope::Tenant, Some(entry)) = (scope, entry.as_array_mut()) {
                    entry.push(json!(index(keys.spend(&tenant, &month))));
                }
                entry
            })
            .collect();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let args =
            json!({"usage": usage, "spend": spend, "usage_ttl": USAGE_TTL_S, "spend_ttl": SPEND_TTL_S, "now": now});
        let mut invocation = script.prepare_invoke();
        for key in &key_names {
            invocation.key(key);
        }
        invocation.arg(args.to_string());
        match invocation.invoke_async::<Vec<(String, String, String)>>(&mut conn).await {
            Ok(winners) => {
                flushed += rows.routes.len() + rows.keys.len();
                for (alert, total, month) in winners {
                    let data = budget_event(&tenant, &alert, &total, &month, budgets);
                    if let Err(err) = write_event_of(&tenant, records::events::BUDGET_EXCEEDED, data, redis, keys).await
                    {
                        tracing::warn!(tenant, alert, error = %err, "budget_exceeded event not written");
                    }
                }
            }
            Err(err) => {
                buffer.restore(rows);
                failure = Some(err.to_string());
            }
        }
    }
    match failure {
        Some(err) => Err(err),
        None => Ok(flushed),
    }
}

/// Whose spend a flush adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Route,
    Key,
    Tenant,
}

/// A `budget_exceeded` event's data for the alert field a flush won: `scope` says whose
/// budget (`route`, `key` with `key_id`, `tenant` for the operator's cap).
fn budget_event(tenant: &str, alert: &str, total: &str, month: &str, budgets: &dyn Budgets) -> serde_json::Value {
    let (scope, limit, subject) = if let Some(key_id) = alert.strip_prefix("key:") {
        ("key", budgets.key(tenant, key_id), json!({"key_id": key_id}))
    } else if alert == records::spend::TENANT_ALERT {
        ("tenant", budgets.tenant(tenant), json!({}))
    } else {
        ("route", budgets.route(tenant, alert), json!({"route": alert}))
    };
    let mut data = json!({"scope": scope, "month": month, "spend": micros_to_usd(total), "limit": micros_to_usd(&limit.to_string()), "currency": "USD"});
    if let (Some(data), Some(subject)) = (data.as_object_mut(), subject.as_object()) {
        data.extend(subject.clone());
    }
    data
}

fn micros_to_usd(micros: &str) -> serde_json::Value {
    let micros: i64 = micros.parse().unwrap_or(0);
    serde_json::Value::from(shield_core::money::Usd(micros).to_decimal().parse::<f64>().unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Caches;
    use crate::usage::{Answered, UsageBuffer};
    use shield_core::run::Attempt;

    /// A flusher merging into `write_url` whose caches read back from `read_url`.
    fn flusher(usage: &Arc<UsageBuffer>, write_url: &str, redis_url: &str, keys: &RedisKeys) -> Flusher {
        let writes_to = shield_store::Pool::open(write_url, 2).unwrap();
        let keyring = shield_core::vault::Keyring::from_base64(&base64_of_zeros(), 1).unwrap();
        let read_from = shield_store::Pool::open(redis_url, 2).unwrap();
        let caches = Arc::new(Caches::new(read_from, keys.clone(), keyring, Duration::from_secs(60)));
        Flusher {
            health: Arc::new(Health::new(tokio::sync::mpsc::channel(1).0)),
            usage: usage.clone(),
            caches,
            metrics: Arc::new(crate::metrics::Metrics::new(false)),
            redis: writes_to,
            keys: keys.clone(),
        }
    }

    fn base64_of_zeros() -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode([0u8; 32])
    }

    fn spend(usage: &UsageBuffer, cost: i64) {
        let attempt = Attempt {
            n: 1,
            target: "a".into(),
            model: "m".into(),
            outcome: "ok",
            class: None,
            status: None,
            ms: 1,
            committed: false,
            retry: false,
            resumed: false,
        };
        let answered = Answered {
            target: "a",
            input_tokens: 1,
            output_tokens: 1,
            cost_micros: cost,
            estimated: false,
            stream_broken: false,
        };
        usage.record("t", "k", "r", &[attempt], &[answered]);
    }

    /// What a budget check sees (the unflushed spend first, as `pipeline::check_budgets`
    /// reads it): the key's spend and the tenant's.
    fn seen(flusher: &Flusher) -> (i64, i64) {
        let unflushed = flusher.usage.unflushed_key_and_tenant("t", "k");
        let flushed = flusher.caches.key_and_tenant_spend("t", "k");
        (unflushed.0 + flushed.0, unflushed.1 + flushed.1)
    }

    /// A flush takes the buffered rows before its merge lands and before the cached totals are
    /// read back. The spend it took stays counted until then: a budget check in between once
    /// passed a spent budget (and missed a warning) because it saw the spend nowhere.
    #[tokio::test]
    async fn spend_a_flush_took_counts_until_the_cached_totals_hold_it() {
        let keys = RedisKeys::new(format!("shield-test-flush-{}", uuid::Uuid::new_v4().simple()));
        let usage = Arc::new(UsageBuffer::default());
        // Its caches read from a Redis that is not there: the merge lands, the read-back fails.
        let (up, away) = ("redis://127.0.0.1:6379", "redis://127.0.0.1:1");
        let cannot_read = flusher(&usage, up, away, &keys);
        let reads = flusher(&usage, up, up, &keys);
        let cannot_write = flusher(&usage, away, up, &keys);
        spend(&usage, 500);
        assert_eq!(seen(&reads), (500, 500));

        assert!(cannot_write.flush_once().await.is_err(), "Redis is away");
        assert_eq!(seen(&reads), (500, 500), "a failed flush puts its rows back: counted once");
        assert!(usage.in_flight().is_empty(), "nothing landed, nothing to read back");

        let taken = usage.take();
        assert_eq!(seen(&reads), (500, 500), "taken, not landed: still counted");
        usage.restore(taken);
        assert_eq!(seen(&reads), (500, 500), "put back: counted once");

        assert_eq!(cannot_read.flush_once().await, Ok(2), "a route row and a key row merged");
        assert_eq!(seen(&reads), (500, 500), "landed, but not read back: still in flight");
        assert_eq!(usage.in_flight(), vec!["t".to_string()]);

        spend(&usage, 200);
        assert_eq!(reads.flush_once().await, Ok(2));
        assert!(usage.in_flight().is_empty(), "read back after the flush, so released");
        assert_eq!(usage.unflushed_key_and_tenant("t", "k"), (0, 0));
        assert_eq!(seen(&reads), (700, 700), "counted once, from the cached totals");
    }
}
