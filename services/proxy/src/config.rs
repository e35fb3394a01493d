//! Proxy settings, read once at start. Holds the vault keyring: never printed.

use std::time::Duration;

use shield_core::keys::RedisKeys;
use shield_core::vault::Keyring;

#[derive(Clone)]
pub struct ProxyConfig {
    pub addr: String,
    pub redis_url: String,
    pub redis_keys: RedisKeys,
    /// `SHIELD_LLM_ROUTING_CACHE_S`: how often cached keys and snapshots are refreshed.
    pub cache_every: Duration,
    /// `SHIELD_LLM_ROUTING_FLUSH_S`: how often health (and, later, usage) goes to Redis.
    pub flush_every: Duration,
    /// `SHIELD_LLM_ROUTING=0` sends every call down the default path.
    pub routing_enabled: bool,
    /// `SHIELD_DEFAULT_UPSTREAM_URL`, a base such as `https://api.openai.com/v1`.
    pub default_upstream: Option<url::Url>,
    /// `SHIELD_METRICS_TENANT_LABELS=0` drops tenant, route and target labels.
    pub metrics_tenant_labels: bool,
    /// `SHIELD_MAX_HOPS`.
    pub max_hops: u32,
    /// `SHIELD_PROXY_WORKERS`: HTTP worker threads (each its own event loop and upstream
    /// pool); `None` is one per core.
    pub workers: Option<usize>,
    /// `SHIELD_PROXY_MAX_CONNECTIONS`: client connections open at once; past it the proxy stops
    /// accepting (the kernel queues new ones) until one closes.
    pub max_connections: usize,
    pub keyring: Keyring,
}

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("addr", &self.addr)
            .field("routing_enabled", &self.routing_enabled)
            .finish_non_exhaustive()
    }
}
