//! `/v1/tenant/me/guardrails`: the tenant's guardrail and tool policy (stored and published;
//! enforced by the data plane).

use actix_web::{HttpResponse, get, put};
use shield_core::guardrails::GuardrailPolicy;

use super::{Body, State, decode};
use crate::auth::{Principal, Scope};
use crate::error::ApiResult;
use crate::repo::audit::Action;
use crate::repo::config;
use crate::write::{ConfigWrite, digest_of};

#[utoipa::path(get, path = "/v1/tenant/me/guardrails", tag = "guardrails", security(("bearer" = ["tenant:read"])),
    responses((status = 200, body = GuardrailPolicy)))]
#[get("/v1/tenant/me/guardrails")]
pub async fn get(state: State, principal: Principal) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::TenantRead).await?;
    Ok(HttpResponse::Ok().json(config::guardrails(&state.db, tenant.id).await?))
}

#[utoipa::path(put, path = "/v1/tenant/me/guardrails", tag = "guardrails", security(("bearer" = ["config:write"])),
    request_body = GuardrailPolicy, responses((status = 200, body = GuardrailPolicy), (status = 422)))]
#[put("/v1/tenant/me/guardrails")]
pub async fn put(state: State, principal: Principal, body: Body) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    let policy: GuardrailPolicy = decode(&body)?;
    policy.validate()?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let before = config::guardrails(write.conn(), tenant.id).await?;
    config::put_guardrails(write.conn(), tenant.id, &policy).await?;
    write.commit(Action::GuardrailsSet, "guardrails", Some(digest_of(&before)), Some(digest_of(&policy))).await?;
    Ok(HttpResponse::Ok().json(policy))
}
