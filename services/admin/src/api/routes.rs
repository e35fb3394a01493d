//! `/v1/tenant/me/gateway/routes`: the names callers send as `model`. A route name may
//! contain `/`, percent-encoded in the path (`shield%2Fcheap`).

use actix_web::{HttpResponse, delete, get, put, web};
use serde::Serialize;
use shield_core::MAX_ROUTES_PER_TENANT;
use shield_core::money::Usd;
use shield_core::route::Route;
use shield_core::usage::budget_state;
use shield_core::validate::validate_route;

use super::{Body, State, created_or_replaced, decode};
use crate::AdminState;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ApiResult};
use crate::repo::audit::Action;
use crate::repo::config;
use crate::write::{ConfigWrite, digest_of};

#[derive(Serialize, utoipa::ToSchema)]
pub struct RouteList {
    pub routes: Vec<Route>,
}

#[utoipa::path(get, path = "/v1/tenant/me/gateway/routes", tag = "routes", security(("bearer" = ["tenant:read"])),
    responses((status = 200, body = RouteList)))]
#[get("/v1/tenant/me/gateway/routes")]
pub async fn list(state: State, principal: Principal) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::TenantRead).await?;
    let mut routes = config::routes(&state.db, tenant.id).await?;
    with_budget_states(&state, tenant.id, &tenant.slug, &mut routes).await?;
    Ok(HttpResponse::Ok().json(RouteList { routes }))
}

#[utoipa::path(get, path = "/v1/tenant/me/gateway/routes/{name}", tag = "routes", security(("bearer" = ["tenant:read"])),
    params(("name" = String, Path, description = "percent-encoded: shield%2Fcheap")), responses((status = 200, body = Route), (status = 404)))]
#[get("/v1/tenant/me/gateway/routes/{name}")]
pub async fn get(state: State, principal: Principal, name: web::Path<String>) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::TenantRead).await?;
    let route = read(&state, &principal, &name).await?;
    let mut routes = [route];
    with_budget_states(&state, tenant.id, &tenant.slug, &mut routes).await?;
    let [route] = routes;
    Ok(HttpResponse::Ok().json(route))
}

#[utoipa::path(put, path = "/v1/tenant/me/gateway/routes/{name}", tag = "routes", security(("bearer" = ["config:write"])),
    params(("name" = String, Path)), request_body = Route,
    responses((status = 200, body = Route, description = "replaced"), (status = 201, body = Route, description = "created"),
        (status = 422, description = "validation error naming the field")))]
#[put("/v1/tenant/me/gateway/routes/{name}")]
pub async fn put(state: State, principal: Principal, name: web::Path<String>, body: Body) -> ApiResult<HttpResponse> {
    let (created, route) = save(&state, &principal, &name, &body).await?;
    Ok(created_or_replaced(created, route))
}

/// Validates and stores a route body (JSON); `true` when it was created. Shared by the API and
/// the portal's editor.
pub async fn save(state: &AdminState, principal: &Principal, name: &str, body: &[u8]) -> ApiResult<(bool, Route)> {
    let tenant = principal.tenant(state, Scope::ConfigWrite).await?;
    let mut route: Route = decode(body)?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    validate_route(name, &mut route, &config::targets(write.conn(), tenant.id).await?)?;
    let before = config::route(write.conn(), tenant.id, name).await?;
    if before.is_none() && config::route_count(write.conn(), tenant.id).await? >= MAX_ROUTES_PER_TENANT as i64 {
        return Err(ApiError::validation("name", format!("a tenant has at most {MAX_ROUTES_PER_TENANT} routes")));
    }
    route.updated_at = chrono::Utc::now().timestamp();
    route.updated_by = principal.actor().to_string();
    route.budget_state = None;
    let created = config::put_route(write.conn(), tenant.id, &route).await?;
    write.commit(Action::RouteSet, name, before.as_ref().map(digest_of), Some(digest_of(&route))).await?;
    Ok((created, route))
}

#[utoipa::path(delete, path = "/v1/tenant/me/gateway/routes/{name}", tag = "routes", security(("bearer" = ["config:write"])),
    params(("name" = String, Path)), responses((status = 204), (status = 404)))]
#[delete("/v1/tenant/me/gateway/routes/{name}")]
pub async fn delete(state: State, principal: Principal, name: web::Path<String>) -> ApiResult<HttpResponse> {
    let name = name.into_inner();
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let before = config::route(write.conn(), tenant.id, &name).await?.ok_or_else(|| not_found(&name))?;
    config::delete_route(write.conn(), tenant.id, &name).await?;
    write.commit(Action::RouteDeleted, &name, Some(digest_of(&before)), None).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Fills each route's read-only `budget_state`: this month's flushed spend, the limit, the
/// percentage, the state (ROUTING.md step 3) and whether spend is incomplete (a listed target
/// has no price, so its calls count as 0). Spend reads as 0 when Redis is unavailable.
pub async fn with_budget_states(
    state: &AdminState,
    tenant_id: i64,
    tenant: &str,
    routes: &mut [Route],
) -> Result<(), ApiError> {
    let targets = config::targets(&state.db, tenant_id).await?;
    let month = this_month();
    let spend = month_spend(state, tenant, &month).await;
    let usd = |micros: i64| Usd(micros).to_decimal().parse::<f64>().unwrap_or(0.0);
    for route in routes.iter_mut() {
        let spent = spend.get(&route.name).copied().unwrap_or(0);
        let limit = route.budget.as_ref().map(|b| b.monthly.micros());
        let incomplete = route.targets.iter().any(|id| targets.get(id).is_none_or(|t| t.price.is_none()));
        let percent = limit.filter(|l| *l > 0).map(|l| ((spent as f64) * 10_000.0 / (l as f64)).round() / 100.0);
        route.budget_state = Some(serde_json::json!({
            "spend": usd(spent), "spend_micros": spent, "limit": limit.map(usd), "percent": percent,
            "state": budget_state(route.budget.as_ref(), Usd(spent)).as_str(), "incomplete": incomplete, "month": month,
        }));
    }
    Ok(())
}

/// One route of the principal's tenant (the API's GET and the portal's editor).
pub async fn read(state: &AdminState, principal: &Principal, name: &str) -> ApiResult<Route> {
    let tenant = principal.tenant(state, Scope::TenantRead).await?;
    config::route(&state.db, tenant.id, name).await?.ok_or_else(|| not_found(name))
}

fn not_found(name: &str) -> ApiError {
    ApiError::NotFound(format!("route {name:?} does not exist"))
}

/// The current UTC month, `yyyymm` (the `gw_spend` key's suffix).
pub fn this_month() -> String {
    chrono::Utc::now().format("%Y%m").to_string()
}

/// A month's flushed spend by route in micro-USD (`gw_spend`; empty when Redis is
/// unavailable). The one place the admin reads it: route reads, simulate and the portal.
pub async fn month_spend(state: &AdminState, tenant: &str, month: &str) -> std::collections::HashMap<String, i64> {
    let Ok(mut conn) = state.redis.get().await else { return Default::default() };
    redis::cmd("HGETALL")
        .arg(state.redis_keys.spend(tenant, month))
        .query_async::<Vec<(String, String)>>(&mut conn)
        .await
        .map(shield_core::records::spend::decode)
        .unwrap_or_default()
}
