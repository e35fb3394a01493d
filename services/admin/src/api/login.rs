//! `POST /v1/auth/login`: e-mail and password for a short-lived admin JWT.

use std::time::Instant;

use actix_web::{HttpResponse, post, web};
use serde::{Deserialize, Serialize};

use super::{Body, State, decode};
use crate::AdminState;
use crate::auth::{Scope, verify_password};
use crate::error::{ApiError, ApiResult};
use crate::repo::users;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    pub email: String,
    pub password: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct LoginResponse {
    pub token: String,
    /// RFC 3339.
    pub expires_at: String,
    pub tenant: Option<String>,
    pub scopes: Vec<Scope>,
}

/// An argon2 hash of a random string: verified against when the e-mail is unknown, so a wrong
/// e-mail and a wrong password take the same time.
static DECOY_HASH: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| crate::auth::hash_password(&crate::random::b64url(16)));

#[utoipa::path(post, path = "/v1/auth/login", tag = "auth", request_body = LoginRequest,
    responses((status = 200, body = LoginResponse), (status = 401, description = "wrong e-mail or password"), (status = 429, description = "too many failed attempts")))]
#[post("/v1/auth/login")]
pub async fn login(state: State, body: Body) -> ApiResult<HttpResponse> {
    let request: LoginRequest = decode(&body)?;
    Ok(HttpResponse::Ok().json(authenticate(&state, request).await?))
}

/// Checks e-mail and password (throttled per e-mail) and mints a token for the user's role.
/// Shared by the API and the portal's sign-in form.
pub async fn authenticate(state: &AdminState, request: LoginRequest) -> ApiResult<LoginResponse> {
    let email = request.email.trim().to_lowercase();
    if !state.login_limiter.allowed(&email, Instant::now()) {
        return Err(ApiError::RateLimited);
    }
    let user = users::by_email(&state.db, &email).await?;
    let hash = user.as_ref().map_or(DECOY_HASH.as_str(), |u| u.password_hash.as_str()).to_string();
    let password = request.password;
    let valid = web::block(move || verify_password(&password, &hash)).await.map_err(|_| ApiError::Internal)?;
    let Some(user) = user.filter(|_| valid) else {
        state.login_limiter.failed(&email, Instant::now());
        return Err(ApiError::Unauthorized("wrong e-mail or password".into()));
    };
    state.login_limiter.succeeded(&email);
    let scopes = Scope::for_role(&user.role);
    let now = chrono::Utc::now().timestamp();
    let (token, exp) =
        state.tokens.issue(&user.email, user.tenant_slug.as_deref(), scopes.clone(), state.login_token_ttl, now);
    let expires_at = chrono::DateTime::from_timestamp(exp, 0).unwrap_or_default().to_rfc3339();
    Ok(LoginResponse { token, expires_at, tenant: user.tenant_slug, scopes })
}
