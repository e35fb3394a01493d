//! Google Cloud service accounts as credentials (PROVIDERS.md §7): the key file in the vault
//! is exchanged by the gateway for an OAuth access token (an RS256-signed JWT assertion POSTed
//! to the token endpoint), which goes on requests as `Authorization: Bearer`.
//!
//! Hand-rolled on `jsonwebtoken` rather than a Google auth crate: those POST to the key file's
//! `token_uri` verbatim (a key uploader would choose where the gateway sends a signed
//! assertion) and bring their own HTTP client, which would bypass the egress SSRF checks. Here
//! the endpoint is fixed process-wide (`SHIELD_GCP_TOKEN_URL`, else Google's), a key file that
//! names another is refused, and the exchange goes through [`Egress`] under the target's
//! `allow_private`.
//!
//! A token is cached until shortly before it expires and refreshed by one caller while the
//! others wait for that refresh (single flight). A refresh that fails is reported as the
//! target's credential being unavailable (it is excluded, the run moves on), keeps a token
//! that is still valid in use, and is not retried for a few seconds, so a token endpoint that
//! is down costs each request nothing. Sources are shared across snapshot versions by the key
//! file's digest, so publishing a route does not fetch new tokens.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Weak};
use std::time::{Duration, Instant};

use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use shield_core::outcome::Class;
use url::Url;

use crate::egress::{Egress, Failure};

/// Google's token endpoint, unless the operator sets `SHIELD_GCP_TOKEN_URL`.
pub const GOOGLE_TOKEN_URL: &str = "https://oauth2.googleapis.com/token";
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// How long an assertion is valid (Google's maximum).
const ASSERTION_LIFETIME_S: u64 = 3600;
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed refresh, callers fail fast for this long instead of each waiting on the
/// endpoint again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);
/// The longest a token is kept, whatever the endpoint says.
const MAX_TOKEN_LIFETIME_S: u64 = 24 * 3600;
/// A token is refreshed this long before it expires (at most half its lifetime).
const REFRESH_EARLY_S: u64 = 300;

/// The token endpoint in force: `SHIELD_GCP_TOKEN_URL` (private clouds, tests), else Google's.
static TOKEN_URL: LazyLock<Option<Url>> = LazyLock::new(|| {
    let configured = std::env::var("SHIELD_GCP_TOKEN_URL").ok().filter(|u| !u.trim().is_empty());
    let url = configured.as_deref().unwrap_or(GOOGLE_TOKEN_URL);
    let parsed = Url::parse(url).ok().filter(|u| matches!(u.scheme(), "http" | "https"));
    if parsed.is_none() {
        tracing::error!("SHIELD_GCP_TOKEN_URL is not an http(s) URL: no Vertex AI target can get a token");
    }
    parsed
});

/// Every live source, by the digest of the token endpoint and key file.
static SOURCES: LazyLock<parking_lot::Mutex<HashMap<[u8; 32], Weak<TokenSource>>>> = LazyLock::new(Default::default);

/// The fields of a service-account key file that are used.
#[derive(Deserialize)]
struct KeyFile {
    client_email: String,
    private_key: String,
    #[serde(default)]
    private_key_id: Option<String>,
    #[serde(default)]
    token_uri: Option<String>,
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

#[derive(Deserialize)]
struct Granted {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// One service account's tokens. Never formatted.
pub struct TokenSource {
    email: String,
    key_id: Option<String>,
    key: jsonwebtoken::EncodingKey,
    token_url: Url,
    state: parking_lot::Mutex<State>,
    refresh: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    token: Option<Token>,
    failed_at: Option<Instant>,
}

struct Token {
    value: HeaderValue,
    refresh_at: Instant,
    expires_at: Instant,
}

impl TokenSource {
    /// The source of a key file (shared with every other holder of the same file), or why
    /// the file cannot be used.
    pub fn shared(key_file: &str) -> Result<Arc<TokenSource>, &'static str> {
        let token_url = TOKEN_URL.clone().ok_or("SHIELD_GCP_TOKEN_URL is not an http(s) URL")?;
        TokenSource::shared_at(key_file, token_url)
    }

    /// [`Self::shared`] with the token endpoint given.
    pub(super) fn shared_at(key_file: &str, token_url: Url) -> Result<Arc<TokenSource>, &'static str> {
        let file: KeyFile = serde_json::from_str(key_file)
            .map_err(|_| "the secret is not a service-account key file (JSON with client_email and private_key)")?;
        // Never posted to: the endpoint is the operator's choice, not the uploader's.
        if file.token_uri.as_deref().is_some_and(|uri| Url::parse(uri).ok().as_ref() != Some(&token_url)) {
            return Err("the key file's token_uri is not the token endpoint in force (SHIELD_GCP_TOKEN_URL); not used");
        }
        let digest: [u8; 32] = {
            use sha2::Digest;
            let mut hash = sha2::Sha256::new();
            hash.update(token_url.as_str());
            hash.update([0]);
            hash.update(key_file);
            hash.finalize().into()
        };
        let mut sources = SOURCES.lock();
        if let Some(source) = sources.get(&digest).and_then(Weak::upgrade) {
            return Ok(source);
        }
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(file.private_key.as_bytes())
            .map_err(|_| "the key file's private_key is not an RSA private key in PEM")?;
        let source = Arc::new(TokenSource {
            email: file.client_email,
            key_id: file.private_key_id.filter(|id| !id.is_empty()),
            key,
            token_url,
            state: parking_lot::Mutex::new(State::default()),
            refresh: tokio::sync::Mutex::new(()),
        });
        sources.retain(|_, source| source.strong_count() > 0);
        sources.insert(digest, Arc::downgrade(&source));
        Ok(source)
    }

    /// `Bearer {token}`: the cached token, or a new one when it is near its end.
    pub async fn token(&self, egress: &Egress, allow_private: bool) -> Result<HeaderValue, Failure> {
        if let Some(value) = self.fresh() {
            return Ok(value);
        }
        let _one_refresh = self.refresh.lock().await;
        // Whoever held the lock before may have just refreshed it.
        if let Some(value) = self.fresh() {
            return Ok(value);
        }
        let unavailable = || Failure::of(Class::CredentialUnavailable);
        if self.state.lock().failed_at.is_some_and(|at| at.elapsed() < RETRY_AFTER_FAILURE) {
            return self.usable().ok_or_else(unavailable);
        }
        match self.fetch(egress, allow_private).await {
            Ok(token) => {
                let value = token.value.clone();
                *self.state.lock() = State { token: Some(token), failed_at: None };
                Ok(value)
            }
            Err(why) => {
                tracing::warn!(why, "the service account's token could not be refreshed; its targets are excluded");
                self.state.lock().failed_at = Some(Instant::now());
                self.usable().ok_or_else(unavailable)
            }
        }
    }

    /// The token, when it is not yet due for a refresh.
    fn fresh(&self) -> Option<HeaderValue> {
        let state = self.state.lock();
        state.token.as_ref().filter(|t| Instant::now() < t.refresh_at).map(|t| t.value.clone())
    }

    /// The token, while it is still valid.
    fn usable(&self) -> Option<HeaderValue> {
        let state = self.state.lock();
        state.token.as_ref().filter(|t| Instant::now() < t.expires_at).map(|t| t.value.clone())
    }

    /// One exchange of a signed assertion for a token; `Err` says why, without secrets.
    async fn fetch(&self, egress: &Egress, allow_private: bool) -> Result<Token, &'static str> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let claims = Claims {
            iss: &self.email,
            scope: SCOPE,
            aud: self.token_url.as_str(),
            iat: now,
            exp: now + ASSERTION_LIFETIME_S,
        };
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.kid = self.key_id.clone();
        let assertion =
            jsonwebtoken::encode(&header, &claims, &self.key).map_err(|_| "the assertion could not be signed")?;
        let form = format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={assertion}");
        let mut headers = HeaderMap::with_capacity(2);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/x-www-form-urlencoded"));
        headers.insert(http::header::ACCEPT, HeaderValue::from_static("application/json"));
        let asked = Instant::now();
        let (status, body) = egress
            .exchange(&self.token_url, allow_private, headers, form.into_bytes(), EXCHANGE_TIMEOUT)
            .await
            .map_err(|failure| match failure.class {
                Class::UnsafeUrl => "the token endpoint is a private address (the target does not allow_private)",
                Class::Timeout => "the token endpoint did not answer in time",
                _ => "the token endpoint could not be reached",
            })?;
        if !(200..300).contains(&status) {
            return Err("the token endpoint refused the assertion");
        }
        let granted: Granted =
            serde_json::from_slice(&body).map_err(|_| "the token endpoint's answer is not a token")?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", granted.access_token))
            .map_err(|_| "the token endpoint's token is not a header value")?;
        value.set_sensitive(true);
        // Bounded: an endpoint that names an absurd lifetime must not overflow the clock (and
        // Google's tokens live an hour).
        let lifetime = granted.expires_in.unwrap_or(ASSERTION_LIFETIME_S).min(MAX_TOKEN_LIFETIME_S);
        Ok(Token {
            value,
            refresh_at: asked + Duration::from_secs(lifetime - REFRESH_EARLY_S.min(lifetime / 2)),
            expires_at: asked + Duration::from_secs(lifetime),
        })
    }
}
