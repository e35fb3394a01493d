//! `GET /v1/tenant/me/gateway/health`: the circuit view each proxy process last flushed to
//! `gw_health:{tenant}` (per process, as the data plane decides per process).

use actix_web::{HttpResponse, get};
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use shield_core::records::health::{self, HealthRecord};

use super::State;
use crate::AdminState;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ApiResult};

/// One process's view of one target (the API's view of a `gw_health` record).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TargetHealth {
    pub target: String,
    pub process: String,
    /// `closed`, `open` or `half_open`.
    pub state: String,
    pub failures: u64,
    pub last_error: Option<String>,
    /// Unix seconds of the last success.
    pub last_ok_at: Option<i64>,
    /// Unix seconds of this view.
    pub at: i64,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct HealthView {
    pub targets: Vec<TargetHealth>,
}

#[utoipa::path(get, path = "/v1/tenant/me/gateway/health", tag = "health", security(("bearer" = ["tenant:read"])),
    responses((status = 200, body = HealthView), (status = 503, description = "Redis unavailable")))]
#[get("/v1/tenant/me/gateway/health")]
pub async fn get(state: State, principal: Principal) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::TenantRead).await?;
    let mut conn = state.redis.get().await.map_err(|_| ApiError::RedisUnavailable)?;
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(state.redis_keys.health(&tenant.slug))
        .query_async(&mut conn)
        .await
        .map_err(|_| ApiError::RedisUnavailable)?;
    let mut targets: Vec<TargetHealth> = fields
        .into_iter()
        .filter_map(|(field, value)| {
            let (target, _process) = health::parse_field(&field)?;
            let record = HealthRecord::decode(&value)?;
            Some(TargetHealth {
                target: target.to_string(),
                process: record.process,
                state: record.state,
                failures: record.failures,
                last_error: record.last_error,
                last_ok_at: record.last_ok_at,
                at: record.at,
            })
        })
        .collect();
    targets.sort_by(|a, b| (&a.target, &a.process).cmp(&(&b.target, &b.process)));
    Ok(HttpResponse::Ok().json(HealthView { targets }))
}

/// Each target's worst flushed breaker state across proxy processes (best effort: empty when
/// Redis is unavailable).
pub async fn worst_states(state: &AdminState, tenant: &str) -> BTreeMap<String, String> {
    let Ok(mut conn) = state.redis.get().await else { return BTreeMap::new() };
    let fields: Vec<(String, String)> =
        redis::cmd("HGETALL").arg(state.redis_keys.health(tenant)).query_async(&mut conn).await.unwrap_or_default();
    let mut worst: BTreeMap<String, HealthRecord> = BTreeMap::new();
    for (field, value) in fields {
        let (Some((target, _)), Some(record)) = (health::parse_field(&field), HealthRecord::decode(&value)) else {
            continue;
        };
        match worst.get_mut(target) {
            Some(seen) if seen.severity() >= record.severity() => {}
            Some(seen) => *seen = record,
            None => {
                worst.insert(target.to_string(), record);
            }
        }
    }
    worst.into_iter().map(|(target, record)| (target, record.state)).collect()
}
