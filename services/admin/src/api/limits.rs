//! `/v1/tenant/me/limits`: the tenant's rate-limit ceiling (issue 18), `{rpm?, tpm?}` over all
//! its keys and routes together. Stored in Postgres, published in the tenant's snapshot and
//! enforced by the data plane; the body is the limits themselves, so fields are named `rpm`
//! and `tpm`.

use actix_web::{HttpResponse, get, put};
use shield_core::FieldError;
use shield_core::limits::Limits;

use super::{Body, State, decode};
use crate::AdminState;
use crate::auth::{Principal, Scope};
use crate::error::ApiResult;
use crate::repo::audit::Action;
use crate::repo::tenants;
use crate::write::{ConfigWrite, digest_of};

#[utoipa::path(get, path = "/v1/tenant/me/limits", tag = "limits", security(("bearer" = ["tenant:read"])),
    responses((status = 200, body = Limits, description = "the tenant's limits; `{}` when it has none")))]
#[get("/v1/tenant/me/limits")]
pub async fn get(state: State, principal: Principal) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(read(&state, &principal).await?))
}

#[utoipa::path(put, path = "/v1/tenant/me/limits", tag = "limits", security(("bearer" = ["config:write"])),
    request_body = Limits, responses((status = 200, body = Limits, description = "the stored limits; `{}` clears them"),
        (status = 422, description = "validation error naming `rpm` or `tpm`")))]
#[put("/v1/tenant/me/limits")]
pub async fn put(state: State, principal: Principal, body: Body) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(save(&state, &principal, &body).await?))
}

/// The tenant's limits (the API's GET and the portal's form).
pub async fn read(state: &AdminState, principal: &Principal) -> ApiResult<Limits> {
    let tenant = principal.tenant(state, Scope::TenantRead).await?;
    Ok(tenants::limits(&state.db, tenant.id).await?)
}

/// Validates and stores the tenant's limits (a JSON body), audits the change and republishes
/// the snapshot under a new config version. Shared by the API and the portal.
pub async fn save(state: &AdminState, principal: &Principal, body: &[u8]) -> ApiResult<Limits> {
    let tenant = principal.tenant(state, Scope::ConfigWrite).await?;
    let limits: Limits = decode(body)?;
    limits.validate("limits").map_err(|errors| errors.into_iter().map(top_level).collect::<Vec<_>>())?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let before = tenants::limits(write.conn(), tenant.id).await?;
    tenants::set_limits(write.conn(), tenant.id, &limits).await?;
    write.commit(Action::TenantLimitsSet, "limits", Some(digest_of(&before)), Some(digest_of(&limits))).await?;
    Ok(limits)
}

/// `limits.rpm` → `rpm`: here the body is the limits.
fn top_level(error: FieldError) -> FieldError {
    match error.field.strip_prefix("limits.") {
        Some(field) => FieldError::new(field, error.message),
        None => error,
    }
}
