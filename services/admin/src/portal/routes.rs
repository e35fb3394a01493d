//! Routes: each with its targets in order, the strategy, the rules in plain words, its rate
//! limits and the month's budget bar; edited as JSON (the API's body) with the API's errors
//! shown inline, and the limits in two inputs of their own.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use shield_core::route::{Route, Strategy};

use super::limits::{self, LimitInputs};
use super::targets::{health_label, urlencode};
use super::{Ctx, Form, PortalError, Problems, Session, check_csrf, redirect, render, usd};
use crate::AdminState;
use crate::api::health::worst_states;
use crate::api::routes::with_budget_states;
use crate::auth::Scope;
use crate::repo::config;

pub struct RouteTarget {
    pub id: String,
    pub health: String,
    pub health_label: &'static str,
}

pub struct BudgetBar {
    pub spend: String,
    pub limit: String,
    /// Shown: one decimal.
    pub percent: String,
    /// Bar width in percent, capped at 100.
    pub width: u32,
    /// ok, warn (from 80 %) or at_limit (100 %).
    pub state: String,
    pub at_limit: String,
    pub incomplete: bool,
}

pub struct RouteView {
    pub name: String,
    pub link: String,
    pub enabled: bool,
    pub strategy: &'static str,
    pub targets: Vec<RouteTarget>,
    pub rules: Vec<String>,
    /// The route's rate limits in words; empty when it has none.
    pub limits: String,
    pub budget: Option<BudgetBar>,
    pub month_spend: String,
    pub incomplete: bool,
}

#[derive(Template)]
#[template(path = "routes.html")]
struct RoutesPage {
    ctx: Ctx,
    routes: Vec<RouteView>,
    has_targets: bool,
    saved: Option<String>,
}

#[derive(serde::Deserialize)]
pub struct RouteQuery {
    saved: Option<String>,
    name: Option<String>,
}

fn strategy_label(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::Priority => "priority: in the order listed",
        Strategy::LowestLatency => "lowest latency first",
        Strategy::LowestCost => "lowest estimated cost first",
        Strategy::Weighted => "weighted random",
    }
}

pub async fn list(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    query: web::Query<RouteQuery>,
) -> Result<HttpResponse, PortalError> {
    let tenant = session.principal.tenant(&state, Scope::TenantRead).await?;
    let has_targets = config::target_count(&state.db, tenant.id).await? > 0;
    let mut routes = config::routes(&state.db, tenant.id).await?;
    with_budget_states(&state, tenant.id, &tenant.slug, &mut routes).await?;
    let health = worst_states(&state, &tenant.slug).await;
    let views = routes.iter().map(|route| view(route, &health)).collect();
    let page = RoutesPage { ctx: session.ctx(&req, "routes"), routes: views, has_targets, saved: query.saved.clone() };
    Ok(render(StatusCode::OK, &page.ctx, &page))
}

fn view(route: &Route, health: &std::collections::BTreeMap<String, String>) -> RouteView {
    let state = route.budget_state.clone().unwrap_or_default();
    let spent = state["spend_micros"].as_i64().unwrap_or(0);
    let incomplete = state["incomplete"].as_bool().unwrap_or(false);
    let budget = route.budget.as_ref().map(|budget| {
        let percent = state["percent"].as_f64().unwrap_or(0.0);
        BudgetBar {
            spend: usd(spent),
            limit: usd(budget.monthly.micros()),
            percent: format!("{percent:.1}"),
            width: percent.clamp(0.0, 100.0).round() as u32,
            // The bar's colour: at 100 % the route blocks or falls back, either way it is at the limit.
            state: match state["state"].as_str() {
                Some("ok") | None => "ok",
                Some("warn") => "warn",
                Some(_) => "at_limit",
            }
            .to_string(),
            at_limit: serde_json::to_value(budget.at_limit)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            incomplete,
        }
    });
    RouteView {
        name: route.name.clone(),
        link: urlencode(&route.name),
        enabled: route.enabled,
        strategy: strategy_label(route.strategy),
        targets: route
            .targets
            .iter()
            .map(|id| {
                let h = health.get(id).cloned().unwrap_or_else(|| "unknown".into());
                RouteTarget { id: id.clone(), health_label: health_label(&h), health: h }
            })
            .collect(),
        rules: route.rules.iter().map(|r| r.describe()).collect(),
        limits: limits::describe(&route.limits),
        budget,
        month_spend: usd(spent),
        incomplete,
    }
}

#[derive(Template)]
#[template(path = "route_form.html")]
struct RouteForm {
    ctx: Ctx,
    editing: bool,
    name: String,
    body: String,
    limits: LimitInputs,
    problems: Problems,
}

/// The fields the form shows next to their inputs (the API's paths for them).
const FORM_FIELDS: &[&str] = &["name", "limits.rpm", "limits.tpm"];

#[allow(clippy::expect_used, reason = "serialising a JSON value cannot fail")]
pub async fn new(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
) -> Result<HttpResponse, PortalError> {
    let tenant = session.principal.tenant(&state, Scope::TenantRead).await?;
    let targets: Vec<String> = config::targets(&state.db, tenant.id).await?.into_keys().take(2).collect();
    let body = serde_json::to_string_pretty(&serde_json::json!({
        "targets": targets, "strategy": "priority", "rules": [],
    }))
    .expect("JSON serialises");
    let page = RouteForm {
        ctx: session.ctx(&req, "routes"),
        editing: false,
        name: String::new(),
        body,
        limits: LimitInputs::default(),
        problems: Problems::default(),
    };
    Ok(render(StatusCode::OK, &page.ctx, &page))
}

pub async fn edit(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    query: web::Query<RouteQuery>,
) -> Result<HttpResponse, PortalError> {
    let name = query.name.clone().unwrap_or_default();
    let route = crate::api::routes::read(&state, &session.principal, &name).await?;
    let page = RouteForm {
        ctx: session.ctx(&req, "routes"),
        editing: true,
        name,
        body: editable_json(&route),
        limits: LimitInputs::of(&route.limits),
        problems: Problems::default(),
    };
    Ok(render(StatusCode::OK, &page.ctx, &page))
}

/// The route as the API takes it: without the name (it is the path), the server's fields and
/// the limits (they have inputs of their own).
fn editable_json(route: &Route) -> String {
    let mut value = serde_json::to_value(route).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        for field in ["name", "updated_at", "updated_by", "budget_state", "limits"] {
            map.remove(field);
        }
    }
    serde_json::to_string_pretty(&value).unwrap_or_default()
}

/// The editor's JSON with the limits inputs in it: when either input is filled they are the
/// route's `limits` (replacing any the JSON has); when both are empty the JSON goes as typed.
/// JSON that does not parse goes as typed too, for the API to name the problem.
fn with_limits(body: &str, limits: serde_json::Value) -> String {
    if limits.as_object().is_none_or(|l| l.is_empty()) {
        return body.to_string();
    }
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(mut route)) => {
            route.insert("limits".into(), limits);
            serde_json::Value::Object(route).to_string()
        }
        _ => body.to_string(),
    }
}

pub async fn save(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    form: Form,
) -> Result<HttpResponse, PortalError> {
    check_csrf(&req, &form)?;
    let name = form.get("name").trim().to_string();
    let body = form.get("body").to_string();
    let editing = form.get("editing") == "1";
    let inputs = LimitInputs::read(&form, "limits.");
    let mut problems = Problems::default();
    let limits = inputs.to_json("limits.", &mut problems);
    if name.is_empty() {
        problems.field("name", "required: the name callers send as model, such as smart or shield/cheap");
    }
    if problems.is_empty() {
        let sent = with_limits(&body, limits);
        match crate::api::routes::save(&state, &session.principal, &name, sent.as_bytes()).await {
            Ok(_) => return Ok(redirect(&format!("/portal/routes?saved={}", urlencode(&name)))),
            Err(err) => problems = Problems::from_api(err, FORM_FIELDS)?,
        }
    }
    let status = problems.status.unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
    let page = RouteForm { ctx: session.ctx(&req, "routes"), editing, name, body, limits: inputs, problems };
    Ok(render(status, &page.ctx, &page))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_inputs_are_the_limits_when_filled() {
        let sent = with_limits(r#"{"targets": ["a"], "limits": {"tpm": 5}}"#, json!({"rpm": 60}));
        assert_eq!(serde_json::from_str::<serde_json::Value>(&sent).unwrap()["limits"], json!({"rpm": 60}));
        let typed = r#"{"targets": ["a"], "limits": {"tpm": 5}}"#;
        assert_eq!(with_limits(typed, json!({})), typed, "both empty: the JSON as typed");
        assert_eq!(with_limits("{nope", json!({"rpm": 1})), "{nope", "broken JSON is the API's to name");
    }
}
