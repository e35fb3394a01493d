//! Keys: the tenant's API keys (never the keys themselves: name, prefix, agent, role, dates,
//! allow-list, expiry, metadata, the month's spend against the budget) with a form per live key
//! for its rate limits and a rotate button, and a form to create a key with an allow-list, a
//! budget, an expiry and metadata (issue 32). A new or rotated key's secret is shown once, on
//! the page that answers the form (never in a redirect a reload could replay).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde_json::json;

use super::limits::LimitInputs;
use super::targets::urlencode;
use super::{Ctx, Form, PortalError, Problems, Session, check_csrf, redirect, render};
use crate::AdminState;
use crate::api::keys::KeyView;
use shield_core::key_access::BudgetAction;

const FIELDS: &[&str] = &["limits.rpm", "limits.tpm"];
/// The create form's fields, as the API names them.
const CREATE_FIELDS: &[&str] = &["name", "routes", "expires_at", "budget.monthly", "budget.action", "metadata"];

pub struct KeyRow {
    pub id: String,
    pub name: String,
    pub prefix: String,
    pub agent: String,
    pub role: String,
    pub created: String,
    pub revoked: Option<String>,
    /// The allow-list, comma-separated; empty: every route.
    pub routes: String,
    pub expires: Option<String>,
    /// `owner=alice, team=ml`.
    pub metadata: String,
    /// This month's spend, USD; `None` when the store could not be read.
    pub spend: Option<String>,
    /// `5 USD, block`; empty when the key has none.
    pub budget: String,
    /// The spend as a share of the budget, 0–100 (for the bar).
    pub percent: Option<u64>,
    /// Until when the secret before the last rotation works.
    pub previous_until: Option<String>,
    pub v: LimitInputs,
    /// The refused form's messages, on the key it was for.
    pub problems: Problems,
}

#[derive(Template)]
#[template(path = "keys.html")]
struct KeysPage {
    ctx: Ctx,
    rows: Vec<KeyRow>,
    /// Refusals that belong to no row (a key that no longer exists, a missing scope).
    general: Vec<String>,
    saved: Option<String>,
    /// A key just created or rotated: `(name, secret)`, shown once.
    secret: Option<(String, String)>,
    /// The create form as sent, and its problems.
    new: NewKeyInputs,
    new_problems: Problems,
}

/// The create form's inputs, kept as typed so a refused form comes back filled in.
#[derive(Default)]
pub struct NewKeyInputs {
    pub name: String,
    pub routes: String,
    pub monthly: String,
    pub action: String,
    pub expires: String,
    pub metadata: String,
}

impl NewKeyInputs {
    fn read(form: &Form) -> NewKeyInputs {
        NewKeyInputs {
            name: form.get("name").trim().to_string(),
            routes: form.get("routes").trim().to_string(),
            monthly: form.get("budget.monthly").trim().to_string(),
            action: form.get("budget.action").trim().to_string(),
            expires: form.get("expires_at").trim().to_string(),
            metadata: form.get("metadata").trim().to_string(),
        }
    }

    /// The API's `CreateKey` body; problems the form alone can see go to their fields.
    fn to_json(&self, problems: &mut Problems) -> serde_json::Value {
        let mut body = json!({"name": self.name});
        if !self.routes.is_empty() {
            let routes: Vec<&str> = self.routes.split(',').map(str::trim).filter(|r| !r.is_empty()).collect();
            body["routes"] = json!(routes);
        }
        if !self.monthly.is_empty() {
            match self.monthly.parse::<f64>() {
                Ok(monthly) if monthly.is_finite() => {
                    let action = if self.action.is_empty() { "block" } else { self.action.as_str() };
                    body["budget"] = json!({"monthly": monthly, "action": action});
                }
                _ => problems.field("budget.monthly", "must be an amount of USD, e.g. 25 or 0.5"),
            }
        }
        if !self.expires.is_empty() {
            // `<input type="datetime-local">` sends `2026-12-31T18:00`, read as UTC.
            let text = if self.expires.len() == 16 { format!("{}:00Z", self.expires) } else { self.expires.clone() };
            body["expires_at"] = json!(text);
        }
        let mut metadata = serde_json::Map::new();
        for pair in self.metadata.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some((k, v)) => {
                    metadata.insert(k.trim().to_string(), json!(v.trim()));
                }
                None => problems.field("metadata", format!("`{pair}` is not key=value")),
            }
        }
        body["metadata"] = serde_json::Value::Object(metadata);
        body
    }
}

#[derive(serde::Deserialize)]
pub struct SavedQuery {
    saved: Option<String>,
}

fn when(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M UTC").to_string()
}

fn row(view: KeyView) -> KeyRow {
    let KeyView { meta: key, month_spend, month_spend_micros } = view;
    let budget = key.budget.map(|b| {
        let action = match b.action {
            BudgetAction::Block => "block",
            BudgetAction::Warn => "warn",
        };
        (format!("{} USD, {action}", b.monthly.to_decimal()), b.monthly.micros())
    });
    let percent = match (&budget, month_spend_micros) {
        (Some((_, limit)), Some(spent)) if *limit > 0 => Some((spent.max(0) as u64 * 100 / *limit as u64).min(100)),
        _ => None,
    };
    KeyRow {
        id: key.id.to_string(),
        v: LimitInputs::of(&key.limits),
        created: when(&key.created_at),
        revoked: key.revoked_at.as_ref().map(when),
        routes: key.routes.as_ref().map(|r| r.join(", ")).unwrap_or_default(),
        expires: key.expires_at.as_ref().map(when),
        metadata: key.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", "),
        spend: month_spend.map(|s| format!("{s}")),
        budget: budget.map(|(text, _)| text).unwrap_or_default(),
        percent,
        previous_until: key.previous_until.filter(|at| *at > chrono::Utc::now()).as_ref().map(when),
        name: key.name,
        prefix: key.prefix,
        agent: key.agent.unwrap_or_default(),
        role: key.role.unwrap_or_default(),
        problems: Problems::default(),
    }
}

async fn rows(state: &AdminState, session: &Session) -> Result<Vec<KeyRow>, PortalError> {
    // The API's own gate: listing keys needs config:write.
    Ok(crate::api::keys::views(state, &session.principal).await?.into_iter().map(row).collect())
}

fn page(ctx: Ctx, rows: Vec<KeyRow>) -> KeysPage {
    KeysPage {
        ctx,
        rows,
        general: Vec::new(),
        saved: None,
        secret: None,
        new: NewKeyInputs { action: "block".into(), ..Default::default() },
        new_problems: Problems::default(),
    }
}

/// The create form: `name`, `routes` (comma-separated), `budget.monthly`, `budget.action`,
/// `expires_at`, `metadata` (`key=value, …`). The page that answers shows the secret once.
#[allow(clippy::expect_used, reason = "serialising a JSON value cannot fail")]
pub async fn create(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    form: Form,
) -> Result<HttpResponse, PortalError> {
    check_csrf(&req, &form)?;
    let inputs = NewKeyInputs::read(&form);
    let mut problems = Problems::default();
    let body = inputs.to_json(&mut problems);
    let mut secret = None;
    if problems.is_empty() {
        let body = serde_json::to_vec(&body).expect("a JSON value serialises");
        match crate::api::keys::create_from(&state, &session.principal, &body).await {
            Ok(created) => secret = Some((created.meta.name, created.key)),
            Err(err) => problems = Problems::from_api(err, CREATE_FIELDS)?,
        }
    }
    let mut page = page(session.ctx(&req, "keys"), rows(&state, &session).await?);
    let status = if secret.is_some() {
        StatusCode::CREATED
    } else {
        problems.status.unwrap_or(StatusCode::UNPROCESSABLE_ENTITY)
    };
    if secret.is_none() {
        page.new = inputs;
        page.new_problems = problems;
    }
    page.secret = secret;
    Ok(render(status, &page.ctx, &page))
}

/// A key's rotate button: `id`, `grace_s`, and `prefix`, the prefix of the secret the page
/// showed: a reload of the answering page re-sends the form, and must not rotate again (that
/// would end the grace of the secret callers still use), so a key whose secret changed since
/// is refused. The page that answers shows the new secret once.
pub async fn rotate(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    form: Form,
) -> Result<HttpResponse, PortalError> {
    check_csrf(&req, &form)?;
    let id = form.get("id").trim().to_string();
    let grace = form.get("grace_s").trim();
    let body = format!("{{\"grace_s\": {}}}", if grace.is_empty() { "0" } else { grace });
    let shown = form.get("prefix").trim().to_string();
    let views = crate::api::keys::views(&state, &session.principal).await?;
    let current = views.iter().find(|v| v.meta.id.to_string() == id).map(|v| v.meta.prefix.clone());
    if current.as_ref().is_some_and(|prefix| *prefix != shown) {
        let mut page = page(session.ctx(&req, "keys"), views.into_iter().map(row).collect());
        page.general = vec![
            "This key was rotated since the page was shown (a reload sends the form again): nothing was changed. Rotate it again from this page if you meant to.".to_string(),
        ];
        return Ok(render(StatusCode::CONFLICT, &page.ctx, &page));
    }
    let result = crate::api::keys::rotate_key(&state, &session.principal, &id, body.as_bytes()).await;
    let (status, secret, problems) = match result {
        Ok(rotated) => (StatusCode::OK, Some((rotated.meta.name, rotated.key)), Problems::default()),
        Err(err) => {
            let problems = Problems::from_api(err, &[])?;
            (problems.status.unwrap_or(StatusCode::UNPROCESSABLE_ENTITY), None, problems)
        }
    };
    let mut page = page(session.ctx(&req, "keys"), rows(&state, &session).await?);
    page.secret = secret;
    page.general = problems.general;
    Ok(render(status, &page.ctx, &page))
}

pub async fn list(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    query: web::Query<SavedQuery>,
) -> Result<HttpResponse, PortalError> {
    let mut page = page(session.ctx(&req, "keys"), rows(&state, &session).await?);
    page.saved = query.saved.clone();
    Ok(render(StatusCode::OK, &page.ctx, &page))
}

/// One key's limits form: `id`, `limits.rpm`, `limits.tpm` (empty: no limit).
#[allow(clippy::expect_used, reason = "serialising a JSON value cannot fail")]
pub async fn save_limits(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    form: Form,
) -> Result<HttpResponse, PortalError> {
    check_csrf(&req, &form)?;
    let id = form.get("id").trim().to_string();
    let v = LimitInputs::read(&form, "limits.");
    let mut problems = Problems::default();
    let limits = v.to_json("limits.", &mut problems);
    if problems.is_empty() {
        let body = serde_json::to_vec(&json!({ "limits": limits })).expect("a JSON value serialises");
        match crate::api::keys::update(&state, &session.principal, &id, &body).await {
            Ok(key) => return Ok(redirect(&format!("/portal/keys?saved={}", urlencode(&key.name)))),
            Err(err) => problems = Problems::from_api(err, FIELDS)?,
        }
    }
    let status = problems.status.unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
    let mut rows = rows(&state, &session).await?;
    let mut general = Vec::new();
    match rows.iter_mut().find(|r| r.id == id) {
        Some(row) => {
            row.v = v;
            row.problems = problems;
        }
        None => general = problems.general,
    }
    let mut page = page(session.ctx(&req, "keys"), rows);
    page.general = general;
    Ok(render(status, &page.ctx, &page))
}
