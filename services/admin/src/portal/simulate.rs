//! The simulator: "which model would this prompt use, and why". A plain form (no script):
//! pick a route, type a sample, choose the facts; the page shows the matched rule, every
//! candidate with its state and reasons, the order of attempts and the budget state. It runs
//! the API's simulation, which never calls a model.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;

use super::targets::{health_label, price_label};
use super::{Ctx, Form, PortalError, Problems, Session, check_csrf, render};
use crate::AdminState;
use crate::api::simulate::{SimulateRequest, Simulation, run as simulate};
use crate::auth::Scope;
use crate::repo::config;

/// The guardrails a rule can name in `when.flagged`.
const GUARDRAILS: &[(&str, &str)] = &[("pii_detection", "PII detection"), ("secrets_detection", "Secrets detection")];

#[derive(Default)]
pub struct Inputs {
    pub route: String,
    pub sample: String,
    pub flagged: Vec<String>,
    pub data_class: String,
    pub role: String,
    pub agent: String,
    pub upstream_key: bool,
}

pub struct CandidateRow {
    pub target: String,
    pub health: String,
    pub health_label: &'static str,
    pub location: String,
    pub price: String,
    /// "tried 1st", or why it is out.
    pub verdict: String,
    pub eligible: bool,
}

pub struct Outcome {
    pub rule: Option<String>,
    pub candidates: Vec<CandidateRow>,
    pub order: Vec<String>,
    pub budget_state: String,
    pub budget: String,
    pub refused: Option<String>,
}

#[derive(Template)]
#[template(path = "simulate.html")]
struct SimulatePage {
    ctx: Ctx,
    routes: Vec<String>,
    guardrails: Vec<(&'static str, &'static str, bool)>,
    inputs: Inputs,
    outcome: Option<Outcome>,
    problems: Problems,
}

pub async fn page(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
) -> Result<HttpResponse, PortalError> {
    show(&req, &state, &session, Inputs::default(), None, Problems::default()).await
}

async fn show(
    req: &HttpRequest,
    state: &AdminState,
    session: &Session,
    inputs: Inputs,
    outcome: Option<Outcome>,
    problems: Problems,
) -> Result<HttpResponse, PortalError> {
    let tenant = session.principal.tenant(state, Scope::TenantRead).await?;
    let routes = config::routes(&state.db, tenant.id).await?.into_iter().map(|r| r.name).collect();
    let guardrails =
        GUARDRAILS.iter().map(|(name, title)| (*name, *title, inputs.flagged.iter().any(|f| f == name))).collect();
    let status = problems.status.unwrap_or(StatusCode::OK);
    let page = SimulatePage { ctx: session.ctx(req, "simulate"), routes, guardrails, inputs, outcome, problems };
    Ok(render(status, &page.ctx, &page))
}

pub async fn run(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    form: Form,
) -> Result<HttpResponse, PortalError> {
    check_csrf(&req, &form)?;
    let inputs = Inputs {
        route: form.get("route").to_string(),
        sample: form.get("sample").to_string(),
        flagged: form.all("flagged").into_iter().filter(|f| GUARDRAILS.iter().any(|(g, _)| g == f)).collect(),
        data_class: form.get("data_class").trim().to_string(),
        role: form.get("role").trim().to_string(),
        agent: form.get("agent").trim().to_string(),
        upstream_key: form.checked("upstream_key"),
    };
    let mut headers = BTreeMap::new();
    if !inputs.data_class.is_empty() {
        headers.insert("X-Shield-Data-Class".to_string(), inputs.data_class.clone());
    }
    if inputs.upstream_key {
        headers.insert("X-Shield-Upstream-Key".to_string(), "present".to_string());
    }
    let request = SimulateRequest {
        messages: None,
        sample: Some(inputs.sample.clone()),
        headers,
        agent: Some(inputs.agent.clone()).filter(|a| !a.is_empty()),
        role: Some(inputs.role.clone()).filter(|r| !r.is_empty()),
        flagged: inputs.flagged.clone(),
        // The portal's simulator takes OpenAI-shaped samples; the API takes `requires_flavor`.
        requires_flavor: None,
    };
    match simulate(&state, &session.principal, &inputs.route, request).await {
        Ok(simulation) => {
            let tenant = session.principal.tenant(&state, Scope::TenantRead).await?;
            let targets = config::targets(&state.db, tenant.id).await?;
            let outcome = outcome(simulation, &targets);
            show(&req, &state, &session, inputs, Some(outcome), Problems::default()).await
        }
        Err(err) => {
            let problems = Problems::from_api(err, &[])?;
            show(&req, &state, &session, inputs, None, problems).await
        }
    }
}

fn outcome(simulation: Simulation, targets: &BTreeMap<String, shield_core::target::Target>) -> Outcome {
    let candidates = simulation
        .candidates
        .into_iter()
        .map(|c| {
            let position = simulation.order.iter().position(|t| *t == c.target);
            let verdict = match position {
                Some(i) => format!("tried {}", ordinal(i + 1)),
                None if c.rejected.is_empty() => "not tried".to_string(),
                None => c.rejected.iter().map(|r| reason(r)).collect::<Vec<_>>().join("; "),
            };
            CandidateRow {
                health_label: health_label(&c.state),
                price: targets.get(&c.target).map(price_label).unwrap_or_default(),
                location: c.location.replace('_', "-"),
                eligible: position.is_some(),
                health: c.state,
                target: c.target,
                verdict,
            }
        })
        .collect();
    let budget = match simulation.budget.limit {
        Some(limit) => format!("{} of {} this month", dollars(simulation.budget.spend), dollars(limit)),
        None => "no budget on this route".to_string(),
    };
    Outcome {
        rule: simulation.rule.and_then(|r| r["description"].as_str().map(str::to_string)),
        candidates,
        order: simulation.order,
        budget_state: simulation.budget.state,
        budget,
        refused: simulation.refused,
    }
}

/// The API's USD amounts (exact to the micro-dollar) for people.
fn dollars(amount: f64) -> String {
    super::usd((amount * 1_000_000.0).round() as i64)
}

fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// The exclusion reasons of ROUTING.md in words.
fn reason(code: &str) -> String {
    let words = match code {
        "rule" => "not among the matched rule's targets",
        "budget" => "the budget is at its limit (only fallback targets)",
        "disabled" => "the target is disabled",
        "circuit_open" => "circuit open after repeated failures",
        "exhausted" => "out of quota, cooling down",
        "envelope_mismatch" => "does not meet the route's required profile",
        "context_window" => "the prompt does not fit its context window",
        "tools_unsupported" => "does not support tools",
        "unknown_target" => "no such target",
        "credential_unavailable" => {
            "no usable credential (vault secret missing or not bound to its host, or no caller key)"
        }
        other => other,
    };
    format!("excluded: {words}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn ordinals_read_naturally() {
        let got: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22].into_iter().map(super::ordinal).collect();
        assert_eq!(got, ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd"]);
    }
}
