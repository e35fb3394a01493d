//! Operator endpoints: create and list tenants.

use actix_web::{HttpResponse, get, post};
use serde::{Deserialize, Serialize};

use super::{Body, State, decode};
use crate::auth::{Principal, Scope};
use crate::error::ApiResult;
use crate::provision;
use crate::repo::tenants::{self, Tenant};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    pub slug: String,
    #[serde(default)]
    pub name: String,
    pub admin_email: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TenantCreated {
    pub tenant: String,
    pub admin_email: String,
    /// Generated; shown only here.
    pub password: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TenantList {
    pub tenants: Vec<Tenant>,
}

#[utoipa::path(post, path = "/v1/admin/tenants", tag = "operator", request_body = CreateTenant, security(("bearer" = ["operator"])),
    responses((status = 201, body = TenantCreated), (status = 409, description = "slug or e-mail taken"), (status = 422, description = "invalid slug or e-mail")))]
#[post("/v1/admin/tenants")]
pub async fn create(state: State, principal: Principal, body: Body) -> ApiResult<HttpResponse> {
    principal.require(Scope::Operator)?;
    let request: CreateTenant = decode(&body)?;
    let created =
        provision::create_tenant(&state.db, &request.slug, &request.name, &request.admin_email, principal.actor())
            .await?;
    Ok(HttpResponse::Created().json(TenantCreated {
        tenant: created.tenant.slug,
        admin_email: created.admin_email,
        password: created.password,
    }))
}

#[utoipa::path(get, path = "/v1/admin/tenants", tag = "operator", security(("bearer" = ["operator"])), responses((status = 200, body = TenantList)))]
#[get("/v1/admin/tenants")]
pub async fn list(state: State, principal: Principal) -> ApiResult<HttpResponse> {
    principal.require(Scope::Operator)?;
    Ok(HttpResponse::Ok().json(TenantList { tenants: tenants::list(&state.db).await? }))
}
