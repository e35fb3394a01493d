//! `GET /v1/tenant/me/gateway/usage?from=YYYY-MM-DD&to=YYYY-MM-DD&route=`: daily usage rows per
//! route and target, as the proxies flushed them to `gw_usage:{tenant}:{yyyymmdd}`.

use actix_web::{HttpResponse, get, web};
use chrono::NaiveDate;
use serde::{Deserialize, Serialize};
use shield_core::money::Usd;
use shield_core::records;

use super::State;
use crate::AdminState;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ApiResult};

/// Usage is kept 95 days; a query spans at most that.
const MAX_DAYS: i64 = 95;

#[derive(Deserialize, utoipa::IntoParams)]
pub struct UsageQuery {
    /// First day (UTC), default today.
    pub from: Option<String>,
    /// Last day (UTC), default today.
    pub to: Option<String>,
    pub route: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct UsageDay {
    pub date: String,
    pub route: String,
    pub target: String,
    pub calls: u64,
    pub ok: u64,
    pub errors: u64,
    pub failovers_from: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// USD.
    pub cost: f64,
    pub cost_micros: i64,
    pub latency_ms_avg: u64,
    pub estimated: u64,
    pub stream_broken: u64,
    /// Attempts that resumed a broken stream (`stream_resume`).
    pub stream_resumed: u64,
    /// Requests refused by a rate limit before routing (their row's `target` is empty); never
    /// counted in `calls`.
    pub rate_limited: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct UsageReport {
    pub rows: Vec<UsageDay>,
}

fn day(text: Option<&str>, field: &str) -> Result<NaiveDate, ApiError> {
    match text {
        None => Ok(chrono::Utc::now().date_naive()),
        Some(text) => NaiveDate::parse_from_str(text, "%Y-%m-%d")
            .map_err(|_| ApiError::validation(field, "must be a date YYYY-MM-DD")),
    }
}

#[utoipa::path(get, path = "/v1/tenant/me/gateway/usage", tag = "usage", security(("bearer" = ["tenant:read"])), params(UsageQuery),
    responses((status = 200, body = UsageReport), (status = 422), (status = 503, description = "Redis unavailable")))]
#[get("/v1/tenant/me/gateway/usage")]
pub async fn get(state: State, principal: Principal, query: web::Query<UsageQuery>) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(report(&state, &principal, &query).await?))
}

/// The daily rows for a query; shared by the API and the portal's usage page.
pub async fn report(state: &AdminState, principal: &Principal, query: &UsageQuery) -> ApiResult<UsageReport> {
    let tenant = principal.tenant(state, Scope::TenantRead).await?;
    let (from, to) = (day(query.from.as_deref(), "from")?, day(query.to.as_deref(), "to")?);
    if to < from || (to - from).num_days() >= MAX_DAYS {
        return Err(ApiError::validation("to", format!("must be on or after `from`, within {MAX_DAYS} days")));
    }
    let mut conn = state.redis.get().await.map_err(|_| ApiError::RedisUnavailable)?;
    let mut rows = Vec::new();
    let mut date = from;
    while date <= to {
        let key = state.redis_keys.usage(&tenant.slug, &date.format("%Y%m%d").to_string());
        let fields: Vec<(String, String)> =
            redis::cmd("HGETALL").arg(key).query_async(&mut conn).await.map_err(|_| ApiError::RedisUnavailable)?;
        for (field, value) in fields {
            let Some((route, target)) = records::usage::parse_field(&field) else { continue };
            if query.route.as_deref().is_some_and(|wanted| wanted != route) {
                continue;
            }
            let Some(row) = records::usage::decode(&value) else { continue };
            rows.push(UsageDay {
                date: date.format("%Y-%m-%d").to_string(),
                route: route.to_string(),
                target: target.to_string(),
                calls: row.calls,
                ok: row.ok,
                errors: row.errors,
                failovers_from: row.failovers_from,
                input_tokens: row.input_tokens,
                output_tokens: row.output_tokens,
                cost: Usd(row.cost_micros).to_decimal().parse().unwrap_or(0.0),
                cost_micros: row.cost_micros,
                latency_ms_avg: row.latency_ms_sum.checked_div(row.calls).unwrap_or(0),
                estimated: row.estimated,
                stream_broken: row.stream_broken,
                stream_resumed: row.stream_resumed,
                rate_limited: row.rate_limited,
            });
        }
        match date.succ_opt() {
            Some(next) => date = next,
            None => break,
        }
    }
    rows.sort_by(|a, b| (&a.date, &a.route, &a.target).cmp(&(&b.date, &b.route, &b.target)));
    Ok(UsageReport { rows })
}
