//! Background work that keeps the caches fresh: a refresher every `SHIELD_LLM_ROUTING_CACHE_S`
//! and a `gw_config` subscriber for immediate invalidation. Both survive Redis outages: they
//! log once when Redis goes away, retry, and log once when it is back. In a Redis Cluster the
//! subscriber listens on one node (classic PUBLISH reaches every node) and moves to another
//! when that node goes away; what it missed meanwhile is re-read when it subscribes again.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use shield_core::snapshot::ConfigMessage;

use crate::cache::Caches;
use crate::health::Health;

pub fn spawn(caches: Arc<Caches>, health: Arc<Health>, redis: shield_store::Pool, redis_url: String, every: Duration) {
    tokio::spawn(refresher(caches.clone(), redis_url, every));
    tokio::spawn(subscriber(caches, health, redis));
}

async fn refresher(caches: Arc<Caches>, redis_url: String, every: Duration) {
    let mut was_up = true;
    loop {
        let up = caches.ping().await;
        if up {
            if !was_up {
                tracing::info!("Redis is reachable again at {}", crate::redacted(&redis_url));
            }
            caches.refresh_all().await;
        } else if was_up {
            tracing::warn!(
                "Redis is not reachable at {}; serving cached configuration and retrying",
                crate::redacted(&redis_url)
            );
        }
        was_up = up;
        // While Redis is down, retry sooner than the refresh interval.
        tokio::time::sleep(if up { every } else { every.min(Duration::from_secs(1)) }).await;
    }
}

async fn subscriber(caches: Arc<Caches>, health: Arc<Health>, redis: shield_store::Pool) {
    let channel = caches.redis_keys.config_channel();
    // In a cluster any node hears every PUBLISH; when the one listened to goes away (or never
    // answered), the next attempt takes the next node.
    let mut attempt = 0usize;
    loop {
        let nodes = redis.subscribe_urls().await;
        if let Some(node) = nodes.get(attempt % nodes.len().max(1)) {
            match listen(&caches, &health, node, &channel).await {
                Ok(()) => tracing::info!("gw_config subscription ended; resubscribing"),
                Err(err) => tracing::debug!(error = %err, "gw_config subscription failed; retrying"),
            }
        }
        attempt = attempt.wrapping_add(1);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn listen(caches: &Caches, health: &Health, node: &str, channel: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(node)?;
    let timed_out = || redis::RedisError::from((redis::ErrorKind::Io, "connect timed out"));
    let mut pubsub =
        tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub()).await.map_err(|_| timed_out())??;
    // A node that accepts the connection but never confirms is as good as gone.
    tokio::time::timeout(Duration::from_secs(2), pubsub.subscribe(channel)).await.map_err(|_| timed_out())??;
    // Messages may have been missed while unsubscribed.
    caches.refresh_all().await;
    let mut messages = pubsub.on_message();
    while let Some(message) = messages.next().await {
        let Ok(payload) = message.get_payload::<String>() else {
            continue;
        };
        match serde_json::from_str::<ConfigMessage>(&payload) {
            Ok(ConfigMessage::Reset { tenant, reset }) => health.reset(&tenant, &reset),
            Ok(message) => caches.on_message(message).await,
            Err(err) => tracing::warn!(error = %err, "ignoring an unreadable gw_config message"),
        }
    }
    Ok(())
}
