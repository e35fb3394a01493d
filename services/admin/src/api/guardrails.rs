//! `/v1/tenant/me/guardrails`: the tenant's guardrail and tool policy (stored and published;
//! enforced by the data plane).

use actix_web::{HttpResponse, get, put};
use shield_core::guardrails::GuardrailPolicy;

use super::{Body, State, decode};
use crate::auth::{Principal, Scope};
use crate::error::ApiResult;
use crate::repo::audit::{self, Action};
use crate::repo::{config, digest, tenants};

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
    let mut tx = state.db.begin().await?;
    tenants::begin_write(&mut tx, tenant.id).await?;
    let before = config::guardrails(&mut *tx, tenant.id).await?;
    config::put_guardrails(&mut *tx, tenant.id, &policy).await?;
    audit::record(
        &mut *tx,
        tenant.id,
        principal.actor(),
        Action::GuardrailsSet,
        "guardrails",
        Some(digest(&serde_json::json!(before))),
        Some(digest(&serde_json::json!(policy))),
    )
    .await?;
    tx.commit().await?;
    state.publisher.after_write(tenant.id).await;
    Ok(HttpResponse::Ok().json(policy))
}
