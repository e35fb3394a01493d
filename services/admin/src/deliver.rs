//! The webhook deliverer: reads `gw_events` with a consumer group and delivers each event to
//! the tenant's webhooks subscribed to its type — JSON `{id, type, tenant, created_at, data}`,
//! `X-Shield-Event`, `X-Shield-Delivery` (the same on every attempt: an idempotency id), and
//! `X-Shield-Signature: sha256=<hex HMAC of the body with the webhook's secret>`. A non-2xx
//! answer or a timeout is retried after 1 s, 5 s, 30 s, 2 min and 10 min, then marked failed;
//! every attempt is recorded. Each event is handled in its own task, so a stuck endpoint never
//! holds up another tenant; an event is acknowledged only once every delivery of it has ended
//! (delivered or finally failed), and unacknowledged events are taken up again at start.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use redis::streams::{StreamReadOptions, StreamReadReply};
use serde_json::json;
use sha2::Sha256;
use shield_core::keys::RedisKeys;
use shield_core::records::events::GatewayEvent;
use shield_core::url_safety;
use shield_core::vault::{Keyring, secret_aad};
use sqlx::PgPool;

use crate::repo::webhooks::{self, WebhookTarget};

const GROUP: &str = "shield-webhooks";
const RETRY_AFTER: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(120),
    Duration::from_secs(600),
];
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
const CONCURRENT_EVENTS: usize = 64;

pub struct Deliverer {
    pub db: PgPool,
    pub redis: shield_store::Pool,
    pub keys: RedisKeys,
    pub keyring: Keyring,
    client: reqwest::Client,
    consumer: String,
    /// Stream ids being delivered now: a re-read of pending entries must not start them again.
    in_flight: parking_lot::Mutex<std::collections::HashSet<String>>,
}

/// One `gw_events` entry: its stream id and the event (shield-core's decoding).
#[derive(Debug, Clone)]
struct Event {
    stream_id: String,
    event: GatewayEvent,
}

impl Deliverer {
    #[allow(clippy::expect_used, reason = "startup: a client with these static settings always builds")]
    pub fn new(db: PgPool, redis: shield_store::Pool, keys: RedisKeys, keyring: Keyring) -> Deliverer {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(ATTEMPT_TIMEOUT)
            .build()
            .expect("static HTTP client configuration");
        let host =
            std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "admin".into());
        Deliverer { db, redis, keys, keyring, client, consumer: host, in_flight: Default::default() }
    }

    pub fn spawn(self: Arc<Self>) {
        tokio::spawn(async move {
            let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_EVENTS));
            // Events read before a restart but not acknowledged come first ("0"), then new ones.
            let mut from = "0";
            loop {
                match self.read(from).await {
                    Ok(events) => {
                        if from == "0" && events.is_empty() {
                            from = ">";
                        }
                        for event in events {
                            if !self.in_flight.lock().insert(event.stream_id.clone()) {
                                continue;
                            }
                            let Ok(slot) = slots.clone().acquire_owned().await else { return };
                            let deliverer = self.clone();
                            tokio::spawn(async move {
                                deliverer.handle(&event).await;
                                deliverer.in_flight.lock().remove(&event.stream_id);
                                drop(slot);
                            });
                        }
                        if from == "0" {
                            from = ">";
                        }
                    }
                    Err(err) => {
                        tracing::debug!(error = %err, "gw_events not readable; retrying");
                        // A read may have failed after Redis handed entries to this consumer:
                        // they are pending, and the next read takes them up ("0").
                        from = "0";
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
    }

    async fn read(&self, from: &str) -> Result<Vec<Event>, String> {
        let mut conn = self.redis.get().await.map_err(|e| e.to_string())?;
        let stream = self.keys.events();
        let created: Result<(), redis::RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&stream)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        if let Err(err) = created
            && err.code() != Some("BUSYGROUP")
        {
            return Err(err.to_string());
        }
        let mut options = StreamReadOptions::default().group(GROUP, &self.consumer).count(100);
        if from == ">" {
            // Short enough to stay under the connection's response timeout.
            options = options.block(250);
        }
        let reply: StreamReadReply = redis::AsyncCommands::xread_options(&mut conn, &[&stream], &[from], &options)
            .await
            .map_err(|e| e.to_string())?;
        let mut events = Vec::new();
        let mut undecodable = Vec::new();
        for key in reply.keys {
            for entry in key.ids {
                // Stream values are bulk strings; anything else reads as a missing field.
                let fields = entry.map.iter().filter_map(|(name, value)| match value {
                    redis::Value::BulkString(bytes) => Some((name.as_str(), bytes.as_slice())),
                    _ => None,
                });
                match GatewayEvent::decode(fields) {
                    Ok(event) => events.push(Event { stream_id: entry.id, event }),
                    Err(err) => {
                        tracing::warn!(stream_id = %entry.id, error = %err, "gw_events entry not delivered");
                        undecodable.push(entry.id);
                    }
                }
            }
        }
        // An entry that does not decode never will: acknowledged, it is not read again at
        // every start.
        if !undecodable.is_empty() {
            redis::cmd("XACK")
                .arg(&stream)
                .arg(GROUP)
                .arg(&undecodable)
                .query_async::<i64>(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(events)
    }

    async fn handle(&self, Event { stream_id, event }: &Event) {
        tracing::debug!(tenant = %event.tenant, kind = %event.kind, "delivering event");
        match webhooks::subscribed(&self.db, &event.tenant, &event.kind).await {
            Ok(hooks) => {
                let deliveries = hooks.iter().map(|hook| self.deliver(hook, event));
                futures_util::future::join_all(deliveries).await;
            }
            Err(err) => {
                // Postgres away: leave the event unacknowledged; it is taken up again at start.
                tracing::warn!(error = %err, "webhooks not readable; event left pending");
                return;
            }
        }
        if let Ok(mut conn) = self.redis.get().await {
            let _: Result<i64, _> =
                redis::cmd("XACK").arg(self.keys.events()).arg(GROUP).arg(stream_id).query_async(&mut conn).await;
        }
    }

    /// Every attempt of one event to one webhook, until delivered or finally failed.
    async fn deliver(&self, hook: &WebhookTarget, event: &GatewayEvent) {
        let Some(secret) = hook.sealed().and_then(|sealed| {
            let aad = secret_aad(&event.tenant, &crate::api::webhooks::secret_name(hook.id));
            self.keyring.open(&aad, &sealed).ok().and_then(|bytes| String::from_utf8(bytes).ok())
        }) else {
            tracing::error!(webhook = %hook.id, "webhook secret does not decrypt; not delivering");
            return;
        };
        let created_at = chrono::DateTime::from_timestamp(event.at, 0).unwrap_or_default().to_rfc3339();
        let body = json!({"id": event.id, "type": event.kind, "tenant": event.tenant, "created_at": created_at, "data": event.data}).to_string();
        let signature = sign(&secret, body.as_bytes());
        let delivery_id = format!("{}:{}", event.id, hook.id);
        for attempt in 1..=(RETRY_AFTER.len() + 1) as i32 {
            let (status, error) = self.attempt(hook, &event.kind, &delivery_id, &signature, &body).await;
            let delivered = status.is_some_and(|s| (200..300).contains(&s));
            let last = attempt as usize > RETRY_AFTER.len();
            let outcome = if delivered {
                "delivered"
            } else if last {
                "failed"
            } else {
                "retrying"
            };
            let record = webhooks::AttemptRecord {
                delivery_id: &delivery_id,
                event_type: &event.kind,
                attempt,
                status,
                error: error.as_deref(),
                outcome,
            };
            let recorded = webhooks::record(&self.db, hook.id, record).await;
            if let Err(err) = recorded {
                tracing::warn!(error = %err, "delivery attempt not recorded");
            }
            if delivered || last {
                return;
            }
            tokio::time::sleep(RETRY_AFTER[attempt as usize - 1]).await;
        }
    }

    async fn attempt(
        &self,
        hook: &WebhookTarget,
        kind: &str,
        delivery_id: &str,
        signature: &str,
        body: &str,
    ) -> (Option<i32>, Option<String>) {
        let Ok(url) = url_safety::parse_outbound_url(&hook.url) else { return (None, Some("invalid url".into())) };
        if !hook.allow_private && url_safety::url_private_reason(&url).is_some() {
            return (None, Some("private address refused".into()));
        }
        let request = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header("x-shield-event", kind)
            .header("x-shield-delivery", delivery_id)
            .header("x-shield-signature", format!("sha256={signature}"))
            .body(body.to_string());
        match request.send().await {
            Ok(response) => (Some(i32::from(response.status().as_u16())), None),
            Err(err) if err.is_timeout() => (None, Some("timed out".into())),
            Err(_) => (None, Some("connection failed".into())),
        }
    }
}

/// Hex HMAC-SHA256 of `body` keyed with the secret's UTF-8 bytes (API.md).
#[allow(clippy::expect_used, reason = "HMAC accepts keys of any length")]
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    #[test]
    fn signatures_are_hex_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            super::sign("Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
