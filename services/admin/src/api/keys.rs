//! `/v1/tenant/me/keys`: tenant API keys for the data plane. The key is returned once, at
//! creation; only its SHA-256 is stored. Revocation and new limits are published at once.

use actix_web::{HttpResponse, delete, get, patch, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use shield_core::limits::Limits;
use uuid::Uuid;

use super::{Body, State, decode};
use crate::AdminState;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ApiResult};
use crate::provision::{self, KeySpec};
use crate::publish::key_record;
use crate::repo::audit::Action;
use crate::repo::keys::{self, KeyMeta};
use crate::write::{ConfigWrite, digest_of};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    pub name: String,
    /// Matched by rules' `agent` condition.
    #[serde(default)]
    pub agent: Option<String>,
    /// Matched by rules' `role` condition and tool RBAC.
    #[serde(default)]
    pub role: Option<String>,
    /// The key's own rate limits (issue 18): positive integers; omitted or `{}` for none.
    #[serde(default)]
    pub limits: Option<Limits>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyCreated {
    pub id: Uuid,
    /// `sk-shield-…`: shown only here.
    pub key: String,
    pub name: String,
    pub agent: Option<String>,
    pub role: Option<String>,
    pub created_at: DateTime<Utc>,
    /// Always present; `{}` when the key has no limits.
    pub limits: Limits,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyList {
    pub keys: Vec<KeyMeta>,
}

/// `PATCH /v1/tenant/me/keys/{id}`: replaces the key's limits; `{"limits": {}}` clears them.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchKey {
    pub limits: Limits,
}

#[utoipa::path(get, path = "/v1/tenant/me/keys", tag = "keys", security(("bearer" = ["config:write"])), responses((status = 200, body = KeyList)))]
#[get("/v1/tenant/me/keys")]
pub async fn list(state: State, principal: Principal) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    Ok(HttpResponse::Ok().json(KeyList { keys: keys::list(&state.db, tenant.id).await? }))
}

#[utoipa::path(post, path = "/v1/tenant/me/keys", tag = "keys", security(("bearer" = ["config:write"])), request_body = CreateKey,
    responses((status = 201, body = KeyCreated), (status = 422, description = "validation error naming the field, e.g. limits.rpm")))]
#[post("/v1/tenant/me/keys")]
pub async fn create(state: State, principal: Principal, body: Body) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    let request: CreateKey = decode(&body)?;
    let spec = KeySpec {
        name: &request.name,
        agent: request.agent.as_deref(),
        role: request.role.as_deref(),
        limits: request.limits.unwrap_or_default(),
    };
    let created = provision::create_key(&state.db, &state.publisher, &tenant, spec, principal.actor()).await?;
    let meta = created.meta;
    Ok(HttpResponse::Created().json(KeyCreated {
        id: meta.id,
        key: created.key,
        name: meta.name,
        agent: meta.agent,
        role: meta.role,
        created_at: meta.created_at,
        limits: meta.limits,
    }))
}

#[utoipa::path(patch, path = "/v1/tenant/me/keys/{id}", tag = "keys", security(("bearer" = ["config:write"])),
    params(("id" = Uuid, Path)), request_body = PatchKey,
    responses((status = 200, body = KeyMeta, description = "the key with its new limits"), (status = 404),
        (status = 422, description = "validation error naming the field, e.g. limits.rpm")))]
#[patch("/v1/tenant/me/keys/{id}")]
pub async fn patch(state: State, principal: Principal, id: web::Path<String>, body: Body) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(set_limits(&state, &principal, &id, &body).await?))
}

/// Validates and stores a key's new limits (a `PatchKey` body), audits the change and
/// publishes the key's record so proxies see it at once. Shared by the API and the portal.
pub async fn set_limits(state: &AdminState, principal: &Principal, id: &str, body: &[u8]) -> ApiResult<KeyMeta> {
    let tenant = principal.tenant(state, Scope::ConfigWrite).await?;
    let not_found = || ApiError::NotFound(format!("key {id} does not exist"));
    let id = Uuid::parse_str(id).map_err(|_| not_found())?;
    let request: PatchKey = decode(body)?;
    request.limits.validate("limits")?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let before = keys::get(write.conn(), tenant.id, id).await?.ok_or_else(not_found)?;
    let meta = keys::set_limits(write.conn(), tenant.id, id, &request.limits).await?.ok_or_else(not_found)?;
    let digests = (Some(digest_of(&before.limits)), Some(digest_of(&meta.limits)));
    write.commit(Action::KeyLimitsSet, &id.to_string(), digests.0, digests.1).await?;
    state.publisher.key_changed(tenant.id, &meta.key_hash, &key_record(&tenant.slug, &meta)).await;
    Ok(meta)
}

#[utoipa::path(delete, path = "/v1/tenant/me/keys/{id}", tag = "keys", security(("bearer" = ["config:write"])),
    params(("id" = Uuid, Path)), responses((status = 204), (status = 404)))]
#[delete("/v1/tenant/me/keys/{id}")]
pub async fn revoke(state: State, principal: Principal, id: web::Path<String>) -> ApiResult<HttpResponse> {
    let id = id.into_inner();
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    let not_found = || ApiError::NotFound(format!("key {id} does not exist"));
    let id = Uuid::parse_str(&id).map_err(|_| not_found())?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let before = keys::get(write.conn(), tenant.id, id).await?.ok_or_else(not_found)?;
    if before.revoked_at.is_some() {
        return Ok(HttpResponse::NoContent().finish()); // already revoked: nothing changes
    }
    let meta = keys::revoke(write.conn(), tenant.id, id).await?.ok_or_else(not_found)?;
    write.commit(Action::KeyRevoked, &id.to_string(), None, None).await?;
    state.publisher.key_changed(tenant.id, &meta.key_hash, &key_record(&tenant.slug, &meta)).await;
    Ok(HttpResponse::NoContent().finish())
}
