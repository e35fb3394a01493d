//! `GET /v1/tenant/me/gateway/health`: the circuit view each proxy process last flushed to
//! `gw_health:{tenant}` (per process, as the data plane decides per process).

use actix_web::{HttpResponse, get};
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use super::State;
use crate::AdminState;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ApiResult};

/// One process's view of one target.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TargetHealth {
    #[serde(default)]
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
        .query_async(&mut *conn)
        .await
        .map_err(|_| ApiError::RedisUnavailable)?;
    let mut targets: Vec<TargetHealth> = fields
        .into_iter()
        .filter_map(|(field, json)| {
            let (target, _process) = field.split_once('|')?;
            let mut row: TargetHealth = serde_json::from_str(&json).ok()?;
            row.target = target.to_string();
            Some(row)
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
        redis::cmd("HGETALL").arg(state.redis_keys.health(tenant)).query_async(&mut *conn).await.unwrap_or_default();
    let rank = |s: &str| match s {
        "open" | "exhausted" => 2,
        "half_open" => 1,
        _ => 0,
    };
    let mut worst: BTreeMap<String, String> = BTreeMap::new();
    for (field, json) in fields {
        let Some((target, _)) = field.split_once('|') else { continue };
        let Some(s) = serde_json::from_str::<serde_json::Value>(&json)
            .ok()
            .and_then(|v| v.get("state")?.as_str().map(str::to_string))
        else {
            continue;
        };
        let entry = worst.entry(target.to_string()).or_insert_with(|| s.clone());
        if rank(&s) > rank(entry) {
            *entry = s;
        }
    }
    worst
}
