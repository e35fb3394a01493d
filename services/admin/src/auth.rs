//! Admin authentication: argon2 password hashes, HS256 JWTs carrying scopes, and the
//! [`Principal`] extractor. Gates (API.md): no, bad or expired token → 401; a missing scope →
//! 403. The tenant comes from the token only, never from a header or a body.

use std::future::{Ready, ready};
use std::time::Duration;

use actix_web::{FromRequest, HttpRequest, dev::Payload, web};
use argon2::Argon2;
use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::AdminState;
use crate::error::ApiError;
use crate::repo::tenants::{self, Tenant};

/// The closed set of admin scopes (ARCHITECTURE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum Scope {
    #[serde(rename = "tenant:read")]
    TenantRead,
    #[serde(rename = "config:write")]
    ConfigWrite,
    #[serde(rename = "registry:write")]
    RegistryWrite,
    #[serde(rename = "operator")]
    Operator,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::TenantRead => "tenant:read",
            Scope::ConfigWrite => "config:write",
            Scope::RegistryWrite => "registry:write",
            Scope::Operator => "operator",
        }
    }

    pub fn parse(text: &str) -> Result<Scope, String> {
        [Scope::TenantRead, Scope::ConfigWrite, Scope::RegistryWrite, Scope::Operator]
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| {
                format!("unknown scope {text:?} (one of: tenant:read, config:write, registry:write, operator)")
            })
    }

    /// What a tenant user's role grants at login.
    pub fn for_role(role: &str) -> Vec<Scope> {
        match role {
            "owner" => vec![Scope::TenantRead, Scope::ConfigWrite, Scope::RegistryWrite],
            "admin" => vec![Scope::TenantRead, Scope::ConfigWrite],
            "operator" => vec![Scope::Operator],
            _ => vec![Scope::TenantRead],
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    /// Who: an admin user's e-mail, or `cli` for tokens minted by `shield token issue`.
    pub sub: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub scopes: Vec<Scope>,
    pub iat: i64,
    pub exp: i64,
    pub iss: String,
}

const ISSUER: &str = "shield-admin";

#[derive(Clone)]
pub struct Tokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl Tokens {
    /// Refuses secrets shorter than 32 bytes: HS256 is only as strong as its key.
    pub fn new(secret: &str) -> Result<Tokens, String> {
        if secret.len() < 32 {
            return Err("SHIELD_JWT_SECRET must be at least 32 bytes".into());
        }
        let invalid = |e: jsonwebtoken::errors::Error| format!("SHIELD_JWT_SECRET is not usable: {e}");
        Ok(Tokens {
            encoding: EncodingKey::from_secret(secret.as_bytes()).map_err(invalid)?,
            decoding: DecodingKey::from_secret(secret.as_bytes()).map_err(invalid)?,
        })
    }

    /// Mints a token valid for `ttl` from `now` (unix seconds); returns it with its expiry.
    #[allow(
        clippy::expect_used,
        reason = "HS256 signing with a key we hold cannot fail (jsonwebtoken errors only on key/algorithm mismatch)"
    )]
    pub fn issue(&self, sub: &str, tenant: Option<&str>, scopes: Vec<Scope>, ttl: Duration, now: i64) -> (String, i64) {
        let exp = now + ttl.as_secs() as i64;
        let claims = Claims {
            sub: sub.to_string(),
            tenant: tenant.map(str::to_string),
            scopes,
            iat: now,
            exp,
            iss: ISSUER.into(),
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .expect("HS256 signing cannot fail");
        (token, exp)
    }

    pub fn verify(&self, token: &str) -> Result<Claims, ApiError> {
        self.decode(token).map_err(|why| {
            ApiError::Unauthorized(
                match why {
                    TokenProblem::Expired => "the token has expired; sign in again",
                    TokenProblem::Invalid => "the token is not valid",
                }
                .into(),
            )
        })
    }

    /// Verifies signature, issuer and expiry, telling an expired token from a bad one (the
    /// portal sends the first back to sign-in with a notice).
    pub fn decode(&self, token: &str) -> Result<Claims, TokenProblem> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[ISSUER]);
        validation.leeway = 0;
        validation.set_required_spec_claims(&["exp", "iss", "sub"]);
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation).map(|data| data.claims).map_err(|err| {
            match err.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => TokenProblem::Expired,
                _ => TokenProblem::Invalid,
            }
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenProblem {
    Expired,
    Invalid,
}

#[allow(clippy::expect_used, reason = "argon2 with its default parameters and a fresh salt cannot fail")]
pub fn hash_password(password: &str) -> String {
    let salt = crate::random::bytes::<16>();
    let hash: PasswordHash = Argon2::default()
        .hash_password_with_salt(password.as_bytes(), &salt)
        .expect("argon2 with default parameters cannot fail");
    hash.to_string()
}

pub fn verify_password(password: &str, phc: &str) -> bool {
    PasswordHash::new(phc).is_ok_and(|hash| Argon2::default().verify_password(password.as_bytes(), &hash).is_ok())
}

/// The caller, as proven by a valid admin JWT.
#[derive(Debug, Clone)]
pub struct Principal {
    pub claims: Claims,
}

impl Principal {
    pub fn actor(&self) -> &str {
        &self.claims.sub
    }

    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.claims.scopes.contains(&scope) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!("this needs the {} scope", scope.as_str())))
        }
    }

    /// Checks `scope` and resolves the token's tenant.
    pub async fn tenant(&self, state: &AdminState, scope: Scope) -> Result<Tenant, ApiError> {
        self.require(scope)?;
        let slug = self
            .claims
            .tenant
            .as_deref()
            .ok_or_else(|| ApiError::Forbidden("this token is not bound to a tenant".into()))?;
        tenants::by_slug(&state.db, slug)
            .await?
            .ok_or_else(|| ApiError::Unauthorized("the token's tenant no longer exists".into()))
    }
}

impl FromRequest for Principal {
    type Error = ApiError;
    type Future = Ready<Result<Principal, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(principal(req))
    }
}

fn principal(req: &HttpRequest) -> Result<Principal, ApiError> {
    let state = req.app_data::<web::Data<AdminState>>().ok_or(ApiError::Internal)?;
    let header = req
        .headers()
        .get("authorization")
        .ok_or_else(|| ApiError::Unauthorized("missing Authorization: Bearer <admin token>".into()))?;
    let token = header
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::Unauthorized("the Authorization header must be Bearer <admin token>".into()))?;
    Ok(Principal { claims: state.tokens.verify(token)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_expire() {
        let tokens = Tokens::new(&"s".repeat(32)).unwrap();
        let now = chrono::Utc::now().timestamp();
        let (token, exp) = tokens.issue("a@b.c", Some("acme"), vec![Scope::TenantRead], Duration::from_secs(60), now);
        assert_eq!(exp, now + 60);
        let claims = tokens.verify(&token).unwrap();
        assert_eq!(claims.tenant.as_deref(), Some("acme"));
        let (expired, _) = tokens.issue("a@b.c", Some("acme"), vec![], Duration::from_secs(0), now - 10);
        assert!(matches!(tokens.verify(&expired), Err(ApiError::Unauthorized(m)) if m.contains("expired")));
        assert!(Tokens::new(&"o".repeat(32)).unwrap().verify(&token).is_err());
    }

    #[test]
    fn passwords() {
        let hash = hash_password("correct horse");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &hash));
        assert!(!verify_password("wrong", &hash));
        assert!(!verify_password("x", "not a hash"));
    }

    #[test]
    fn scopes_parse() {
        assert_eq!(Scope::parse("config:write"), Ok(Scope::ConfigWrite));
        assert!(Scope::parse("admin").is_err());
    }
}
