//! Writing this process's view to Redis, off the request path: the health flush every
//! `SHIELD_LLM_ROUTING_FLUSH_S` (`gw_health:{tenant}`, field `"{target}|{process}"`, TTL 1 h)
//! and `gateway_target_down` events to the `gw_events` stream as they come. Redis being away
//! only delays these writes; nothing on the request path waits for them.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use shield_core::keys::RedisKeys;

use crate::health::{Health, TargetDown};

const HEALTH_TTL_S: i64 = 3600;
/// `gw_events` is capped (approximately) at this many entries.
const EVENTS_MAX_LEN: usize = 100_000;

/// This process's name in `gw_health` and events: host, pid and a random suffix.
pub fn process_id() -> String {
    static ID: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let host =
            std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "host".into());
        format!("{host}-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..6])
    });
    ID.clone()
}

pub fn spawn(
    health: Arc<Health>,
    redis: deadpool_redis::Pool,
    keys: RedisKeys,
    every: Duration,
    mut events: tokio::sync::mpsc::Receiver<TargetDown>,
) {
    let (pool, k) = (redis.clone(), keys.clone());
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if let Err(err) = flush_health(&health, &pool, &k).await {
                tracing::debug!(error = %err, "health flush failed; will retry");
            }
        }
    });
    tokio::spawn(async move {
        while let Some(down) = events.recv().await {
            // Retry until Redis takes it: an event must not be lost to a short outage.
            while let Err(err) = write_event(&down, &redis, &keys).await {
                tracing::debug!(error = %err, "gw_events write failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });
}

pub async fn flush_health(health: &Health, redis: &deadpool_redis::Pool, keys: &RedisKeys) -> Result<(), String> {
    let process = process_id();
    let rows = health.rows(&process);
    if rows.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for (tenant, targets) in rows {
        let key = keys.health(&tenant);
        for (target, row) in targets {
            pipe.hset(&key, format!("{target}|{process}"), serde_json::to_string(&row).unwrap_or_default()).ignore();
        }
        pipe.expire(&key, HEALTH_TTL_S).ignore();
    }
    let mut conn = redis.get().await.map_err(|e| e.to_string())?;
    pipe.query_async::<()>(&mut *conn).await.map_err(|e| e.to_string())
}

async fn write_event(down: &TargetDown, redis: &deadpool_redis::Pool, keys: &RedisKeys) -> Result<(), String> {
    let id = uuid::Uuid::new_v4().to_string();
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let data = json!({"target": down.target, "process": process_id(), "failures": down.failures, "last_error": down.last_error});
    let mut conn = redis.get().await.map_err(|e| e.to_string())?;
    redis::cmd("XADD")
        .arg(keys.events())
        .arg("MAXLEN")
        .arg("~")
        .arg(EVENTS_MAX_LEN)
        .arg("*")
        .arg("id")
        .arg(&id)
        .arg("tenant")
        .arg(&down.tenant)
        .arg("type")
        .arg("gateway_target_down")
        .arg("at")
        .arg(at)
        .arg("data")
        .arg(data.to_string())
        .query_async::<String>(&mut *conn)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}
