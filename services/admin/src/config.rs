//! Admin settings, read once at start. Never printed whole: it holds the JWT secret and the
//! vault key.

use std::time::Duration;

use shield_core::keys::RedisKeys;
use shield_core::vault::Keyring;

#[derive(Clone)]
pub struct AdminConfig {
    pub database_url: String,
    pub redis_url: String,
    pub addr: String,
    pub jwt_secret: String,
    pub keyring: Keyring,
    pub redis_keys: RedisKeys,
    /// How often the republisher compares Redis with Postgres (ARCHITECTURE.md: 30 s).
    pub republish_every: Duration,
    /// Lifetime of tokens minted by `POST /v1/auth/login`.
    pub login_token_ttl: Duration,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig").field("addr", &self.addr).field("keyring", &self.keyring).finish_non_exhaustive()
    }
}
