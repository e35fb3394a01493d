//! shield-proxy: the data plane. An OpenAI-compatible proxy that authenticates tenants by API
//! key, resolves the route named by `model`, and calls the route's targets with failover.
//!
//! Layers, outermost first: the server ([`server`]: its own HTTP/1.1 connections on worker
//! threads) →
//! arrival and routing ([`routes`]: `X-Request-Id` on every answer, the request's trail, the
//! endpoint) → the endpoints ([`chat::chat_completions`], [`models::list`], health). No Redis or Postgres call on the
//! request path once a key and a tenant are cached ([`cache`]); background tasks keep the
//! caches fresh ([`sync`]). Never logs a key, a credential or a prompt.

// Issue 27: no byte-offset slicing of strings and no indexing that can panic on the request
// path (a slice inside a multi-byte character once crashed a guardrail). Each exception is an
// `#[allow]` with its reason.
#![cfg_attr(not(test), deny(clippy::string_slice, clippy::indexing_slicing))]

pub mod auth;
pub mod body;
pub mod cache;
pub mod calendar;
pub mod chat;
pub mod client_wire;
pub mod config;
pub mod context;
pub mod default_path;
pub mod dispatch;
pub mod egress;
pub mod error;
pub mod flush;
pub mod guard;
pub mod health;
pub mod http1;
pub mod json;
pub mod limits;
pub mod messages;
pub mod metrics;
pub mod models;
pub mod native;
pub mod observe;
pub mod pipeline;
pub mod provider;
mod relay;
pub mod responses;
pub mod resume;
pub mod routes;
pub mod server;
pub mod sync;
pub mod tenant;
pub mod usage;
pub mod x_shield;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use config::ProxyConfig;

use crate::cache::Caches;
use crate::tenant::TenantConfig;

/// The maps the request path looks names up in (keys, tenants, health, usage rows, spend):
/// foldhash, seeded per process, instead of SipHash, which showed in the profile (issue 19).
/// Their keys are names an admin set and SHA-256 digests, not collisions a caller can choose.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub struct ProxyState {
    pub config: ProxyConfig,
    pub caches: Arc<Caches>,
    pub health: Arc<health::Health>,
    pub metrics: Arc<metrics::Metrics>,
    pub usage: Arc<usage::UsageBuffer>,
    /// Rate-limit buckets, filled by the leaser ([`limits::lease`]).
    pub limiter: Arc<limits::Limiter>,
    /// A subkey of the vault's keyring that seals reasoning handed to Responses callers.
    pub reasoning_keyring: Arc<shield_core::vault::Keyring>,
    /// Stored Responses-API responses (issue 29).
    pub responses: Arc<responses::store::ResponseStore>,
    /// Per tenant, the input guardrails' findings on texts judged before (issue 33).
    pub verdicts: Arc<shield_core::verdicts::Verdicts>,
    /// Unix second of the last "taking the default path because the config is unavailable"
    /// log line (seed §7: logged once per minute).
    default_path_logged: AtomicU64,
}

impl ProxyState {
    pub fn new(
        config: ProxyConfig,
        redis: shield_store::Pool,
        events: tokio::sync::mpsc::Sender<health::TargetDown>,
    ) -> ProxyState {
        let responses = Arc::new(responses::store::ResponseStore::new(redis.clone(), config.redis_keys.clone()));
        let caches =
            Arc::new(Caches::new(redis, config.redis_keys.clone(), config.keyring.clone(), config.cache_every));
        let metrics = Arc::new(metrics::Metrics::new(config.metrics_tenant_labels));
        let limiter = Arc::new(limits::Limiter::new(config.redis_keys.clone()));
        ProxyState {
            limiter,
            responses,
            reasoning_keyring: Arc::new(config.keyring.derive("shield-reasoning")),
            config,
            caches,
            health: Arc::new(health::Health::new(events)),
            metrics,
            usage: Arc::default(),
            verdicts: Arc::default(),
            default_path_logged: AtomicU64::new(0),
        }
    }

    /// The tenant's configuration, or `None` for the default path: no snapshot published, or
    /// none cached while Redis is unreachable (logged once per minute).
    pub async fn tenant_config(&self, tenant: &str) -> Option<Arc<TenantConfig>> {
        match self.caches.tenant(tenant).await {
            Ok(config) => config,
            Err(err) => {
                let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
                let last = self.default_path_logged.load(Ordering::Relaxed);
                if now >= last + 60
                    && self
                        .default_path_logged
                        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    tracing::warn!(tenant, error = %err, "routing configuration unavailable; calls take the default path");
                }
                None
            }
        }
    }
}

/// `redis://user:pass@host:port/db` → `host:port` (a cluster: `cluster host:port,...`), for
/// log lines.
pub fn redacted(url: &str) -> String {
    shield_store::redacted(url)
}

/// The Redis pool for `REDIS_URL`: one server, or a cluster (`redis+cluster://h:p,h:p`).
pub fn redis_pool(url: &str) -> Result<shield_store::Pool, String> {
    shield_store::Pool::open(url, 32)
}

/// Runs the proxy until the process is stopped. Starts whether or not Redis is up.
pub async fn serve(config: ProxyConfig) -> std::io::Result<()> {
    let redis = redis_pool(&config.redis_url).map_err(std::io::Error::other)?;
    let (events, pending_events) = tokio::sync::mpsc::channel(1024);
    let state = Arc::new(ProxyState::new(config.clone(), redis.clone(), events));
    sync::spawn(
        state.caches.clone(),
        state.health.clone(),
        redis.clone(),
        config.redis_url.clone(),
        config.cache_every,
    );
    limits::lease::spawn(
        state.limiter.clone(),
        limits::lease::RedisLeases::new(redis.clone(), config.redis_keys.clone()),
        flush::process_id(),
    );
    let flusher = flush::Flusher {
        health: state.health.clone(),
        usage: state.usage.clone(),
        caches: state.caches.clone(),
        metrics: state.metrics.clone(),
        redis,
        keys: config.redis_keys.clone(),
    };
    flusher.clone().spawn(config.flush_every, pending_events);
    let settings = server::listen::Settings {
        workers: config.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        backlog: 4096,
        max_connections: config.max_connections,
        // Longer than the callers' own idle expiry (httpx, under the OpenAI and Anthropic
        // Python SDKs, keeps an idle connection 5 s): the client then closes an idle connection
        // first, rather than sending on one the proxy is closing (a reset the caller sees as a
        // failed request). One timer serves both: a client trickling a request head holds
        // its connection at most as long, and `SHIELD_PROXY_MAX_CONNECTIONS` bounds how many.
        idle: Duration::from_secs(75),
    };
    let listeners = server::listen::bind(&config.addr, settings.backlog)?;
    tracing::info!(addr = %config.addr, routing = config.routing_enabled, "proxy listening");
    let make = move || {
        let app = std::rc::Rc::new(routes::App { state: state.clone(), egress: Arc::new(egress::Egress::default()) });
        move |req, peer| {
            let app = app.clone();
            async move { app.handle(req, peer).await }
        }
    };
    server::listen::serve(listeners, settings, make, server::listen::stop_signal(), server::listen::second_signal())
        .await?;
    // Graceful stop (SIGTERM, ctrl-c): what is still buffered goes to Redis, so a clean
    // restart loses no usage.
    match flusher.flush_once().await {
        Ok(rows) => tracing::info!(rows, "usage flushed at shutdown"),
        Err(err) => tracing::error!(error = %err, "usage could not be flushed at shutdown"),
    }
    Ok(())
}
