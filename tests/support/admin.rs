//! The admin service in-process, over real HTTP, on its own database and Redis prefix.

use std::time::Duration;

use actix_web::{App, HttpServer, web};
use base64::Engine;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use shield_admin::auth::{Scope, Tokens};
use shield_admin::{AdminConfig, AdminState};
use shield_core::keys::RedisKeys;
use shield_core::vault::Keyring;

use super::evidence::{self, Evidence};
use super::{TestDb, redis_url, unique};

/// The tenant's config version in Postgres.
pub async fn db_version(admin: &Admin, tenant: &str) -> i64 {
    sqlx::query_scalar("SELECT config_version FROM tenants WHERE slug = $1")
        .bind(tenant)
        .fetch_one(&admin.db.pool)
        .await
        .expect("tenant")
}

pub const JWT_SECRET: &str = "test-jwt-secret-with-at-least-32-bytes!";

pub fn vault_key() -> String {
    base64::engine::general_purpose::STANDARD.encode([42u8; 32])
}

pub fn keyring() -> Keyring {
    Keyring::from_base64(&vault_key(), 1).expect("test vault key")
}

pub struct Admin {
    pub url: String,
    pub state: web::Data<AdminState>,
    pub prefix: String,
    pub keys: RedisKeys,
    pub redis: String,
    pub db: TestDb,
    /// Responses, secrets and, at drop, Redis, Postgres and `/metrics`, for the leak scan.
    pub evidence: Evidence,
    handle: actix_web::dev::ServerHandle,
    client: reqwest::Client,
}

/// Answers that show a secret once, by design (a new API key, a webhook's signing secret, a
/// new tenant's password): the value is listed as a secret, the answer is not kept for the scan.
const REVEALS: [(&str, &str); 3] =
    [("/v1/tenant/me/keys", "key"), ("/v1/tenant/me/webhooks", "secret"), ("/v1/tenants", "password")];

impl Admin {
    pub async fn start() -> Admin {
        Admin::start_with_redis(&redis_url()).await
    }

    /// Starts the admin against `redis` without the background republisher (tests drive it).
    pub async fn start_with_redis(redis: &str) -> Admin {
        let db = TestDb::migrated().await;
        let prefix = unique("t") + ":";
        let keys = RedisKeys::new(prefix.clone());
        let config = AdminConfig {
            database_url: db.url.clone(),
            redis_url: redis.to_string(),
            addr: "127.0.0.1:0".into(),
            jwt_secret: JWT_SECRET.into(),
            keyring: keyring(),
            redis_keys: keys.clone(),
            republish_every: Duration::from_secs(30),
            login_token_ttl: Duration::from_secs(600),
        };
        let pool = shield_admin::redis_pool(redis).expect("redis pool");
        let state = web::Data::new(AdminState::new(db.pool.clone(), pool, &config).expect("admin state"));
        let app_state = state.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(app_state.clone())
                .wrap(actix_web::middleware::from_fn(shield_admin::metrics::track))
                .configure(shield_admin::portal::configure)
                .configure(shield_admin::api::configure)
        })
        .workers(1)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .expect("bind");
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        let evidence = Evidence::new();
        evidence.secret(JWT_SECRET);
        evidence.secret(&vault_key());
        Admin {
            url: format!("http://{addr}"),
            state,
            prefix,
            keys,
            redis: redis.to_string(),
            db,
            evidence,
            handle,
            client: reqwest::Client::new(),
        }
    }

    pub fn token(&self, tenant: Option<&str>, scopes: &[Scope]) -> String {
        self.token_with_ttl(tenant, scopes, Duration::from_secs(600))
    }

    pub fn token_with_ttl(&self, tenant: Option<&str>, scopes: &[Scope], ttl: Duration) -> String {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        let token = Tokens::new(JWT_SECRET).unwrap().issue("tester@example.com", tenant, scopes.to_vec(), ttl, now).0;
        self.evidence.secret(&token);
        token
    }

    /// A correctly signed token that expired a minute ago.
    pub fn expired(&self, tenant: Option<&str>, scopes: &[Scope]) -> String {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        let token = Tokens::new(JWT_SECRET)
            .unwrap()
            .issue("tester@example.com", tenant, scopes.to_vec(), Duration::from_secs(60), now - 120)
            .0;
        self.evidence.secret(&token);
        token
    }

    /// A token for `tenant` with every tenant scope.
    pub fn owner(&self, tenant: &str) -> String {
        self.token(Some(tenant), &[Scope::TenantRead, Scope::ConfigWrite, Scope::RegistryWrite])
    }

    /// Creates a tenant with a fresh slug; returns (slug, admin e-mail, password).
    pub async fn tenant(&self) -> (String, String, String) {
        let slug = unique("acme-");
        let slug = slug[..slug.len().min(40)].to_string();
        let email = format!("owner@{slug}.example.com");
        let created =
            shield_admin::provision::create_tenant(&self.db.pool, &slug, "Acme", &email, "test").await.expect("tenant");
        self.evidence.secret(&created.password);
        (slug, email, created.password)
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let what = format!("{method} {path}");
        let reveals = (method == Method::POST).then(|| REVEALS.iter().find(|(p, _)| *p == path)).flatten();
        let mut request = self.client.request(method, format!("{}{path}", self.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            if path.contains("/secrets/")
                && let Some(value) = body.get("value").and_then(Value::as_str)
            {
                self.evidence.secret(value);
            }
            request = request.json(&body);
        }
        let response = request.send().await.expect("admin answers");
        let (status, headers) = (response.status(), response.headers().clone());
        let text = response.text().await.unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
        match reveals.filter(|_| status.is_success()) {
            Some((_, field)) => self.evidence.secret(value[*field].as_str().unwrap_or_default()),
            None => self.evidence.response(&what, status, &headers, &text),
        }
        (status, value)
    }

    pub async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, Some(token), None).await
    }

    pub async fn put(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::PUT, path, Some(token), Some(body)).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(token), Some(body)).await
    }

    pub async fn delete(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call(Method::DELETE, path, Some(token), None).await
    }

    /// A raw body (for malformed JSON and size tests).
    pub async fn put_raw(&self, path: &str, token: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let response = self
            .client
            .put(format!("{}{path}", self.url))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("admin answers");
        let (status, headers) = (response.status(), response.headers().clone());
        let text = response.text().await.unwrap_or_default();
        self.evidence.response(&format!("PUT (raw) {path}"), status, &headers, &text);
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// A GET without a token, as text.
    pub async fn client_text(&self, path: &str) -> String {
        let response = self.client.get(format!("{}{path}", self.url)).send().await.expect("admin answers");
        let (status, headers) = (response.status(), response.headers().clone());
        let text = response.text().await.unwrap_or_default();
        self.evidence.response(&format!("GET {path}"), status, &headers, &text);
        text
    }

    /// The snapshot currently in Redis for `tenant`.
    pub async fn snapshot(&self, tenant: &str) -> Option<Value> {
        let pool = shield_store::Pool::open(&self.redis, 1).ok()?;
        let mut conn = pool.get().await.ok()?;
        let text: Option<String> =
            redis::cmd("GET").arg(self.keys.snapshot(tenant)).query_async(&mut conn).await.ok()?;
        text.and_then(|t| serde_json::from_str(&t).ok())
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        // The server runs on worker threads of its own, so it answers `/metrics` meanwhile.
        let addr = self.url.trim_start_matches("http://").to_string();
        let metrics = vec![("admin".to_string(), addr)];
        evidence::collect(&self.evidence, self.redis.clone(), self.prefix.clone(), self.db.url.clone(), metrics);
        drop(self.handle.stop(false));
    }
}

/// A target body that passes validation: a public host, no credential.
pub fn public_target(model: &str) -> Value {
    serde_json::json!({"base_url": "https://api.example.com/v1", "model": model, "auth": {"mode": "none"}})
}
