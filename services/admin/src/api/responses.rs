//! `/v1/tenant/me/responses`: how long the data plane keeps the tenant's stored Responses-API
//! responses (`{retention_s}`, issue 29). Stored in Postgres, published in the tenant's
//! snapshot; the proxies keep a response sent with `store: true` for this long, and keep
//! nothing when it is 0.

use actix_web::{HttpResponse, get, put};
use shield_core::snapshot::ResponseRetention;

use super::{Body, State, decode};
use crate::auth::{Principal, Scope};
use crate::error::ApiResult;
use crate::repo::audit::Action;
use crate::repo::tenants;
use crate::write::{ConfigWrite, digest_of};

#[utoipa::path(get, path = "/v1/tenant/me/responses", tag = "responses", security(("bearer" = ["tenant:read"]), ("bearer" = ["config:write"])),
    responses((status = 200, body = ResponseRetention, description = "the retention of stored responses (default 86400)")))]
#[get("/v1/tenant/me/responses")]
pub async fn get(state: State, principal: Principal) -> ApiResult<HttpResponse> {
    // API.md names `config:write` for this setting; a reader may see it too.
    let tenant = match principal.tenant(&state, Scope::ConfigWrite).await {
        Ok(tenant) => tenant,
        Err(_) => principal.tenant(&state, Scope::TenantRead).await?,
    };
    Ok(HttpResponse::Ok().json(tenants::response_retention(&state.db, tenant.id).await?))
}

#[utoipa::path(put, path = "/v1/tenant/me/responses", tag = "responses", security(("bearer" = ["config:write"])),
    request_body = ResponseRetention, responses((status = 200, body = ResponseRetention),
        (status = 422, description = "validation error naming `retention_s`")))]
#[put("/v1/tenant/me/responses")]
pub async fn put(state: State, principal: Principal, body: Body) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    let retention: ResponseRetention = decode(&body)?;
    retention.validate()?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let before = tenants::response_retention(write.conn(), tenant.id).await?;
    tenants::set_response_retention(write.conn(), tenant.id, retention).await?;
    write
        .commit(Action::ResponseRetentionSet, "responses", Some(digest_of(&before)), Some(digest_of(&retention)))
        .await?;
    Ok(HttpResponse::Ok().json(retention))
}
