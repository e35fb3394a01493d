//! `/v1/tenant/me/audit`: the tenant's audit log, newest first.

use actix_web::{HttpResponse, get, web};
use serde::{Deserialize, Serialize};

use super::State;
use crate::auth::{Principal, Scope};
use crate::error::ApiResult;
use crate::repo::audit::{self, Entry};

#[derive(Deserialize, utoipa::IntoParams)]
pub struct AuditQuery {
    /// 1-1000, default 100.
    pub limit: Option<i64>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct AuditLog {
    pub entries: Vec<Entry>,
}

#[utoipa::path(get, path = "/v1/tenant/me/audit", tag = "audit", security(("bearer" = ["tenant:read"])), params(AuditQuery),
    responses((status = 200, body = AuditLog)))]
#[get("/v1/tenant/me/audit")]
pub async fn list(state: State, principal: Principal, query: web::Query<AuditQuery>) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::TenantRead).await?;
    let limit = query.limit.unwrap_or(100).clamp(1, 1000);
    Ok(HttpResponse::Ok().json(AuditLog { entries: audit::list(&state.db, tenant.id, limit).await? }))
}
