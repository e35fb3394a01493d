//! `/v1/tenant/me/gateway/targets`: provider endpoints. Reads show a credential only as its
//! reference; a target body never holds a secret.

use std::net::IpAddr;
use std::time::Duration;

use actix_web::{HttpResponse, delete, get, post, put, web};
use serde::Serialize;
use shield_core::MAX_TARGETS_PER_TENANT;
use shield_core::target::Target;
use shield_core::url_safety;
use shield_core::validate::{routes_broken_by, routes_using, validate_target};

use super::{Body, State, created_or_replaced, decode};
use crate::AdminState;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ApiResult};
use crate::repo::audit::{self, Action};
use crate::repo::{config, secrets};
use crate::write::{ConfigWrite, digest_of};

#[derive(Serialize, utoipa::ToSchema)]
pub struct TargetList {
    pub targets: Vec<Target>,
}

#[utoipa::path(get, path = "/v1/tenant/me/gateway/targets", tag = "targets", security(("bearer" = ["tenant:read"])),
    responses((status = 200, body = TargetList)))]
#[get("/v1/tenant/me/gateway/targets")]
pub async fn list(state: State, principal: Principal) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::TenantRead).await?;
    let targets = config::targets(&state.db, tenant.id).await?.into_values().collect();
    Ok(HttpResponse::Ok().json(TargetList { targets }))
}

#[utoipa::path(get, path = "/v1/tenant/me/gateway/targets/{id}", tag = "targets", security(("bearer" = ["tenant:read"])),
    params(("id" = String, Path)), responses((status = 200, body = Target), (status = 404)))]
#[get("/v1/tenant/me/gateway/targets/{id}")]
pub async fn get(state: State, principal: Principal, id: web::Path<String>) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(read(&state, &principal, &id).await?))
}

/// One target of the principal's tenant (the API's GET and the portal's edit form).
pub async fn read(state: &AdminState, principal: &Principal, id: &str) -> ApiResult<Target> {
    let tenant = principal.tenant(state, Scope::TenantRead).await?;
    config::target(&state.db, tenant.id, id).await?.ok_or_else(|| not_found(id))
}

/// Create or replace. `allow_private: true` also needs `registry:write`; a change that breaks
/// the envelope of a route using the target is refused (409 naming the routes).
#[utoipa::path(put, path = "/v1/tenant/me/gateway/targets/{id}", tag = "targets", security(("bearer" = ["config:write"])),
    params(("id" = String, Path)), request_body = Target,
    responses((status = 200, body = Target, description = "replaced"), (status = 201, body = Target, description = "created"),
        (status = 409, description = "would break a route's required_profile"), (status = 422, description = "validation error naming the field")))]
#[put("/v1/tenant/me/gateway/targets/{id}")]
pub async fn put(state: State, principal: Principal, id: web::Path<String>, body: Body) -> ApiResult<HttpResponse> {
    let (created, target) = save(&state, &principal, &id, &body).await?;
    Ok(created_or_replaced(created, target))
}

/// Validates and stores a target body (JSON); `true` when it was created. Shared by the API
/// and the portal's form, so both give the same answers and the same audit rows.
pub async fn save(state: &AdminState, principal: &Principal, id: &str, body: &[u8]) -> ApiResult<(bool, Target)> {
    let tenant = principal.tenant(state, Scope::ConfigWrite).await?;
    let mut target: Target = decode(body)?;
    if target.allow_private {
        principal.require(Scope::RegistryWrite)?;
    }
    check_resolved_hosts(&target).await?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    validate_target(id, &mut target, &secrets::bindings(write.conn(), tenant.id).await?)?;
    let before = config::target(write.conn(), tenant.id, id).await?;
    if before.is_none() && config::target_count(write.conn(), tenant.id).await? >= MAX_TARGETS_PER_TENANT as i64 {
        return Err(ApiError::validation("id", format!("a tenant has at most {MAX_TARGETS_PER_TENANT} targets")));
    }
    let broken = routes_broken_by(&target, &config::routes(write.conn(), tenant.id).await?)
        .into_iter()
        .map(|(route, keys)| format!("{route} ({})", keys.join(", ")))
        .collect::<Vec<_>>();
    if !broken.is_empty() {
        let message =
            format!("target {id:?} would no longer satisfy the required_profile of routes: {}", broken.join("; "));
        return Err(ApiError::Conflict { message, key: "routes", names: broken });
    }
    target.updated_at = chrono::Utc::now().timestamp();
    target.updated_by = principal.actor().to_string();
    let created = config::put_target(write.conn(), tenant.id, &target).await?;
    write.commit(Action::TargetSet, id, before.as_ref().map(digest_of), Some(digest_of(&target))).await?;
    Ok((created, target))
}

/// Refused with 409 while a route lists the target.
#[utoipa::path(delete, path = "/v1/tenant/me/gateway/targets/{id}", tag = "targets", security(("bearer" = ["config:write"])),
    params(("id" = String, Path)), responses((status = 204), (status = 404), (status = 409, description = "used by routes (named)")))]
#[delete("/v1/tenant/me/gateway/targets/{id}")]
pub async fn delete(state: State, principal: Principal, id: web::Path<String>) -> ApiResult<HttpResponse> {
    let id = id.into_inner();
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let before = config::target(write.conn(), tenant.id, &id).await?.ok_or_else(|| not_found(&id))?;
    let routes = config::routes(write.conn(), tenant.id).await?;
    let using: Vec<String> = routes_using(&id, &routes).into_iter().map(str::to_string).collect();
    if !using.is_empty() {
        let message = format!("target {id:?} is used by routes: {}; remove it from them first", using.join(", "));
        return Err(ApiError::Conflict { message, key: "routes", names: using });
    }
    config::delete_target(write.conn(), tenant.id, &id).await?;
    write.commit(Action::TargetDeleted, &id, Some(digest_of(&before)), None).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Clears the target's exhaustion cooldown and circuit in every proxy (announced on
/// `gw_config`; each process applies it to its own view).
#[utoipa::path(post, path = "/v1/tenant/me/gateway/targets/{id}/reset", tag = "targets", security(("bearer" = ["config:write"])),
    params(("id" = String, Path)), responses((status = 202, description = "announced to the proxies"), (status = 404), (status = 503)))]
#[post("/v1/tenant/me/gateway/targets/{id}/reset")]
#[allow(clippy::expect_used, reason = "serialising a derived struct of strings cannot fail")]
pub async fn reset(state: State, principal: Principal, id: web::Path<String>) -> ApiResult<HttpResponse> {
    let id = id.into_inner();
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    config::target(&state.db, tenant.id, &id).await?.ok_or_else(|| not_found(&id))?;
    let message = serde_json::to_string(&shield_core::snapshot::ConfigMessage::Reset {
        tenant: tenant.slug.clone(),
        reset: id.clone(),
    })
    .expect("config message serialises");
    let mut conn = state.redis.get().await.map_err(|_| ApiError::RedisUnavailable)?;
    let _: i64 = redis::cmd("PUBLISH")
        .arg(state.redis_keys.config_channel())
        .arg(message)
        .query_async(&mut conn)
        .await
        .map_err(|_| ApiError::RedisUnavailable)?;
    audit::record(&state.db, tenant.id, principal.actor(), Action::TargetReset, &id, (None, None), None).await?;
    Ok(HttpResponse::Accepted().json(serde_json::json!({"target": id, "reset": true})))
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("target {id:?} does not exist"))
}

/// Write-time DNS check (seed §5): a name that resolves to a private address needs
/// `allow_private`. A name that does not resolve now is accepted: the proxy re-checks every
/// resolution at call time, which is the check that protects against rebinding anyway.
async fn check_resolved_hosts(target: &Target) -> Result<(), ApiError> {
    if target.allow_private {
        return Ok(());
    }
    let Ok(url) = url_safety::parse_outbound_url(&target.base_url) else {
        return Ok(());
    };
    let Some(url::Host::Domain(name)) = url.host() else {
        return Ok(());
    };
    let port = url.port_or_known_default().unwrap_or(443);
    let lookup = tokio::time::timeout(Duration::from_secs(2), tokio::net::lookup_host((name.to_string(), port))).await;
    let Ok(Ok(addrs)) = lookup else { return Ok(()) };
    let ips: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
    match ips.iter().find_map(|ip| url_safety::private_reason(*ip).map(|why| (ip, why))) {
        Some((ip, why)) => Err(ApiError::validation(
            "base_url",
            format!(
                "{name} resolves to {ip}, which is {why}; set allow_private: true (needs registry:write) to use it"
            ),
        )),
        None => Ok(()),
    }
}
