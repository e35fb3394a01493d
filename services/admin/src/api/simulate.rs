//! `POST /v1/tenant/me/gateway/routes/{name}/simulate`: "which model would this prompt use,
//! and why". Runs selection steps 1–5 on the stored configuration without calling a model:
//! the matched rule, every candidate with its state and rejection reasons, the order the
//! strategy would try, and the budget state. The admin plane has no guardrail pipeline (seed
//! "As built"), so the caller names the guardrails that would flag the prompt. The answer
//! contains no prompt text and no secret.

use std::collections::{BTreeMap, BTreeSet};

use actix_web::{HttpResponse, post, web};
use serde::{Deserialize, Serialize};
use shield_core::money::Usd;
use shield_core::plan::{Facts, plan};
use shield_core::target::AuthMode;
use shield_core::url_safety;
use shield_core::usage::{BudgetState, budget_state};

use super::health::worst_states;
use super::{Body, State, decode};
use crate::AdminState;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ApiResult};
use crate::repo::{config, secrets};
use crate::write::digest_of;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SimulateRequest {
    /// Chat messages; only their length is used (prompt_tokens_over).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub messages: Option<Vec<serde_json::Value>>,
    /// A prompt sample, instead of messages.
    #[serde(default)]
    pub sample: Option<String>,
    /// Request headers as the proxy would see them (`X-Shield-Data-Class`, `X-Shield-Upstream-Key`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    /// Guardrails that would flag the prompt (e.g. `pii_detection`).
    #[serde(default)]
    pub flagged: Vec<String>,
    /// The request carries fields only this flavor's API honours (e.g. `anthropic` for a
    /// `/v1/messages` call with `thinking`, documents or server tools): other targets are
    /// excluded as `unsupported_field`.
    #[serde(default)]
    pub requires_flavor: Option<shield_core::target::Flavor>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Candidate {
    pub target: String,
    /// `disabled`, or the state the proxies flushed (`closed`, `open`, `half_open`,
    /// `exhausted`), or `unknown`.
    pub state: String,
    pub location: String,
    pub auth_mode: String,
    #[schema(value_type = Option<Object>)]
    pub price: Option<serde_json::Value>,
    pub rejected: Vec<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct BudgetView {
    pub state: String,
    /// USD spent this month (as flushed by the proxies).
    pub spend: f64,
    pub limit: Option<f64>,
    pub currency: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Simulation {
    pub route: String,
    pub config_digest: String,
    #[schema(value_type = Option<Object>)]
    pub rule: Option<serde_json::Value>,
    pub candidates: Vec<Candidate>,
    pub eligible: Vec<String>,
    pub order: Vec<String>,
    pub budget: BudgetView,
    pub refused: Option<String>,
}

#[utoipa::path(post, path = "/v1/tenant/me/gateway/routes/{name}/simulate", tag = "routes", security(("bearer" = ["config:write"])),
    params(("name" = String, Path)), request_body = SimulateRequest, responses((status = 200, body = Simulation), (status = 404)))]
#[post("/v1/tenant/me/gateway/routes/{name}/simulate")]
pub async fn simulate(
    state: State,
    principal: Principal,
    name: web::Path<String>,
    body: Body,
) -> ApiResult<HttpResponse> {
    let request: SimulateRequest = decode(&body)?;
    Ok(HttpResponse::Ok().json(run(&state, &principal, &name, request).await?))
}

/// Runs the simulation; shared by the API and the portal's simulator.
pub async fn run(
    state: &AdminState,
    principal: &Principal,
    name: &str,
    request: SimulateRequest,
) -> ApiResult<Simulation> {
    let tenant = principal.tenant(state, Scope::ConfigWrite).await?;
    let route = config::route(&state.db, tenant.id, name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("route {name:?} does not exist")))?;
    let targets = config::targets(&state.db, tenant.id).await?;
    let bindings = secrets::bindings(&state.db, tenant.id).await?;
    let header =
        |wanted: &str| request.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(wanted)).map(|(_, v)| v.clone());

    let prompt_chars: usize = match (&request.messages, &request.sample) {
        (Some(messages), _) => {
            messages.iter().filter_map(|m| m.get("content").and_then(|c| c.as_str())).map(str::len).sum()
        }
        (None, Some(sample)) => sample.len(),
        (None, None) => 0,
    };
    let vault_ready: BTreeSet<String> = targets
        .values()
        .filter(|t| t.auth.mode == AuthMode::Vault)
        .filter(|t| {
            let host = url_safety::parse_outbound_url(&t.base_url).ok().and_then(|u| url_safety::binding_host(&u));
            let bound = t.auth.secret_name().and_then(|s| bindings.get(s));
            matches!((host, bound), (Some(host), Some(bound)) if bound.iter().any(|b| b.eq_ignore_ascii_case(&host)))
        })
        .map(|t| t.id.clone())
        .collect();
    let states = worst_states(state, &tenant.slug).await;
    let in_state = |wanted: &str| states.iter().filter(|(_, s)| s.as_str() == wanted).map(|(t, _)| t.clone()).collect();
    let (circuit_open, exhausted) = (in_state("open"), in_state("exhausted"));
    let (budget, budget_state) = budget_view(state, &tenant.slug, &route).await;
    let facts = Facts {
        flagged: request.flagged.iter().cloned().collect(),
        data_class: header("x-shield-data-class"),
        agent: request.agent.clone(),
        role: request.role.clone(),
        prompt_tokens: (prompt_chars as u64).div_ceil(4),
        has_upstream_key: header("x-shield-upstream-key").is_some(),
        vault_ready,
        circuit_open,
        exhausted,
        uses_tools: false,
        max_tokens: None,
        requires_flavor: request.requires_flavor,
        latency_ms: BTreeMap::new(),
        expected_output_tokens: 256,
        budget: budget_state,
    };
    let mut rng: rand::rngs::SmallRng = rand::SeedableRng::seed_from_u64(0);
    let planned = plan(&route, &targets, &facts, &mut rng);

    let candidates = route
        .targets
        .iter()
        .map(|id| {
            let target = targets.get(id);
            Candidate {
                target: id.clone(),
                state: match target {
                    Some(t) if !t.enabled => "disabled".into(),
                    _ => states.get(id).cloned().unwrap_or_else(|| "unknown".into()),
                },
                location: target
                    .map(|t| {
                        serde_json::to_value(t.location)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default()
                    })
                    .unwrap_or_default(),
                auth_mode: target
                    .map(|t| {
                        serde_json::to_value(t.auth.mode)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default()
                    })
                    .unwrap_or_default(),
                price: target.and_then(|t| t.price.as_ref()).map(|p| serde_json::json!(p)),
                rejected: planned
                    .excluded
                    .iter()
                    .filter(|e| &e.target == id)
                    .map(|e| e.reason.as_str().to_string())
                    .collect(),
            }
        })
        .collect();
    let mut eligible = planned.order.clone();
    eligible.sort_by_key(|id| route.targets.iter().position(|t| t == id));
    Ok(Simulation {
        route: route.name.clone(),
        config_digest: digest_of(&route),
        rule: planned.rule.map(|i| serde_json::json!({"index": i, "description": route.rules[i].describe()})),
        candidates,
        eligible,
        order: planned.order,
        budget,
        refused: planned.refused.map(|(_, reason)| reason),
    })
}

/// ROUTING.md step 3 from the month's flushed spend (shield-core decides the state).
async fn budget_view(state: &AdminState, tenant: &str, route: &shield_core::route::Route) -> (BudgetView, BudgetState) {
    let spend_micros = super::routes::month_spend(state, tenant, &super::routes::this_month())
        .await
        .get(&route.name)
        .copied()
        .unwrap_or(0);
    let as_number = |u: Usd| u.to_decimal().parse::<f64>().unwrap_or(0.0);
    let budget_state = budget_state(route.budget.as_ref(), Usd(spend_micros));
    let view = BudgetView {
        state: budget_state.as_str().into(),
        spend: as_number(Usd(spend_micros)),
        limit: route.budget.as_ref().map(|b| as_number(b.monthly)),
        currency: route.budget.as_ref().map(|b| b.currency.clone()).unwrap_or_else(|| "USD".into()),
    };
    (view, budget_state)
}
