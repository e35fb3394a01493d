//! Environment (API.md "Environment"): defaults in one place.

use std::time::Duration;

use anyhow::{Context, bail};
use shield_admin::AdminConfig;
use shield_core::keys::RedisKeys;
use shield_core::vault::Keyring;
use shield_proxy::ProxyConfig;

pub struct Settings {
    pub database_url: String,
    pub redis_url: String,
    /// The port of the default Postgres (127.0.0.1) when `DATABASE_URL` is not set; `None`
    /// when the user named a database. `up` starts a private Postgres there when nothing
    /// answers.
    pub default_postgres_port: Option<u16>,
    /// Likewise for Redis and `REDIS_URL`.
    pub default_redis_port: Option<u16>,
    pub proxy_addr: String,
    pub admin_addr: String,
    pub redis_prefix: String,
    jwt_secret: Option<String>,
    vault_key: Option<String>,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_string())
}

fn env_parse<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name).ok().filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(text) => text.trim().parse().map_err(|_| anyhow::anyhow!("{name} must be a whole number, not {text:?}")),
    }
}

/// `Some(port)` when `url_var` is not set: the port of the default address, Postgres's or
/// Redis's own unless `port_var` moves it (an extension, for tests: `up` against private stores
/// on free ports, away from the real ones).
fn default_port(url_var: &str, port_var: &str, standard: u16) -> anyhow::Result<Option<u16>> {
    if std::env::var(url_var).is_ok_and(|v| !v.is_empty()) {
        return Ok(None);
    }
    match std::env::var(port_var).ok().filter(|v| !v.is_empty()) {
        None => Ok(Some(standard)),
        Some(text) => match text.trim().parse::<u16>() {
            Ok(port @ 1..) => Ok(Some(port)),
            _ => bail!("{port_var} must be a port number from 1 to 65535, not {text:?}"),
        },
    }
}

impl Settings {
    pub fn from_env_without_secrets() -> anyhow::Result<Settings> {
        let default_postgres_port = default_port("DATABASE_URL", "SHIELD_DEFAULT_POSTGRES_PORT", 5432)?;
        let default_redis_port = default_port("REDIS_URL", "SHIELD_DEFAULT_REDIS_PORT", 6379)?;
        Ok(Settings {
            database_url: match default_postgres_port {
                Some(port) => format!("postgres://postgres@127.0.0.1:{port}/shield"),
                None => env_or("DATABASE_URL", ""),
            },
            redis_url: match default_redis_port {
                Some(port) => format!("redis://127.0.0.1:{port}/0"),
                None => env_or("REDIS_URL", ""),
            },
            default_postgres_port,
            default_redis_port,
            proxy_addr: env_or("SHIELD_PROXY_ADDR", "127.0.0.1:8080"),
            admin_addr: env_or("SHIELD_ADMIN_ADDR", "127.0.0.1:8081"),
            redis_prefix: env_or("SHIELD_REDIS_PREFIX", ""),
            jwt_secret: std::env::var("SHIELD_JWT_SECRET").ok().filter(|v| !v.is_empty()),
            vault_key: std::env::var("SHIELD_VAULT_KEY").ok().filter(|v| !v.is_empty()),
        })
    }

    /// Outside `shield up`, the secrets are required; `up` passes `generate = true` to create
    /// development ones in `.shield/`.
    pub fn from_env(generate: bool) -> anyhow::Result<Settings> {
        let mut settings = Settings::from_env_without_secrets()?;
        if generate && settings.jwt_secret.is_none() {
            settings.jwt_secret = Some(crate::demo::dev_secret("jwt_secret")?);
        }
        if generate && settings.vault_key.is_none() {
            settings.vault_key = Some(crate::demo::dev_secret("vault_key")?);
        }
        Ok(settings)
    }

    pub fn jwt_secret(&self) -> anyhow::Result<String> {
        match &self.jwt_secret {
            Some(s) => Ok(s.clone()),
            None => bail!("SHIELD_JWT_SECRET is not set (32+ random bytes; `shield up` generates one in .shield/)"),
        }
    }

    pub fn keyring(&self) -> anyhow::Result<Keyring> {
        let Some(key) = &self.vault_key else {
            bail!("SHIELD_VAULT_KEY is not set (base64 of 32 random bytes, e.g. `openssl rand -base64 32`)")
        };
        Keyring::from_base64(key, 1).context("SHIELD_VAULT_KEY")
    }

    pub fn redis_keys(&self) -> RedisKeys {
        RedisKeys::new(self.redis_prefix.clone())
    }

    pub fn proxy_config(&self) -> anyhow::Result<ProxyConfig> {
        let cache_s: u64 = env_parse("SHIELD_LLM_ROUTING_CACHE_S", 10)?;
        if cache_s == 0 {
            bail!("SHIELD_LLM_ROUTING_CACHE_S must be at least 1");
        }
        let flush_s: u64 = env_parse("SHIELD_LLM_ROUTING_FLUSH_S", 30)?;
        if flush_s == 0 {
            bail!("SHIELD_LLM_ROUTING_FLUSH_S must be at least 1");
        }
        let routing = env_or("SHIELD_LLM_ROUTING", "1");
        let routing_enabled = match routing.as_str() {
            "1" | "true" | "on" => true,
            "0" | "false" | "off" => false,
            other => bail!("SHIELD_LLM_ROUTING must be 1 or 0, not {other:?}"),
        };
        let default_upstream = match std::env::var("SHIELD_DEFAULT_UPSTREAM_URL").ok().filter(|v| !v.is_empty()) {
            None => None,
            Some(text) => Some(
                shield_core::url_safety::parse_outbound_url(&text)
                    .map_err(|why| anyhow::anyhow!("SHIELD_DEFAULT_UPSTREAM_URL {why}"))?,
            ),
        };
        let workers = match std::env::var("SHIELD_PROXY_WORKERS").ok().filter(|v| !v.is_empty()) {
            None => None,
            Some(text) => match text.parse::<usize>() {
                Ok(n @ 1..=1024) => Some(n),
                _ => bail!("SHIELD_PROXY_WORKERS must be a whole number from 1 to 1024, not {text:?}"),
            },
        };
        let max_connections = match std::env::var("SHIELD_PROXY_MAX_CONNECTIONS").ok().filter(|v| !v.is_empty()) {
            None => 25_000,
            Some(text) => match text.parse::<usize>() {
                Ok(n @ 1..=1_000_000) => n,
                _ => bail!("SHIELD_PROXY_MAX_CONNECTIONS must be a whole number from 1 to 1000000, not {text:?}"),
            },
        };
        Ok(ProxyConfig {
            addr: self.proxy_addr.clone(),
            redis_url: self.redis_url.clone(),
            redis_keys: self.redis_keys(),
            cache_every: Duration::from_secs(cache_s),
            flush_every: Duration::from_secs(flush_s),
            routing_enabled,
            default_upstream,
            max_hops: env_parse("SHIELD_MAX_HOPS", 3)?,
            workers,
            max_connections,
            metrics_tenant_labels: env_or("SHIELD_METRICS_TENANT_LABELS", "1") != "0",
            keyring: self.keyring()?,
        })
    }

    pub fn admin_config(&self) -> anyhow::Result<AdminConfig> {
        Ok(AdminConfig {
            database_url: self.database_url.clone(),
            redis_url: self.redis_url.clone(),
            addr: self.admin_addr.clone(),
            jwt_secret: self.jwt_secret()?,
            keyring: self.keyring()?,
            redis_keys: self.redis_keys(),
            republish_every: Duration::from_secs(30),
            login_token_ttl: Duration::from_secs(3600),
        })
    }
}
