//! `/v1/tenant/me/keys`: tenant API keys for the data plane. The key is returned once, at
//! creation or rotation; only its SHA-256 is stored. A key's allow-list, expiry, budget,
//! metadata and limits (issue 32) change by `PATCH`; every change, a rotation and a revocation
//! are audited and published at once.

use std::collections::BTreeMap;

use actix_web::{HttpResponse, delete, get, patch, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use shield_core::key_access::MonthlyBudget;
use shield_core::limits::Limits;
use shield_core::money::Usd;
use uuid::Uuid;

use super::{Body, State, decode};
use crate::AdminState;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ApiResult};
use crate::provision::{self, KeySpec};
use crate::repo::audit::Action;
use crate::repo::keys::{self, KeyMeta, KeySettings};
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
    /// Route names and patterns (`team-*`) the key may name as `model`; omitted: every route.
    /// The default path counts: a key with an allow-list reaches it only for a model it lists.
    #[serde(default)]
    pub routes: Option<Vec<String>>,
    /// When the key stops working (RFC 3339, in the future); omitted: never.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    /// The key's monthly spend budget, USD: `{monthly, action: "block" | "warn"}`.
    #[serde(default)]
    pub budget: Option<MonthlyBudget>,
    /// Labels of the key's holder (owner, team, purpose): at most 20 short strings.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyCreated {
    /// `sk-shield-…`: shown only here.
    pub key: String,
    #[serde(flatten)]
    pub meta: KeyMeta,
}

/// A key as listed: what it is, and what it spent this month.
#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyView {
    #[serde(flatten)]
    pub meta: KeyMeta,
    /// This month's spend (UTC calendar month), USD, as the proxies last flushed it; `null`
    /// when the store cannot be read.
    pub month_spend: Option<f64>,
    pub month_spend_micros: Option<i64>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyList {
    pub keys: Vec<KeyView>,
}

/// `PATCH /v1/tenant/me/keys/{id}`: changes what is sent, keeps the rest. `null` clears
/// `routes` (every route), `expires_at` (never) and `budget` (none); `{"limits": {}}` clears
/// the limits, `{"metadata": {}}` the metadata.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchKey {
    #[serde(default)]
    pub limits: Option<Limits>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<String>>)]
    pub routes: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<DateTime<Utc>>)]
    pub expires_at: Option<Option<DateTime<Utc>>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<MonthlyBudget>)]
    pub budget: Option<Option<MonthlyBudget>>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// A field that was sent: `null` is `Some(None)`, absent stays `None` (by `default`).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// `POST /v1/tenant/me/keys/{id}/rotate`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateKey {
    /// How long the old secret keeps working, 0 to 604800 seconds (7 days).
    pub grace_s: i64,
}

#[utoipa::path(get, path = "/v1/tenant/me/keys", tag = "keys", security(("bearer" = ["config:write"])), responses((status = 200, body = KeyList)))]
#[get("/v1/tenant/me/keys")]
pub async fn list(state: State, principal: Principal) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(KeyList { keys: views(&state, &principal).await? }))
}

/// The tenant's keys with this month's spend (the API's list and the portal's page).
pub async fn views(state: &AdminState, principal: &Principal) -> ApiResult<Vec<KeyView>> {
    let tenant = principal.tenant(state, Scope::ConfigWrite).await?;
    let keys = keys::list(&state.db, tenant.id).await?;
    let month = Utc::now().format("%Y%m").to_string();
    let spend = async {
        let mut conn = state.redis.get().await.ok()?;
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(state.redis_keys.key_spend(&tenant.slug, &month))
            .query_async(&mut conn)
            .await
            .ok()?;
        Some(shield_core::records::spend::decode(fields))
    };
    let spend = tokio::time::timeout(std::time::Duration::from_secs(2), spend).await.ok().flatten();
    Ok(keys
        .into_iter()
        .map(|meta| {
            let micros = spend.as_ref().map(|s| s.get(&meta.id.to_string()).copied().unwrap_or(0));
            let month_spend = micros.map(|m| Usd(m).to_decimal().parse().unwrap_or(0.0));
            KeyView { meta, month_spend, month_spend_micros: micros }
        })
        .collect())
}

#[utoipa::path(post, path = "/v1/tenant/me/keys", tag = "keys", security(("bearer" = ["config:write"])), request_body = CreateKey,
    responses((status = 201, body = KeyCreated), (status = 422, description = "validation error naming the field, e.g. limits.rpm, routes[0], expires_at, budget.monthly")))]
#[post("/v1/tenant/me/keys")]
pub async fn create(state: State, principal: Principal, body: Body) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Created().json(create_from(&state, &principal, &body).await?))
}

/// Validates and creates a key from a `CreateKey` body (the API and the portal).
pub async fn create_from(state: &AdminState, principal: &Principal, body: &[u8]) -> ApiResult<KeyCreated> {
    let tenant = principal.tenant(state, Scope::ConfigWrite).await?;
    let request: CreateKey = decode(body)?;
    let spec = KeySpec {
        name: &request.name,
        agent: request.agent.as_deref(),
        role: request.role.as_deref(),
        settings: KeySettings {
            limits: request.limits.unwrap_or_default(),
            routes: request.routes,
            expires_at: request.expires_at,
            budget: request.budget,
            metadata: request.metadata,
        },
    };
    let created = provision::create_key(&state.db, &state.publisher, &tenant, spec, principal.actor()).await?;
    Ok(KeyCreated { key: created.key, meta: created.meta })
}

#[utoipa::path(patch, path = "/v1/tenant/me/keys/{id}", tag = "keys", security(("bearer" = ["config:write"])),
    params(("id" = Uuid, Path)), request_body = PatchKey,
    responses((status = 200, body = KeyMeta, description = "the key as changed"), (status = 404),
        (status = 422, description = "validation error naming the field, e.g. limits.rpm, routes[0], expires_at")))]
#[patch("/v1/tenant/me/keys/{id}")]
pub async fn patch(state: State, principal: Principal, id: web::Path<String>, body: Body) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(update(&state, &principal, &id, &body).await?))
}

/// Applies a `PatchKey` body: validates the key's new settings, stores them, audits the
/// change and publishes the key's records so every proxy sees it at once. Shared by the API
/// and the portal.
pub async fn update(state: &AdminState, principal: &Principal, id: &str, body: &[u8]) -> ApiResult<KeyMeta> {
    let tenant = principal.tenant(state, Scope::ConfigWrite).await?;
    let not_found = || ApiError::NotFound(format!("key {id} does not exist"));
    let id = Uuid::parse_str(id).map_err(|_| not_found())?;
    let request: PatchKey = decode(body)?;
    let only_limits = request.routes.is_none()
        && request.expires_at.is_none()
        && request.budget.is_none()
        && request.metadata.is_none();
    if only_limits && request.limits.is_none() {
        // `limits` was once the one field: an empty patch still names it.
        let message = "send at least one field to change: limits, routes, expires_at, budget or metadata";
        return Err(ApiError::validation("limits", message));
    }
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let before = keys::get(write.conn(), tenant.id, id).await?.ok_or_else(not_found)?;
    let mut settings = KeySettings::of(&before);
    if let Some(limits) = request.limits {
        settings.limits = limits;
    }
    if let Some(routes) = request.routes {
        settings.routes = routes;
    }
    if let Some(expires_at) = request.expires_at {
        settings.expires_at = expires_at;
    }
    if let Some(budget) = request.budget {
        settings.budget = budget;
    }
    if let Some(metadata) = request.metadata {
        settings.metadata = metadata;
    }
    // An expiry already set and unchanged may have passed: only a new one must be ahead.
    let mut checked = settings.clone();
    if checked.expires_at == before.expires_at {
        checked.expires_at = None;
    }
    provision::check_settings(&checked, Utc::now())?;
    let meta = keys::set_settings(write.conn(), tenant.id, id, &settings).await?.ok_or_else(not_found)?;
    let digests = if only_limits {
        // Issue 18's record of a limits change keeps its meaning: digests of the limits.
        (Some(digest_of(&before.limits)), Some(digest_of(&meta.limits)))
    } else {
        (Some(provision::settings_digest(&KeySettings::of(&before))), Some(provision::settings_digest(&settings)))
    };
    let action = if only_limits { Action::KeyLimitsSet } else { Action::KeyUpdated };
    let version = write.version();
    write.commit_with(action, &id.to_string(), digests, Some(provision::audit_details(&meta))).await?;
    state.publisher.key_changed(tenant.id, &tenant.slug, &meta, version).await;
    Ok(meta)
}

#[utoipa::path(post, path = "/v1/tenant/me/keys/{id}/rotate", tag = "keys", security(("bearer" = ["config:write"])),
    params(("id" = Uuid, Path)), request_body = RotateKey,
    responses((status = 200, body = KeyCreated, description = "the key with its new secret (shown only here); the old secret works until `previous_until`"),
        (status = 404), (status = 409, description = "the key is revoked or expired"),
        (status = 503, description = "Redis cannot take the revocation of a secret kept from an earlier rotation; nothing changed"), (status = 422, description = "grace_s out of range")))]
#[post("/v1/tenant/me/keys/{id}/rotate")]
pub async fn rotate(state: State, principal: Principal, id: web::Path<String>, body: Body) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(rotate_key(&state, &principal, &id, &body).await?))
}

/// Gives a key a new secret; its id, limits, budget and spend carry over, and its old secret
/// keeps working for `grace_s`. A secret kept from an earlier rotation stops at once.
pub async fn rotate_key(state: &AdminState, principal: &Principal, id: &str, body: &[u8]) -> ApiResult<KeyCreated> {
    let tenant = principal.tenant(state, Scope::ConfigWrite).await?;
    let not_found = || ApiError::NotFound(format!("key {id} does not exist"));
    let id = Uuid::parse_str(id).map_err(|_| not_found())?;
    let request: RotateKey = decode(body)?;
    let mut problems = shield_core::error::Problems::default();
    shield_core::key_access::check_grace(request.grace_s, &mut problems, "grace_s");
    problems.into_result()?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let before = keys::get(write.conn(), tenant.id, id).await?.ok_or_else(not_found)?;
    if before.revoked_at.is_some() {
        let message = format!("key {id} is revoked; create a new key");
        return Err(ApiError::Conflict { message, key: "keys", names: vec![id.to_string()] });
    }
    if before.expires_at.is_some_and(|at| at <= Utc::now()) {
        // A new secret would inherit the passed expiry: dead on arrival.
        let message = format!("key {id} has expired; give it a new expires_at first, or create a new key");
        return Err(ApiError::Conflict { message, key: "keys", names: vec![id.to_string()] });
    }
    let (key, hash, prefix) = provision::new_secret();
    let until = Utc::now() + chrono::Duration::seconds(request.grace_s);
    let meta = keys::rotate(write.conn(), tenant.id, id, (&hash, &prefix), until).await?.ok_or_else(not_found)?;
    let digests = (Some(before.prefix.clone()), Some(meta.prefix.clone()));
    let mut details = provision::audit_details(&meta);
    if let Some(details) = details.as_object_mut() {
        details.insert("grace_s".into(), request.grace_s.into());
    }
    let version = write.version();
    // The secret displaced from an earlier grace stops now: revoked in Redis before the
    // rotation commits (the database forgets its hash), so a store that cannot take that
    // refuses the rotation rather than leave the secret working.
    if let Some(displaced) = before.previous_key_hash.filter(|h| Some(h) != meta.previous_key_hash.as_ref()) {
        let mut record = crate::publish::key_record(&tenant.slug, &meta, version);
        record.revoked = true;
        state.publisher.set_records(vec![(displaced, record)]).await.map_err(|err| {
            tracing::warn!(error = %err, "rotation refused: the displaced secret could not be revoked in Redis");
            ApiError::RedisUnavailable
        })?;
    }
    write.commit_with(Action::KeyRotated, &id.to_string(), digests, Some(details)).await?;
    state.publisher.key_changed(tenant.id, &tenant.slug, &meta, version).await;
    Ok(KeyCreated { key, meta })
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
    let version = write.version();
    write.commit(Action::KeyRevoked, &id.to_string(), None, None).await?;
    state.publisher.key_changed(tenant.id, &tenant.slug, &meta, version).await;
    Ok(HttpResponse::NoContent().finish())
}
