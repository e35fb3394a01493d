//! Postgres repositories: one module per table family. Every function takes the tenant id it
//! works for and filters on it; none of them ever sees a secret's plaintext.

pub mod audit;
pub mod config;
pub mod keys;
pub mod secrets;
pub mod tenants;
pub mod users;
pub mod webhooks;

use sha2::{Digest, Sha256};

/// SHA-256 hex of a JSON value: what audit rows record instead of bodies.
pub fn digest(value: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(value.to_string().as_bytes()))
}
