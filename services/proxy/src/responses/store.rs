//! Stored responses (issue 29): a response sent with `store: true` is kept in the data plane's
//! Redis for the tenant's retention — its response object and the whole input it answered
//! (the history a `previous_response_id` continues), and each item by id (what an
//! `item_reference` names) — under the tenant's hash tag, so every proxy of the fleet reads
//! it and one tenant's ids never resolve for another. Redis expires them; nothing else keeps
//! them.

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use shield_core::keys::RedisKeys;

/// What is kept of one response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Kept {
    /// The response object as it was answered (without Shield's `x_shield` record).
    pub response: Value,
    /// Every input item it answered, oldest first: the continued history, then the request's
    /// own input, with item references resolved.
    pub input: Vec<Value>,
}

impl Kept {
    /// The conversation a later turn continues: the input, then the output.
    pub fn history(self) -> Vec<Value> {
        let mut items = self.input;
        if let Some(Value::Array(output)) = self.response.get("output") {
            items.extend(output.iter().cloned());
        }
        items
    }
}

/// The store could not be reached or answered nonsense; the message names no key or prompt.
#[derive(Debug)]
pub struct StoreDown(pub String);

pub struct ResponseStore {
    redis: shield_store::Pool,
    keys: RedisKeys,
}

impl ResponseStore {
    pub fn new(redis: shield_store::Pool, keys: RedisKeys) -> ResponseStore {
        ResponseStore { redis, keys }
    }

    /// Keeps `kept` under its response id for `retention_s` seconds, and each of its items
    /// that has an id. One pipeline; every key is in the tenant's slot.
    pub async fn keep(&self, tenant: &str, id: &str, kept: &Kept, retention_s: u32) -> Result<(), StoreDown> {
        let ttl = u64::from(retention_s);
        let text = serde_json::to_string(kept).map_err(|e| StoreDown(e.to_string()))?;
        let mut pipe = redis::pipe();
        pipe.set_ex(self.keys.response(tenant, id), text, ttl).ignore();
        let output = kept.response.get("output").and_then(Value::as_array).into_iter().flatten();
        for item in kept.input.iter().chain(output) {
            if let Some(item_id) = item.get("id").and_then(Value::as_str).filter(|i| !i.is_empty()) {
                pipe.set_ex(self.keys.response_item(tenant, item_id), item.to_string(), ttl).ignore();
            }
        }
        let mut conn = self.redis.get().await.map_err(|e| StoreDown(e.to_string()))?;
        pipe.query_async::<()>(&mut conn).await.map_err(|e| StoreDown(e.to_string()))
    }

    /// The tenant's stored response `id`, if it is still kept.
    pub async fn load(&self, tenant: &str, id: &str) -> Result<Option<Kept>, StoreDown> {
        let mut conn = self.redis.get().await.map_err(|e| StoreDown(e.to_string()))?;
        let text: Option<String> =
            conn.get(self.keys.response(tenant, id)).await.map_err(|e| StoreDown(e.to_string()))?;
        text.map(|t| serde_json::from_str(&t).map_err(|_| StoreDown(format!("stored response {id} is unreadable"))))
            .transpose()
    }

    /// The tenant's stored items by id, in order (`None` for one not kept).
    pub async fn items(&self, tenant: &str, ids: &[String]) -> Result<Vec<Option<Value>>, StoreDown> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = ids.iter().map(|id| self.keys.response_item(tenant, id)).collect();
        let mut conn = self.redis.get().await.map_err(|e| StoreDown(e.to_string()))?;
        // One GET per key in a pipeline rather than MGET: a cluster refuses MGET of keys whose
        // hash tags it has not checked, and these share the tenant's slot anyway.
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.get(key);
        }
        let texts: Vec<Option<String>> = pipe.query_async(&mut conn).await.map_err(|e| StoreDown(e.to_string()))?;
        Ok(texts.into_iter().map(|t| t.and_then(|t| serde_json::from_str(&t).ok())).collect())
    }

    /// Deletes the tenant's stored response `id` and its output items; whether it was kept.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<bool, StoreDown> {
        let Some(kept) = self.load(tenant, id).await? else { return Ok(false) };
        let mut keys = vec![self.keys.response(tenant, id)];
        let output = kept.response.get("output").and_then(Value::as_array).into_iter().flatten();
        keys.extend(
            output.filter_map(|i| i.get("id").and_then(Value::as_str)).map(|i| self.keys.response_item(tenant, i)),
        );
        let mut conn = self.redis.get().await.map_err(|e| StoreDown(e.to_string()))?;
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.del(key).ignore();
        }
        pipe.query_async::<()>(&mut conn).await.map_err(|e| StoreDown(e.to_string()))?;
        Ok(true)
    }
}
