//! Caller authentication by tenant API key (`Authorization: Bearer` or `x-api-key`). The key
//! is hashed at once and only its SHA-256 is looked up, cached or logged about; it is never
//! forwarded upstream.

use std::sync::Arc;

use crate::server::Request;
use http::header::{AUTHORIZATION, HeaderName};
use shield_core::snapshot::{ApiKeyRecord, key_hash};

use crate::cache::{Caches, KeyLookup};
use crate::error::ProxyError;

pub async fn authenticate(req: &Request, caches: &Caches) -> Result<Arc<ApiKeyRecord>, ProxyError> {
    let key = presented_key(req).ok_or(ProxyError::InvalidApiKey(
        "missing API key: send Authorization: Bearer <your Shield key> (or x-api-key)",
    ))?;
    match caches.key(&key_hash(key)).await {
        // Issue 32: expiry is read from the cached record, no store round trip.
        KeyLookup::Valid(record) => match record.expires_at {
            Some(at) if record.expired(crate::calendar::unix_now()) => {
                Err(ProxyError::KeyExpired { rotated: record.rotated, at })
            }
            _ => Ok(record),
        },
        KeyLookup::Invalid => Err(ProxyError::InvalidApiKey("incorrect API key provided (unknown or revoked)")),
        KeyLookup::Unavailable => Err(ProxyError::AuthUnavailable),
    }
}

/// `x-api-key`, parsed once (a `&str` lookup of a non-standard name allocates per request).
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

fn presented_key(req: &Request) -> Option<&str> {
    let headers = req.headers();
    let bearer = headers.get(AUTHORIZATION).and_then(|h| h.to_str().ok()).and_then(|h| {
        let (scheme, token) = h.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    });
    bearer.or_else(|| headers.get(X_API_KEY).and_then(|h| h.to_str().ok()).map(str::trim)).filter(|k| !k.is_empty())
}
