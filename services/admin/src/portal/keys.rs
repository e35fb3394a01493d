//! Keys: the tenant's API keys (never the keys themselves: name, prefix, agent, role, dates)
//! with a form per live key for its rate limits. Keys are created and revoked through the API
//! or `shield key create`; a new key is shown once, which a page that is reloaded cannot keep.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde_json::json;

use super::limits::LimitInputs;
use super::targets::urlencode;
use super::{Ctx, Form, PortalError, Problems, Session, check_csrf, redirect, render};
use crate::AdminState;
use crate::auth::Scope;
use crate::repo::keys::{self, KeyMeta};

const FIELDS: &[&str] = &["limits.rpm", "limits.tpm"];

pub struct KeyRow {
    pub id: String,
    pub name: String,
    pub prefix: String,
    pub agent: String,
    pub role: String,
    pub created: String,
    pub revoked: Option<String>,
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
}

#[derive(serde::Deserialize)]
pub struct SavedQuery {
    saved: Option<String>,
}

fn when(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M UTC").to_string()
}

fn row(key: KeyMeta) -> KeyRow {
    KeyRow {
        id: key.id.to_string(),
        v: LimitInputs::of(&key.limits),
        created: when(&key.created_at),
        revoked: key.revoked_at.as_ref().map(when),
        name: key.name,
        prefix: key.prefix,
        agent: key.agent.unwrap_or_default(),
        role: key.role.unwrap_or_default(),
        problems: Problems::default(),
    }
}

async fn rows(state: &AdminState, session: &Session) -> Result<Vec<KeyRow>, PortalError> {
    // The API's own gate: listing keys needs config:write.
    let tenant = session.principal.tenant(state, Scope::ConfigWrite).await?;
    Ok(keys::list(&state.db, tenant.id).await?.into_iter().map(row).collect())
}

pub async fn list(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    query: web::Query<SavedQuery>,
) -> Result<HttpResponse, PortalError> {
    let rows = rows(&state, &session).await?;
    let page = KeysPage { ctx: session.ctx(&req, "keys"), rows, general: Vec::new(), saved: query.saved.clone() };
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
    let page = KeysPage { ctx: session.ctx(&req, "keys"), rows, general, saved: None };
    Ok(render(status, &page.ctx, &page))
}
