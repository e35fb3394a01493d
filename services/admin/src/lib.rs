//! shield-admin: the control plane. Tenants, targets, routes, secrets, keys and guardrail
//! policies live in Postgres (the truth) and are published to Redis for the data plane.
//!
//! Request path: decode the admin JWT ([`auth::Principal`]) → check the scope → resolve the
//! tenant from the token (never from input) → validate with shield-core → one transaction
//! (version bump, write, audit row) → publish the snapshot (never failing the write).

pub mod api;
pub mod auth;
pub mod config;
pub mod deliver;
pub mod error;
pub mod metrics;
pub mod openapi;
pub mod portal;
pub mod provision;
pub mod publish;
pub mod random;
pub mod rate_limit;
pub mod repo;
pub mod write;

use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpServer, web};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

pub use config::AdminConfig;

/// The migrations under `migrations/`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

pub struct AdminState {
    pub db: PgPool,
    pub publisher: Arc<publish::Publisher>,
    pub tokens: auth::Tokens,
    pub keyring: shield_core::vault::Keyring,
    pub login_limiter: rate_limit::LoginLimiter,
    pub login_token_ttl: Duration,
    /// For reads of what the data plane writes (health; usage and spend later).
    pub redis: shield_store::Pool,
    pub redis_keys: shield_core::keys::RedisKeys,
    pub metrics: metrics::AdminMetrics,
}

impl AdminState {
    pub fn new(db: PgPool, redis: shield_store::Pool, config: &AdminConfig) -> Result<AdminState, String> {
        Ok(AdminState {
            publisher: Arc::new(publish::Publisher::new(db.clone(), redis.clone(), config.redis_keys.clone())),
            redis,
            redis_keys: config.redis_keys.clone(),
            metrics: metrics::AdminMetrics::default(),
            db,
            tokens: auth::Tokens::new(&config.jwt_secret)?,
            keyring: config.keyring.clone(),
            login_limiter: rate_limit::LoginLimiter::default(),
            login_token_ttl: config.login_token_ttl,
        })
    }
}

/// A Postgres pool that fails fast when the database is away, so the API answers 503 promptly.
pub async fn connect_db(url: &str) -> sqlx::Result<PgPool> {
    PgPoolOptions::new().max_connections(10).acquire_timeout(Duration::from_secs(3)).connect(url).await
}

/// A Redis pool (one server, or a cluster: `redis+cluster://h:p,h:p`) that never blocks a
/// request for long; connections are made lazily, so the admin starts while Redis is down.
pub fn redis_pool(url: &str) -> Result<shield_store::Pool, String> {
    shield_store::Pool::open(url, 16)
}

/// Runs the admin service until the process is stopped.
pub async fn serve(config: AdminConfig, db: PgPool) -> std::io::Result<()> {
    let redis = redis_pool(&config.redis_url).map_err(std::io::Error::other)?;
    let state = web::Data::new(AdminState::new(db, redis, &config).map_err(std::io::Error::other)?);
    state.publisher.clone().spawn(config.republish_every);
    Arc::new(deliver::Deliverer::new(
        state.db.clone(),
        state.redis.clone(),
        config.redis_keys.clone(),
        config.keyring.clone(),
    ))
    .spawn();
    tracing::info!(addr = %config.addr, "admin listening");
    HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .wrap(actix_web::middleware::from_fn(metrics::track))
            // Outermost: the SERVER span covers the whole request (issue 31).
            .wrap(actix_web::middleware::from_fn(shield_telemetry::server::traced))
            .configure(portal::configure)
            .configure(api::configure)
    })
    .bind(&config.addr)?
    .run()
    .await
}
