//! Targets: the table (with each target's health as the proxies flushed it) and the form.
//! The form edits the common fields and leaves the rest of a stored target (capabilities,
//! profile, extra_body, Azure settings) as it was; those are edited through the API.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde_json::{Map, Value, json};
use shield_core::target::{AuthMode, Location, Target};

use super::{Ctx, Form, PortalError, Problems, Session, check_csrf, redirect, render};
use crate::AdminState;
use crate::api::health::worst_states;
use crate::auth::Scope;
use crate::repo::{config, secrets};

pub struct TargetRow {
    pub id: String,
    pub name: String,
    /// CSS class of the health dot: closed, half_open, open, exhausted, unknown, disabled.
    pub health: String,
    pub health_label: &'static str,
    pub location: &'static str,
    pub model: String,
    pub price: String,
    pub auth: String,
    pub host: String,
}

#[derive(Template)]
#[template(path = "targets.html")]
struct TargetsPage {
    ctx: Ctx,
    rows: Vec<TargetRow>,
    saved: Option<String>,
}

#[derive(serde::Deserialize)]
pub struct ListQuery {
    saved: Option<String>,
}

pub async fn list(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, PortalError> {
    let tenant = session.principal.tenant(&state, Scope::TenantRead).await?;
    let targets = config::targets(&state.db, tenant.id).await?;
    let health = worst_states(&state, &tenant.slug).await;
    let rows = targets
        .values()
        .map(|t| {
            let state = if t.enabled {
                health.get(&t.id).cloned().unwrap_or_else(|| "unknown".into())
            } else {
                "disabled".into()
            };
            TargetRow {
                id: t.id.clone(),
                name: t.name.clone(),
                health_label: health_label(&state),
                health: state,
                location: location_label(t.location),
                model: t.model.clone(),
                price: price_label(t),
                auth: auth_label(t),
                host: url::Url::parse(&t.base_url)
                    .ok()
                    .and_then(|u| u.host_str().map(str::to_string))
                    .unwrap_or_default(),
            }
        })
        .collect();
    let page = TargetsPage { ctx: session.ctx(&req, "targets"), rows, saved: query.into_inner().saved };
    Ok(render(StatusCode::OK, &page.ctx, &page))
}

pub fn health_label(state: &str) -> &'static str {
    match state {
        "closed" => "healthy",
        "half_open" => "recovering (half-open)",
        "open" => "failing (circuit open)",
        "exhausted" => "out of quota (cooling down)",
        "disabled" => "disabled",
        _ => "no traffic yet",
    }
}

pub fn location_label(location: Location) -> &'static str {
    match location {
        Location::Cloud => "cloud",
        Location::OnPrem => "on-prem",
    }
}

pub fn price_label(target: &Target) -> String {
    match &target.price {
        Some(p) => format!(
            "{} in / {} out per 1M tokens",
            super::usd(p.input_per_mtok.micros()),
            super::usd(p.output_per_mtok.micros())
        ),
        None => "not priced".into(),
    }
}

/// The credential mode and, for vault, the secret's *name* (a reference, never its value).
fn auth_label(target: &Target) -> String {
    match target.auth.mode {
        AuthMode::Vault => format!("vault ({})", target.auth.secret_name().unwrap_or("?")),
        AuthMode::Passthrough => "caller's key (passthrough)".into(),
        AuthMode::None => "none".into(),
    }
}

/// The form's fields, named by the JSON path the API reports errors at.
#[derive(Default)]
pub struct TargetValues {
    pub id: String,
    pub name: String,
    pub base_url: String,
    /// `openai`, `azure`, `anthropic`, `gemini`, `bedrock` or `vertex`.
    pub flavor: String,
    pub model: String,
    /// Bedrock's AWS region, or Vertex's location (`us-east5`, `global`).
    pub region: String,
    /// Vertex's Google Cloud project.
    pub project: String,
    /// Vertex's model publisher (`google` or `anthropic`).
    pub publisher: String,
    pub location: String,
    pub auth_mode: String,
    pub secret_ref: String,
    pub input_price: String,
    pub output_price: String,
    pub timeout_s: String,
    pub enabled: bool,
    pub allow_private: bool,
}

const FORM_FIELDS: &[&str] = &[
    "id",
    "name",
    "base_url",
    "flavor",
    "model",
    "bedrock",
    "bedrock.region",
    "vertex",
    "vertex.publisher",
    "region",
    "project",
    "location",
    "auth.mode",
    "auth.secret_ref",
    "price.input_per_mtok",
    "price.output_per_mtok",
    "timeout_s",
    "allow_private",
];

#[derive(Template)]
#[template(path = "target_form.html")]
struct TargetForm {
    ctx: Ctx,
    editing: bool,
    v: TargetValues,
    problems: Problems,
    secret_refs: Vec<String>,
}

pub async fn new(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
) -> Result<HttpResponse, PortalError> {
    let v = TargetValues {
        flavor: "openai".into(),
        location: "cloud".into(),
        auth_mode: "vault".into(),
        timeout_s: "60".into(),
        enabled: true,
        ..Default::default()
    };
    form_page(&req, &state, &session, false, v, Problems::default()).await
}

pub async fn edit(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    id: web::Path<String>,
) -> Result<HttpResponse, PortalError> {
    let target = crate::api::targets::read(&state, &session.principal, &id).await?;
    let v = TargetValues {
        id: target.id.clone(),
        name: target.name.clone(),
        base_url: target.base_url.clone(),
        flavor: enum_text(&target.flavor),
        model: target.model.clone(),
        region: target
            .bedrock
            .as_ref()
            .and_then(|b| b.region.clone())
            .or_else(|| path_segment_after(&target.base_url, "locations"))
            .unwrap_or_default(),
        project: path_segment_after(&target.base_url, "projects").unwrap_or_default(),
        publisher: target.vertex.as_ref().map(|v| enum_text(&v.publisher)).unwrap_or_else(|| "google".into()),
        location: enum_text(&target.location),
        auth_mode: enum_text(&target.auth.mode),
        secret_ref: target.auth.secret_ref.clone().unwrap_or_default(),
        input_price: target.price.as_ref().map(|p| p.input_per_mtok.to_decimal()).unwrap_or_default(),
        output_price: target.price.as_ref().map(|p| p.output_per_mtok.to_decimal()).unwrap_or_default(),
        timeout_s: target.timeout_s.to_string(),
        enabled: target.enabled,
        allow_private: target.allow_private,
    };
    form_page(&req, &state, &session, true, v, Problems::default()).await
}

/// The path segment after `name` in a URL (`…/projects/{p}/locations/{l}`).
fn path_segment_after(url: &str, name: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    let mut segments = url.path_segments()?;
    segments.find(|s| *s == name)?;
    segments.next().filter(|s| !s.is_empty()).map(str::to_string)
}

/// Vertex AI's base URL for a project and location: the regional host, or the global one.
fn vertex_base_url(project: &str, location: &str) -> String {
    let host = match location {
        "global" => "aiplatform.googleapis.com".to_string(),
        region => format!("{region}-aiplatform.googleapis.com"),
    };
    format!("https://{host}/v1/projects/{project}/locations/{location}")
}

fn enum_text(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

async fn form_page(
    req: &HttpRequest,
    state: &AdminState,
    session: &Session,
    editing: bool,
    v: TargetValues,
    problems: Problems,
) -> Result<HttpResponse, PortalError> {
    let tenant = session.principal.tenant(state, Scope::TenantRead).await?;
    let secret_refs =
        secrets::list(&state.db, tenant.id).await?.into_iter().map(|s| format!("shield://{}", s.name)).collect();
    let status = problems.status.unwrap_or(StatusCode::OK);
    let page = TargetForm { ctx: session.ctx(req, "targets"), editing, v, problems, secret_refs };
    Ok(render(status, &page.ctx, &page))
}

#[allow(clippy::expect_used, reason = "serialising a JSON value cannot fail")]
pub async fn save(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    form: Form,
) -> Result<HttpResponse, PortalError> {
    check_csrf(&req, &form)?;
    let editing = form.get("editing") == "1";
    let v = TargetValues {
        id: form.get("id").trim().into(),
        name: form.get("name").trim().into(),
        base_url: form.get("base_url").trim().into(),
        flavor: form.get("flavor").into(),
        model: form.get("model").trim().into(),
        region: form.get("region").trim().into(),
        project: form.get("project").trim().into(),
        publisher: form.get("vertex.publisher").into(),
        location: form.get("location").into(),
        auth_mode: form.get("auth.mode").into(),
        secret_ref: form.get("auth.secret_ref").trim().into(),
        input_price: form.get("price.input_per_mtok").trim().into(),
        output_price: form.get("price.output_per_mtok").trim().into(),
        timeout_s: form.get("timeout_s").trim().into(),
        enabled: form.checked("enabled"),
        allow_private: form.checked("allow_private"),
    };
    let tenant = session.principal.tenant(&state, Scope::TenantRead).await?;
    let stored = if editing { config::target(&state.db, tenant.id, &v.id).await? } else { None };
    let (body, mut problems) = target_json(&v, stored.as_ref());
    if v.id.is_empty() {
        problems.field("id", "required: a short name such as openai-mini (letters, digits, - and _)");
    }
    if !problems.is_empty() {
        return form_page(&req, &state, &session, editing, v, problems).await;
    }
    let bytes = serde_json::to_vec(&body).expect("a JSON value serialises");
    match crate::api::targets::save(&state, &session.principal, &v.id, &bytes).await {
        Ok(_) => Ok(redirect(&format!("/portal/targets?saved={}", urlencode(&v.id)))),
        Err(err) => {
            let problems = Problems::from_api(err, FORM_FIELDS)?;
            form_page(&req, &state, &session, editing, v, problems).await
        }
    }
}

pub(crate) fn urlencode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// The API body for the form's values, on top of the stored target when editing. Problems the
/// form can see without the API (a price that is not a number) are reported here.
fn target_json(v: &TargetValues, stored: Option<&Target>) -> (Value, Problems) {
    let mut problems = Problems::default();
    let mut body = match stored.map(serde_json::to_value) {
        Some(Ok(Value::Object(map))) => map,
        _ => Map::new(),
    };
    body.remove("updated_at");
    body.remove("updated_by");
    // The form shows timeout_s but not first_byte_timeout_s: a default stays a default, so a
    // shorter timeout_s takes it along instead of tripping over it (issue 14).
    if stored.is_some_and(Target::first_byte_follows_timeout) {
        body.remove("first_byte_timeout_s");
    }
    // Likewise the flavor's defaults: a credential header and Anthropic options nobody chose
    // follow a change of flavor.
    if let Some(stored) = stored {
        let (header, scheme) = stored.flavor.default_auth();
        if stored.auth.header_and_scheme(stored.flavor) == (header, scheme)
            && let Some(Value::Object(auth)) = body.get_mut("auth")
        {
            auth.remove("header");
            auth.remove("scheme");
        }
        if stored.anthropic.as_ref().is_some_and(|a| *a == Default::default()) {
            body.remove("anthropic");
        }
    }
    body.insert("id".into(), json!(v.id));
    body.insert("name".into(), json!(v.name));
    body.insert("base_url".into(), json!(v.base_url));
    if !v.flavor.is_empty() {
        body.insert("flavor".into(), json!(v.flavor));
    }
    body.insert("model".into(), json!(v.model));
    cloud_options(v, &mut body, &mut problems);
    body.insert("location".into(), json!(v.location));
    body.insert("enabled".into(), json!(v.enabled));
    body.insert("allow_private".into(), json!(v.allow_private));
    match v.timeout_s.parse::<u32>() {
        Ok(seconds) => {
            body.insert("timeout_s".into(), json!(seconds));
        }
        Err(_) => problems.field("timeout_s", "must be a whole number of seconds"),
    }
    let mut auth = match body.remove("auth") {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    auth.insert("mode".into(), json!(v.auth_mode));
    if v.secret_ref.is_empty() {
        auth.remove("secret_ref");
    } else {
        auth.insert("secret_ref".into(), json!(v.secret_ref));
    }
    body.insert("auth".into(), Value::Object(auth));
    let currency = stored.and_then(|t| t.price.as_ref()).map_or("USD".to_string(), |p| p.currency.clone());
    match (v.input_price.as_str(), v.output_price.as_str()) {
        ("", "") => {
            body.remove("price");
        }
        (input, output) => {
            let mut number = |field: &str, text: &str| match serde_json::from_str::<serde_json::Number>(text) {
                Ok(n) => Some(n),
                Err(_) => {
                    problems.field(field, "a price in USD per million tokens, like 0.15 (or leave both prices empty)");
                    None
                }
            };
            let (input, output) = (number("price.input_per_mtok", input), number("price.output_per_mtok", output));
            if let (Some(input), Some(output)) = (input, output) {
                body.insert(
                    "price".into(),
                    json!({"input_per_mtok": input, "output_per_mtok": output, "currency": currency}),
                );
            }
        }
    }
    (Value::Object(body), problems)
}

/// The cloud flavors' options from the form: Bedrock's region (and its regional URL when the
/// base URL is left empty), Vertex's publisher (and the URL from project and location). Other
/// flavors carry neither, so a change of flavor takes them away.
fn cloud_options(v: &TargetValues, body: &mut Map<String, Value>, problems: &mut Problems) {
    body.remove("bedrock");
    body.remove("vertex");
    match v.flavor.as_str() {
        "bedrock" => {
            if !v.region.is_empty() {
                body.insert("bedrock".into(), json!({"region": v.region}));
            }
            if v.base_url.is_empty() && !v.region.is_empty() {
                body.insert("base_url".into(), json!(format!("https://bedrock-runtime.{}.amazonaws.com", v.region)));
            }
        }
        "vertex" => {
            let publisher = if v.publisher.is_empty() { "google" } else { v.publisher.as_str() };
            body.insert("vertex".into(), json!({"publisher": publisher}));
            if v.base_url.is_empty() {
                match (v.project.is_empty(), v.region.is_empty()) {
                    (false, false) => {
                        body.insert("base_url".into(), json!(vertex_base_url(&v.project, &v.region)));
                    }
                    (project_missing, region_missing) => {
                        let why = "needed to make the Vertex AI base URL (or give the base URL)";
                        if project_missing {
                            problems.field("project", why);
                        }
                        if region_missing {
                            problems.field("region", why);
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cloud_flavors_options_and_urls_come_from_region_project_and_publisher() {
        let mut v = values();
        v.flavor = "vertex".into();
        v.base_url = String::new();
        v.project = "acme".into();
        v.region = "us-east5".into();
        v.publisher = "anthropic".into();
        let (body, problems) = target_json(&v, None);
        assert!(problems.is_empty());
        assert_eq!(body["base_url"], "https://us-east5-aiplatform.googleapis.com/v1/projects/acme/locations/us-east5");
        assert_eq!(body["vertex"], json!({"publisher": "anthropic"}));
        v.region = "global".into();
        assert_eq!(
            target_json(&v, None).0["base_url"],
            "https://aiplatform.googleapis.com/v1/projects/acme/locations/global"
        );
        v.project = String::new();
        assert!(target_json(&v, None).1.on("project").is_some());
        let mut v = values();
        v.flavor = "bedrock".into();
        v.base_url = String::new();
        v.region = "eu-central-1".into();
        let (body, _) = target_json(&v, None);
        assert_eq!(body["base_url"], "https://bedrock-runtime.eu-central-1.amazonaws.com");
        assert_eq!(body["bedrock"], json!({"region": "eu-central-1"}));
        v.flavor = "openai".into();
        let stored: Target = serde_json::from_value(body).unwrap();
        let (body, _) = target_json(&v, Some(&stored));
        assert!(body.get("bedrock").is_none(), "the options go with the flavor");
        assert_eq!(path_segment_after("https://x/v1/projects/p1/locations/l1", "projects").as_deref(), Some("p1"));
    }

    fn values() -> TargetValues {
        TargetValues {
            id: "a".into(),
            base_url: "https://api.example.com/v1".into(),
            flavor: "openai".into(),
            model: "m".into(),
            location: "cloud".into(),
            auth_mode: "none".into(),
            timeout_s: "30".into(),
            enabled: true,
            ..Default::default()
        }
    }

    #[test]
    fn keeps_what_the_form_does_not_show() {
        let stored: Target = serde_json::from_value(json!({
            "id": "a", "base_url": "https://old.example.com", "model": "old",
            "capabilities": {"context_window": 8000}, "extra_body": {"provider": {"order": ["x"]}},
            "price": {"input_per_mtok": 1, "output_per_mtok": 2, "currency": "USD"}
        }))
        .unwrap();
        let (body, problems) = target_json(&values(), Some(&stored));
        assert!(problems.is_empty());
        assert_eq!(body["capabilities"]["context_window"], 8000);
        assert_eq!(body["extra_body"]["provider"]["order"][0], "x");
        assert_eq!(body["model"], "m");
        assert!(body.get("price").is_none(), "both prices emptied → unpriced");
    }

    #[test]
    fn a_default_first_byte_timeout_follows_a_shorter_timeout() {
        let stored = |first_byte: u32| -> Target {
            serde_json::from_value(json!({"id": "a", "base_url": "https://x.example.com", "model": "m",
                "timeout_s": 60, "first_byte_timeout_s": first_byte}))
            .unwrap()
        };
        let mut v = values();
        v.timeout_s = "5".into();
        let (body, _) = target_json(&v, Some(&stored(20)));
        assert!(body.get("first_byte_timeout_s").is_none(), "the default (20 for 60 s) follows: {body}");
        let (body, _) = target_json(&v, Some(&stored(7)));
        assert_eq!(body["first_byte_timeout_s"], 7, "a value someone chose is kept (and checked by the API)");
    }

    #[test]
    fn a_change_of_flavor_takes_the_flavors_defaults_along() {
        let stored: Target =
            serde_json::from_value(json!({"id": "a", "base_url": "https://x.example.com", "model": "m",
            "auth": {"mode": "vault", "secret_ref": "shield://k", "header": "Authorization", "scheme": "Bearer"}}))
            .unwrap();
        let mut v = values();
        v.flavor = "anthropic".into();
        let (body, _) = target_json(&v, Some(&stored));
        assert_eq!(body["flavor"], "anthropic");
        assert_eq!(body["auth"], json!({"mode": "none"}), "the old flavor's default header is not carried over");
        let custom: Target =
            serde_json::from_value(json!({"id": "a", "base_url": "https://x.example.com", "model": "m",
            "auth": {"mode": "none", "header": "X-Key", "scheme": ""}}))
            .unwrap();
        let (body, _) = target_json(&v, Some(&custom));
        assert_eq!(body["auth"]["header"], "X-Key", "a header someone chose is kept");
    }

    #[test]
    fn names_fields_the_form_can_check() {
        let mut v = values();
        v.input_price = "cheap".into();
        v.output_price = "0.6".into();
        v.timeout_s = "soon".into();
        let (_, problems) = target_json(&v, None);
        assert!(problems.on("price.input_per_mtok").is_some());
        assert!(problems.on("price.output_per_mtok").is_none());
        assert!(problems.on("timeout_s").is_some());
    }

    #[test]
    fn prices_are_json_numbers_the_api_reads_exactly() {
        let mut v = values();
        v.input_price = "0.15".into();
        v.output_price = "0.6".into();
        let (body, _) = target_json(&v, None);
        let target: Target = serde_json::from_value(body).unwrap();
        let price = target.price.unwrap();
        assert_eq!((price.input_per_mtok.micros(), price.output_per_mtok.micros()), (150_000, 600_000));
    }
}
