//! Rate limits in the portal (issue 18): the tenant's ceiling on its own page, and the two
//! inputs (requests and tokens per minute) every limits form shares — the keys page and the
//! route editor use them too. An empty input means no limit; the API checks the rest, so a
//! form and an API call are refused with the same messages.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde_json::{Map, Value, json};
use shield_core::limits::Limits;

use super::{Ctx, Form, PortalError, Problems, Session, check_csrf, redirect, render};
use crate::AdminState;

/// The inputs' text: what is stored, or what the user typed when the form comes back.
#[derive(Default)]
pub struct LimitInputs {
    pub rpm: String,
    pub tpm: String,
}

impl LimitInputs {
    pub fn of(limits: &Limits) -> LimitInputs {
        let text = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        LimitInputs { rpm: text(limits.rpm), tpm: text(limits.tpm) }
    }

    /// The inputs named `{at}rpm` and `{at}tpm` (the JSON paths the API names errors at).
    pub fn read(form: &Form, at: &str) -> LimitInputs {
        LimitInputs {
            rpm: form.get(&format!("{at}rpm")).trim().into(),
            tpm: form.get(&format!("{at}tpm")).trim().into(),
        }
    }

    /// The `{rpm?, tpm?}` object the inputs describe (an empty input is no limit). Text that is
    /// not a whole number is reported here under `{at}rpm` / `{at}tpm`; zero and values too
    /// large are the API's to refuse.
    pub fn to_json(&self, at: &str, problems: &mut Problems) -> Value {
        let mut limits = Map::new();
        for (name, text) in [("rpm", &self.rpm), ("tpm", &self.tpm)] {
            if text.is_empty() {
                continue;
            }
            // People write 100,000 or 100 000; the separators carry no meaning.
            let digits: String = text.chars().filter(|c| !matches!(c, ',' | '_' | ' ')).collect();
            match digits.parse::<u64>() {
                Ok(n) => {
                    limits.insert(name.into(), json!(n));
                }
                Err(_) => problems.field(&format!("{at}{name}"), "a whole number above 0, or empty for no limit"),
            }
        }
        Value::Object(limits)
    }
}

/// "600 requests/min · 20000 tokens/min", or "" without limits.
pub fn describe(limits: &Limits) -> String {
    let mut parts = Vec::new();
    if let Some(rpm) = limits.rpm {
        parts.push(format!("{rpm} requests/min"));
    }
    if let Some(tpm) = limits.tpm {
        parts.push(format!("{tpm} tokens/min"));
    }
    parts.join(" · ")
}

#[derive(Template)]
#[template(path = "limits.html")]
struct LimitsPage {
    ctx: Ctx,
    v: LimitInputs,
    problems: Problems,
    saved: bool,
}

#[derive(serde::Deserialize)]
pub struct SavedQuery {
    saved: Option<String>,
}

pub async fn page(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    query: web::Query<SavedQuery>,
) -> Result<HttpResponse, PortalError> {
    let limits = crate::api::limits::read(&state, &session.principal).await?;
    let page = LimitsPage {
        ctx: session.ctx(&req, "limits"),
        v: LimitInputs::of(&limits),
        problems: Problems::default(),
        saved: query.saved.is_some(),
    };
    Ok(render(StatusCode::OK, &page.ctx, &page))
}

#[allow(clippy::expect_used, reason = "serialising a JSON value cannot fail")]
pub async fn save(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    form: Form,
) -> Result<HttpResponse, PortalError> {
    check_csrf(&req, &form)?;
    let v = LimitInputs::read(&form, "");
    let mut problems = Problems::default();
    let body = v.to_json("", &mut problems);
    if problems.is_empty() {
        let bytes = serde_json::to_vec(&body).expect("a JSON value serialises");
        match crate::api::limits::save(&state, &session.principal, &bytes).await {
            Ok(_) => return Ok(redirect("/portal/limits?saved=1")),
            Err(err) => problems = Problems::from_api(err, &["rpm", "tpm"])?,
        }
    }
    let status = problems.status.unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
    let page = LimitsPage { ctx: session.ctx(&req, "limits"), v, problems, saved: false };
    Ok(render(status, &page.ctx, &page))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_inputs_are_no_limit_and_text_is_named() {
        let mut problems = Problems::default();
        let v = LimitInputs { rpm: "1,000".into(), tpm: String::new() };
        assert_eq!(v.to_json("limits.", &mut problems), json!({"rpm": 1000}));
        assert!(problems.is_empty());
        let v = LimitInputs { rpm: "-1".into(), tpm: "1.5".into() };
        assert_eq!(v.to_json("limits.", &mut problems), json!({}));
        assert!(problems.on("limits.rpm").is_some() && problems.on("limits.tpm").is_some());
        let mut problems = Problems::default();
        let zero = LimitInputs { rpm: "0".into(), tpm: String::new() }.to_json("", &mut problems);
        assert_eq!((zero, problems.is_empty()), (json!({"rpm": 0}), true), "zero is the API's to refuse");
    }

    #[test]
    fn describes_limits_in_words() {
        assert_eq!(describe(&Limits { rpm: Some(600), tpm: Some(20_000) }), "600 requests/min · 20000 tokens/min");
        assert_eq!(describe(&Limits::default()), "");
    }
}
