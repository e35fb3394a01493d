//! Operator endpoints: create and list tenants, and cap a tenant's monthly spend.

use actix_web::{HttpResponse, delete, get, post, put, web};
use serde::{Deserialize, Serialize};
use shield_core::key_access::MonthlyBudget;

use super::{Body, State, decode};
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ApiResult};
use crate::provision;
use crate::repo::audit::Action;
use crate::repo::tenants::{self, Tenant};
use crate::write::{ConfigWrite, digest_of};

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

/// The tenant a path names: its slug, else its numeric id (a slug may be all digits, and then
/// it is the slug that is meant).
async fn named_tenant(state: &crate::AdminState, id: &str) -> ApiResult<Tenant> {
    let mut found = tenants::by_slug(&state.db, id).await?;
    if found.is_none()
        && let Ok(n) = id.parse::<i64>()
    {
        found = tenants::by_id(&state.db, n).await?;
    }
    found.ok_or_else(|| ApiError::NotFound(format!("tenant {id} does not exist")))
}

#[utoipa::path(get, path = "/v1/admin/tenants/{id}/budget", tag = "operator", security(("bearer" = ["operator"])),
    params(("id" = String, Path, description = "the tenant's slug or numeric id")),
    responses((status = 200, body = Option<MonthlyBudget>, description = "the cap; `null` when there is none"), (status = 404)))]
#[get("/v1/admin/tenants/{id}/budget")]
pub async fn get_budget(state: State, principal: Principal, id: web::Path<String>) -> ApiResult<HttpResponse> {
    principal.require(Scope::Operator)?;
    let tenant = named_tenant(&state, &id).await?;
    Ok(HttpResponse::Ok().json(tenants::budget(&state.db, tenant.id).await?))
}

/// Issue 32: the SaaS operator's guard against one tenant's runaway spend, `{monthly, action}`
/// in USD a calendar month over all the tenant's routes and keys, enforced by the data plane
/// like a key budget (`block` refuses with 429 until the month ends, `warn` marks answers from
/// 80 %) and alerted once a month by the `budget_exceeded` webhook (`scope: "tenant"`). A body
/// of `null` (or `DELETE`) lifts it. Audited in the tenant's log and published at once.
#[utoipa::path(put, path = "/v1/admin/tenants/{id}/budget", tag = "operator", security(("bearer" = ["operator"])),
    params(("id" = String, Path, description = "the tenant's slug or numeric id")), request_body = Option<MonthlyBudget>,
    responses((status = 200, body = Option<MonthlyBudget>), (status = 404), (status = 422, description = "validation error naming the field, e.g. monthly")))]
#[put("/v1/admin/tenants/{id}/budget")]
pub async fn put_budget(
    state: State,
    principal: Principal,
    id: web::Path<String>,
    body: Body,
) -> ApiResult<HttpResponse> {
    principal.require(Scope::Operator)?;
    let budget: Option<MonthlyBudget> = decode(&body)?;
    if let Some(budget) = &budget {
        let mut problems = shield_core::error::Problems::default();
        budget.check(&mut problems, "budget");
        // Here the body is the budget: `budget.monthly` is `monthly`.
        problems.into_result().map_err(|errors| {
            errors
                .into_iter()
                .map(|e| shield_core::FieldError::new(e.field.trim_start_matches("budget."), e.message))
                .collect::<Vec<_>>()
        })?;
    }
    Ok(HttpResponse::Ok().json(set_budget(&state, &principal, &id, budget).await?))
}

#[utoipa::path(delete, path = "/v1/admin/tenants/{id}/budget", tag = "operator", security(("bearer" = ["operator"])),
    params(("id" = String, Path, description = "the tenant's slug or numeric id")), responses((status = 204), (status = 404)))]
#[delete("/v1/admin/tenants/{id}/budget")]
pub async fn delete_budget(state: State, principal: Principal, id: web::Path<String>) -> ApiResult<HttpResponse> {
    set_budget(&state, &principal, &id, None).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn set_budget(
    state: &crate::AdminState,
    principal: &Principal,
    id: &str,
    budget: Option<MonthlyBudget>,
) -> ApiResult<Option<MonthlyBudget>> {
    principal.require(Scope::Operator)?;
    let tenant = named_tenant(state, id).await?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let before = tenants::budget(write.conn(), tenant.id).await?;
    tenants::set_budget(write.conn(), tenant.id, budget).await?;
    let digests = (before.map(|b| digest_of(&b)), budget.map(|b| digest_of(&b)));
    write.commit(Action::TenantBudgetSet, "budget", digests.0, digests.1).await?;
    Ok(budget)
}
