//! shield-proxy: the data plane. An OpenAI-compatible proxy that authenticates tenants by API
//! key, resolves the route named by `model`, and calls the route's targets with failover.
//!
//! Layers, outermost first: request id (`X-Request-Id` on every answer) → handler
//! ([`chat::chat_completions`], [`models::list`], health). No Redis or Postgres call on the
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
pub mod sync;
pub mod tenant;
pub mod usage;
pub mod x_shield;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::dev::Service;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{App, HttpResponse, HttpServer, get, web};
use serde_json::json;

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

/// What this service is (the address `shield up` prints); callers use `/v1/...`. `HEAD /`
/// answers too: Claude Code probes it before its first request.
#[actix_web::route("/", method = "GET", method = "HEAD")]
async fn index() -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "service": "shield-proxy",
        "endpoints": ["/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/shield/chat/completions", "/v1/models", "/v1/models/{id}"],
        "health": ["/healthz", "/readyz"],
        "metrics": "/metrics",
    }))
}

/// Claude Code's connectivity probe (`HEAD /api/hello`, sent unless its non-essential traffic
/// is turned off): answered like `HEAD /`, so the client sees a reachable gateway.
#[actix_web::route("/api/hello", method = "GET", method = "HEAD")]
async fn hello() -> HttpResponse {
    HttpResponse::Ok().finish()
}

#[get("/healthz")]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Ready once Redis has answered at least once (config source reachable or cache warm).
#[get("/readyz")]
async fn readyz(state: web::Data<ProxyState>) -> HttpResponse {
    if state.caches.is_ready() {
        HttpResponse::Ok().json(json!({"status": "ready"}))
    } else {
        HttpResponse::ServiceUnavailable()
            .json(json!({"status": "unavailable", "reason": "Redis has not answered yet"}))
    }
}

/// Prometheus text format. Gauges of state (circuits, snapshot ages) are read at scrape time.
#[get("/metrics")]
async fn metrics_text(state: web::Data<ProxyState>) -> HttpResponse {
    for (tenant, rows) in state.health.rows("") {
        for (target, row) in rows {
            state.metrics.circuit(&tenant, &target, &row.state);
        }
    }
    state.metrics.trace_counts();
    state.metrics.guardrail_counts(&state.verdicts.counts);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    for (tenant, published_at) in state.caches.snapshot_times() {
        state.metrics.snapshot_age(&tenant, now - published_at);
    }
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(state.metrics.render())
}

async fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(error::openai_error(
        "no such endpoint",
        "invalid_request_error",
        "not_found",
        serde_json::Value::Null,
    ))
}

/// A request id: the caller's `X-Request-Id` when it is short and printable, else a fresh one
/// (a per-process random prefix and a counter: unique, and free of syscalls per request).
fn request_id(inbound: Option<&HeaderValue>) -> HeaderValue {
    if let Some(value) = inbound
        .filter(|v| (1..=128).contains(&v.len()) && v.to_str().is_ok_and(|s| s.bytes().all(|b| b.is_ascii_graphic())))
    {
        return value.clone();
    }
    static PREFIX: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| uuid::Uuid::new_v4().as_u64_pair().0);
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // 32 hex digits into a fixed buffer: `format!` with padded hex cost more than the rest of
    // the id's work on every answer (issue 19).
    let mut words = [0u8; 16];
    words[..8].copy_from_slice(&PREFIX.to_be_bytes());
    words[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    let mut id = [0u8; 32];
    let _ = hex::encode_to_slice(words, &mut id);
    HeaderValue::from_bytes(&id).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// The request's id, as the outermost layer chose it (in the request's extensions), as the
/// upstream client's header value (actix and hyper use different `http` versions).
#[derive(Clone)]
struct RequestId(http::HeaderValue);

/// Paths with no access record and no span: probes, scrapes and the service's index, which
/// orchestrators call every few seconds.
fn unobserved(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics" | "/" | "/api/hello")
}

/// The request's trail ([`context::Trail`]), as the outermost layer made it.
pub fn trail_of(req: &actix_web::HttpRequest) -> Option<Arc<context::Trail>> {
    use actix_web::HttpMessage;
    req.extensions().get::<Arc<context::Trail>>().cloned()
}

/// The id of a request (the caller's `X-Request-Id`, or the one Shield made), to send upstream.
pub fn request_id_of(req: &actix_web::HttpRequest) -> Option<http::HeaderValue> {
    use actix_web::HttpMessage;
    req.extensions().get::<RequestId>().map(|id| id.0.clone())
}

/// Anthropic's name for the request id, on answers in its shape (its SDKs read it).
const ANTHROPIC_REQUEST_ID: HeaderName = HeaderName::from_static("request-id");

/// Whether the answer is in Anthropic's shape: `/v1/messages…`, and the model list when the
/// caller sent `anthropic-version`.
fn anthropic_shaped(path: &str, headers: &actix_web::http::header::HeaderMap) -> bool {
    path.starts_with("/v1/messages") || (path.starts_with("/v1/models") && models::wants_anthropic(headers))
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(chat::chat_completions)
        .service(messages::count_tokens)
        .service(messages::messages)
        .service(native::chat)
        .service(responses::responses)
        .service(responses::upgrade)
        .service(responses::input_items)
        .service(responses::retrieve)
        .service(responses::remove)
        .service(models::list)
        .service(models::get)
        .service(index)
        .service(hello)
        .service(healthz)
        .service(readyz)
        .service(metrics_text)
        .default_service(web::to(not_found));
}

/// Sets TCP_NODELAY on every accepted connection.
pub fn no_delay(connection: &dyn std::any::Any, _: &mut actix_web::dev::Extensions) {
    if let Some(tcp) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() {
        let _ = tcp.set_nodelay(true);
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
    let state = web::Data::new(ProxyState::new(config.clone(), redis.clone(), events));
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
    tracing::info!(addr = %config.addr, routing = config.routing_enabled, "proxy listening");
    let request_id_header = HeaderName::from_static("x-request-id");
    HttpServer::new(move || {
        let request_id_header = request_id_header.clone();
        let metrics = state.metrics.clone();
        App::new()
            .app_data(state.clone())
            // One HTTP client per worker thread: its pooled upstream connections live on the
            // worker's own runtime, so an attempt never crosses threads.
            .app_data(web::Data::new(egress::Egress::default()))
            .wrap_fn(move |req, srv| {
                use actix_web::HttpMessage;
                use tracing::Instrument;
                let id = request_id(req.headers().get(&request_id_header));
                if let Ok(upstream) = http::HeaderValue::from_bytes(id.as_bytes()) {
                    req.extensions_mut().insert(RequestId(upstream));
                }
                let anthropic = anthropic_shaped(req.path(), req.headers());
                // The request's context from its arrival (issue 31): probes and scrapes have none.
                let trail = (!unobserved(req.path()))
                    .then(|| Arc::new(context::Trail::arrive(&req, id.clone(), metrics.clone())));
                if let Some(trail) = &trail {
                    req.extensions_mut().insert(trail.clone());
                }
                // Every log line of the request carries its id and trace id (issue 31).
                let trace_id = trail.as_ref().and_then(|t| t.trace_id());
                let span = tracing::info_span!(
                    "request",
                    request_id = id.to_str().unwrap_or_default(),
                    trace_id = trace_id.as_deref()
                );
                let response = span.in_scope(|| srv.call(req)).instrument(span);
                let header = request_id_header.clone();
                async move {
                    let mut response = response.await?;
                    if anthropic {
                        response.headers_mut().insert(ANTHROPIC_REQUEST_ID, id.clone());
                    }
                    response.headers_mut().insert(header, id);
                    if let Some(trail) = trail {
                        let pattern = response.request().match_pattern();
                        trail.responded(response.status().as_u16(), pattern);
                        // A streamed answer holds its own reference until the stream ends.
                        response.request().extensions_mut().remove::<Arc<context::Trail>>();
                    }
                    Ok(response)
                }
            })
            .configure(configure)
    })
    .workers(config.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())))
    .backlog(4096)
    // Longer than the callers' own idle expiry (httpx, under the OpenAI and Anthropic Python
    // SDKs, keeps an idle connection 5 s — actix's default here too): the client then closes
    // an idle connection first, rather than sending on one the proxy is closing (a reset the
    // caller sees as a failed request).
    .keep_alive(Duration::from_secs(75))
    // Small SSE writes go out at once: without this, Nagle holds a chunk until the client ACKs
    // the previous one (tens of milliseconds with delayed ACKs).
    .on_connect(no_delay)
    .bind(&config.addr)?
    .run()
    .await?;
    // Graceful stop (SIGTERM, ctrl-c): what is still buffered goes to Redis, so a clean
    // restart loses no usage.
    match flusher.flush_once().await {
        Ok(rows) => tracing::info!(rows, "usage flushed at shutdown"),
        Err(err) => tracing::error!(error = %err, "usage could not be flushed at shutdown"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn fresh_request_ids_are_32_hex_digits_and_distinct() {
        let (a, b) = (super::request_id(None), super::request_id(None));
        for id in [&a, &b] {
            let text = id.to_str().unwrap();
            assert_eq!(text.len(), 32, "{text}");
            assert!(text.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{text}");
        }
        assert_ne!(a, b);
        assert_eq!(a.as_bytes()[..16], b.as_bytes()[..16], "one process prefix");
        let (na, nb) = (
            u64::from_str_radix(&a.to_str().unwrap()[16..], 16).unwrap(),
            u64::from_str_radix(&b.to_str().unwrap()[16..], 16).unwrap(),
        );
        assert!(nb > na, "a counter");
        let inbound = actix_web::http::header::HeaderValue::from_static("caller-id-1");
        assert_eq!(super::request_id(Some(&inbound)), inbound);
    }
}
