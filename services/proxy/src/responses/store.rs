//! Stored responses (issue 29): a response sent with `store: true` is kept in the data plane's
//! Redis for the tenant's retention — its response object, the input it was sent with (item
//! references resolved) and the response it continued — and each output item by id (what an
//! `item_reference` names), under the tenant's hash tag, so every proxy of the fleet reads it
//! and one tenant's ids never resolve for another. A conversation is a chain of responses,
//! each holding only its own turn, so what is kept grows with the conversation rather than
//! with its square; following the chain refreshes its links' expiry, so a conversation still
//! in use never loses its beginning. Redis expires them; nothing else keeps them. Every call
//! is bounded: a store that hangs delays an answer by at most [`STORE_TIMEOUT`].

use std::time::Duration;

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use shield_core::keys::RedisKeys;

/// How long one store call may take before the store counts as down.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest chain of stored responses a `previous_response_id` follows.
pub const MAX_CHAIN: usize = 1000;
/// A response whose stored form is larger than this is not kept (logged): the store also
/// holds the fleet's rate-limit windows.
pub const MAX_KEPT_BYTES: usize = 8 << 20;

/// What is kept of one response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Kept {
    /// The response object as it was answered (without Shield's `x_shield` record).
    pub response: Value,
    /// The input items this request sent (item references resolved), oldest first.
    pub input: Vec<Value>,
    /// The response this one continued (`previous_response_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
}

impl Kept {
    fn output(&self) -> impl Iterator<Item = &Value> {
        self.response.get("output").and_then(Value::as_array).into_iter().flatten()
    }
}

/// The store could not be reached, timed out, or refused; the message names no key or prompt.
#[derive(Debug)]
pub struct StoreDown(pub String);

/// Why a conversation could not be read back.
#[derive(Debug, PartialEq, Eq)]
pub enum Gap {
    /// The named response is not kept (never stored, expired, deleted, another tenant's).
    Missing,
    /// An earlier response of its chain is no longer kept.
    Broken(String),
    /// The chain is longer than [`MAX_CHAIN`].
    TooLong,
}

pub struct ResponseStore {
    redis: shield_store::Pool,
    keys: RedisKeys,
}

async fn bounded<T>(what: &str, call: impl Future<Output = redis::RedisResult<T>>) -> Result<T, StoreDown> {
    match tokio::time::timeout(STORE_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(StoreDown(format!("{what}: {err}"))),
        Err(_) => Err(StoreDown(format!("{what}: no answer within {} ms", STORE_TIMEOUT.as_millis()))),
    }
}

impl ResponseStore {
    pub fn new(redis: shield_store::Pool, keys: RedisKeys) -> ResponseStore {
        ResponseStore { redis, keys }
    }

    async fn connection(&self) -> Result<shield_store::Connection, StoreDown> {
        match tokio::time::timeout(STORE_TIMEOUT, self.redis.get()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(err)) => Err(StoreDown(err.to_string())),
            Err(_) => Err(StoreDown("no connection within the store timeout".into())),
        }
    }

    /// Keeps `kept` under its response id for `retention_s` seconds, and each of its output
    /// items by id (ids Shield made, unique to the response). One pipeline in the tenant's
    /// slot.
    pub async fn keep(&self, tenant: &str, id: &str, kept: &Kept, retention_s: u32) -> Result<(), StoreDown> {
        let ttl = u64::from(retention_s);
        let text = serde_json::to_string(kept).map_err(|e| StoreDown(e.to_string()))?;
        if text.len() > MAX_KEPT_BYTES {
            return Err(StoreDown(format!(
                "the response is {} bytes, more than the {MAX_KEPT_BYTES} kept",
                text.len()
            )));
        }
        let mut pipe = redis::pipe();
        pipe.set_ex(self.keys.response(tenant, id), text, ttl).ignore();
        for item in kept.output() {
            if let Some(item_id) = item.get("id").and_then(Value::as_str).filter(|i| !i.is_empty()) {
                pipe.set_ex(self.keys.response_item(tenant, item_id), item.to_string(), ttl).ignore();
            }
        }
        let mut conn = self.connection().await?;
        bounded("keep", pipe.query_async::<()>(&mut conn)).await
    }

    /// The tenant's stored response `id`, if it is still kept.
    pub async fn load(&self, tenant: &str, id: &str) -> Result<Option<Kept>, StoreDown> {
        let mut conn = self.connection().await?;
        let text: Option<String> = bounded("load", conn.get(self.keys.response(tenant, id))).await?;
        text.map(|t| serde_json::from_str(&t).map_err(|_| StoreDown(format!("stored response {id} is unreadable"))))
            .transpose()
    }

    /// The conversation up to and including response `id`, oldest first: each response's
    /// input, then its output. Following the chain renews each link's expiry.
    pub async fn history(
        &self,
        tenant: &str,
        id: &str,
        retention_s: u32,
    ) -> Result<Result<Vec<Value>, Gap>, StoreDown> {
        let mut chain: Vec<(String, Kept)> = Vec::new();
        let mut next = Some(id.to_string());
        while let Some(at) = next.take() {
            if chain.len() == MAX_CHAIN {
                return Ok(Err(Gap::TooLong));
            }
            let Some(kept) = self.load(tenant, &at).await? else {
                return Ok(Err(if chain.is_empty() { Gap::Missing } else { Gap::Broken(at) }));
            };
            next = kept.previous.clone();
            chain.push((at, kept));
        }
        let mut pipe = redis::pipe();
        for (at, kept) in &chain {
            pipe.expire(self.keys.response(tenant, at), i64::from(retention_s)).ignore();
            for item_id in kept.output().filter_map(|i| i.get("id").and_then(Value::as_str)) {
                pipe.expire(self.keys.response_item(tenant, item_id), i64::from(retention_s)).ignore();
            }
        }
        let mut conn = self.connection().await?;
        bounded("renew", pipe.query_async::<()>(&mut conn)).await?;
        let mut items = Vec::new();
        for (_, kept) in chain.into_iter().rev() {
            let output: Vec<Value> = kept.output().cloned().collect();
            items.extend(kept.input);
            items.extend(output);
        }
        Ok(Ok(items))
    }

    /// The tenant's stored items by id, in order (`None` for one not kept).
    pub async fn items(&self, tenant: &str, ids: &[String]) -> Result<Vec<Option<Value>>, StoreDown> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.connection().await?;
        // One GET per key in a pipeline rather than MGET: a cluster refuses MGET of keys whose
        // hash tags it has not checked, and these share the tenant's slot anyway.
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.get(self.keys.response_item(tenant, id));
        }
        let texts: Vec<Option<String>> = bounded("items", pipe.query_async(&mut conn)).await?;
        Ok(texts.into_iter().map(|t| t.and_then(|t| serde_json::from_str(&t).ok())).collect())
    }

    /// Deletes the tenant's stored response `id` and its output items; whether it was kept.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<bool, StoreDown> {
        let Some(kept) = self.load(tenant, id).await? else { return Ok(false) };
        let mut pipe = redis::pipe();
        pipe.del(self.keys.response(tenant, id)).ignore();
        for item_id in kept.output().filter_map(|i| i.get("id").and_then(Value::as_str)) {
            pipe.del(self.keys.response_item(tenant, item_id)).ignore();
        }
        let mut conn = self.connection().await?;
        bounded("delete", pipe.query_async::<()>(&mut conn)).await?;
        Ok(true)
    }
}
