//! `GET /v1/tenant/me/gateway/usage?from=YYYY-MM-DD&to=YYYY-MM-DD&route=`: daily usage rows per
//! route and target, as the proxies flushed them to `gw_usage:{tenant}:{yyyymmdd}`. With
//! `group_by=key` (issue 32, and `key=<id>` to pick one), daily rows per API key and route from
//! `gw_key_usage`, each request counted once, with the key's name and metadata.

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
    /// `route` (the default: per route and target) or `key` (per API key and route).
    pub group_by: Option<String>,
    /// With `group_by=key`: only this key's rows (its id).
    pub key: Option<String>,
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
    /// With `group_by=key`: the key's id, name and metadata (`target` is then empty: a key's
    /// row counts each request once, whichever targets it tried).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<std::collections::BTreeMap<String, String>>,
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
    let by_key = match query.group_by.as_deref() {
        None | Some("route") => false,
        Some("key") => true,
        Some(_) => return Err(ApiError::validation("group_by", "must be `route` or `key`")),
    };
    if query.key.is_some() && !by_key {
        return Err(ApiError::validation("key", "filters rows per key: send group_by=key with it"));
    }
    // Names and metadata of the tenant's keys, for rows per key (a key's id alone says little).
    let key_names: std::collections::HashMap<String, (String, std::collections::BTreeMap<String, String>)> = if by_key {
        crate::repo::keys::list(&state.db, tenant.id)
            .await?
            .into_iter()
            .map(|k| (k.id.to_string(), (k.name, k.metadata)))
            .collect()
    } else {
        Default::default()
    };
    let mut conn = state.redis.get().await.map_err(|_| ApiError::RedisUnavailable)?;
    let mut rows = Vec::new();
    let mut date = from;
    while date <= to {
        let day = date.format("%Y%m%d").to_string();
        let key = if by_key {
            state.redis_keys.key_usage(&tenant.slug, &day)
        } else {
            state.redis_keys.usage(&tenant.slug, &day)
        };
        let fields: Vec<(String, String)> =
            redis::cmd("HGETALL").arg(key).query_async(&mut conn).await.map_err(|_| ApiError::RedisUnavailable)?;
        for (field, value) in fields {
            let Some((first, second)) = records::usage::parse_field(&field) else { continue };
            // Per route: `route|target`; per key: `key id|route`.
            let (route, target, key_id) = if by_key { (second, "", Some(first)) } else { (first, second, None) };
            if query.route.as_deref().is_some_and(|wanted| wanted != route)
                || query.key.as_deref().is_some_and(|wanted| Some(wanted) != key_id)
            {
                continue;
            }
            let Some(row) = records::usage::decode(&value) else { continue };
            let named = key_id.and_then(|id| key_names.get(id));
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
                key_id: key_id.map(str::to_string),
                key_name: named.map(|(name, _)| name.clone()),
                metadata: named.map(|(_, metadata)| metadata.clone()),
            });
        }
        match date.succ_opt() {
            Some(next) => date = next,
            None => break,
        }
    }
    rows.sort_by(|a, b| (&a.date, &a.key_id, &a.route, &a.target).cmp(&(&b.date, &b.key_id, &b.route, &b.target)));
    Ok(UsageReport { rows })
}
