//! The web portal under `/portal`: server-rendered pages (askama templates in `portal/`) over
//! the same functions the admin API calls, so a form and an API request get the same
//! validation, the same messages and the same audit rows.
//!
//! Session: the admin JWT from sign-in, in an HttpOnly, SameSite=Strict cookie scoped to
//! `/portal`. CSRF: every form carries the value of a second random cookie (double submit);
//! a POST whose field and cookie differ is refused. Pages set a strict Content-Security-Policy
//! (nothing but this origin: no inline script, no CDN; fonts are the system's).

mod chart;
mod form;
mod keys;
mod limits;
mod login;
mod routes;
mod simulate;
mod targets;
mod usage;

use std::future::{Ready, ready};

use actix_web::cookie::{Cookie, SameSite, time};
use actix_web::http::StatusCode;
use actix_web::middleware::DefaultHeaders;
use actix_web::{FromRequest, HttpRequest, HttpResponse, ResponseError, dev::Payload, web};
use askama::Template;

use crate::AdminState;
use crate::auth::{Principal, TokenProblem};
use crate::error::ApiError;

pub use form::Form;

const SESSION_COOKIE: &str = "shield_session";
const CSRF_COOKIE: &str = "shield_csrf";
const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope("/portal")
            .wrap(
                DefaultHeaders::new()
                    .add(("Content-Security-Policy", CSP))
                    .add(("X-Frame-Options", "DENY"))
                    .add(("X-Content-Type-Options", "nosniff"))
                    .add(("Referrer-Policy", "same-origin")),
            )
            .route("", web::get().to(home))
            .route("/", web::get().to(home))
            .route("/static/portal.css", web::get().to(stylesheet))
            .route("/static/shield.svg", web::get().to(logo))
            .route("/login", web::get().to(login::page))
            .route("/login", web::post().to(login::submit))
            .route("/logout", web::post().to(login::logout))
            .route("/targets", web::get().to(targets::list))
            .route("/targets/new", web::get().to(targets::new))
            .route("/targets/{id}/edit", web::get().to(targets::edit))
            .route("/targets", web::post().to(targets::save))
            .route("/routes", web::get().to(routes::list))
            .route("/routes/new", web::get().to(routes::new))
            .route("/routes/edit", web::get().to(routes::edit))
            .route("/routes", web::post().to(routes::save))
            .route("/keys", web::get().to(keys::list))
            .route("/keys/limits", web::post().to(keys::save_limits))
            .route("/keys/create", web::post().to(keys::create))
            .route("/keys/rotate", web::post().to(keys::rotate))
            .route("/limits", web::get().to(limits::page))
            .route("/limits", web::post().to(limits::save))
            .route("/simulate", web::get().to(simulate::page))
            .route("/simulate", web::post().to(simulate::run))
            .route("/usage", web::get().to(usage::page))
            .default_service(web::to(|| async {
                Err::<HttpResponse, _>(PortalError::from(ApiError::NotFound("no such page".into())))
            })),
    );
}

async fn home(req: HttpRequest) -> HttpResponse {
    let to = if session(&req).is_ok() { "/portal/targets" } else { "/portal/login" };
    redirect(to)
}

/// Static assets are compiled in: the binary is the whole deployment.
async fn stylesheet() -> HttpResponse {
    asset("text/css; charset=utf-8", include_str!("../../../../portal/static/portal.css"))
}

async fn logo() -> HttpResponse {
    asset("image/svg+xml", include_str!("../../../../portal/static/shield.svg"))
}

fn asset(content_type: &str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok().content_type(content_type).insert_header(("Cache-Control", "public, max-age=3600")).body(body)
}

pub(crate) fn redirect(to: &str) -> HttpResponse {
    HttpResponse::SeeOther().insert_header(("Location", to)).insert_header(("Cache-Control", "no-store")).finish()
}

/// What every page's layout needs: who is signed in, which tab is open, and the CSRF value
/// the page's forms carry.
pub struct Ctx {
    pub tenant: String,
    pub user: String,
    pub nav: &'static str,
    pub csrf: String,
    /// The CSRF cookie was missing: the response sets it.
    fresh_csrf: bool,
    https: bool,
}

impl Ctx {
    fn new(req: &HttpRequest, nav: &'static str, tenant: &str, user: &str) -> Ctx {
        let (csrf, fresh_csrf) = match req.cookie(CSRF_COOKIE).map(|c| c.value().to_string()) {
            Some(value) if value.len() >= 16 => (value, false),
            _ => (crate::random::b64url(24), true),
        };
        Ctx { tenant: tenant.into(), user: user.into(), nav, csrf, fresh_csrf, https: https(req) }
    }

    /// For pages shown before sign-in.
    fn anonymous(req: &HttpRequest) -> Ctx {
        Ctx::new(req, "", "", "")
    }

    pub fn signed_in(&self) -> bool {
        !self.user.is_empty()
    }
}

/// Renders a page with its status; sets the CSRF cookie when the request had none.
pub(crate) fn render(status: StatusCode, ctx: &Ctx, page: &impl Template) -> HttpResponse {
    let body = match page.render() {
        Ok(body) => body,
        Err(err) => {
            tracing::error!(error = %err, "portal template failed");
            return HttpResponse::InternalServerError().body("internal error");
        }
    };
    let mut response = HttpResponse::build(status);
    response.content_type("text/html; charset=utf-8").insert_header(("Cache-Control", "no-store"));
    if ctx.fresh_csrf {
        response.cookie(cookie(CSRF_COOKIE, ctx.csrf.clone(), None, ctx.https));
    }
    response.body(body)
}

/// `secure`: the request came over HTTPS (directly or, per `X-Forwarded-Proto`/`Forwarded`,
/// through a TLS-terminating proxy); the cookie is then never sent over plain HTTP.
fn cookie(name: &'static str, value: String, max_age: Option<time::Duration>, secure: bool) -> Cookie<'static> {
    let mut cookie =
        Cookie::build(name, value).path("/portal").http_only(true).same_site(SameSite::Strict).secure(secure).finish();
    if let Some(age) = max_age {
        cookie.set_max_age(age);
    }
    cookie
}

pub(crate) fn https(req: &HttpRequest) -> bool {
    req.connection_info().scheme() == "https"
}

/// A signed-in user of a tenant, from the session cookie.
pub struct Session {
    pub principal: Principal,
    pub tenant: String,
}

impl Session {
    pub fn ctx(&self, req: &HttpRequest, nav: &'static str) -> Ctx {
        Ctx::new(req, nav, &self.tenant, self.principal.actor())
    }
}

impl FromRequest for Session {
    type Error = PortalError;
    type Future = Ready<Result<Session, PortalError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(session(req))
    }
}

fn session(req: &HttpRequest) -> Result<Session, PortalError> {
    let state = req.app_data::<web::Data<AdminState>>().ok_or(PortalError::Api(ApiError::Internal))?;
    let token = req.cookie(SESSION_COOKIE).ok_or(PortalError::SignIn { expired: false })?;
    let claims = state
        .tokens
        .decode(token.value())
        .map_err(|problem| PortalError::SignIn { expired: problem == TokenProblem::Expired })?;
    let tenant = claims.tenant.clone().ok_or_else(|| {
        PortalError::Api(ApiError::Forbidden(
            "the portal is for tenant users; operators work through the API (see /docs)".into(),
        ))
    })?;
    Ok(Session { principal: Principal { claims }, tenant })
}

/// Refuses a form whose CSRF field does not match the cookie (compared in constant time).
pub(crate) fn check_csrf(req: &HttpRequest, form: &Form) -> Result<(), PortalError> {
    use subtle::ConstantTimeEq;
    let cookie = req.cookie(CSRF_COOKIE).map(|c| c.value().to_string()).unwrap_or_default();
    let field = form.get("csrf");
    if cookie.len() >= 16 && bool::from(cookie.as_bytes().ct_eq(field.as_bytes())) {
        Ok(())
    } else {
        Err(PortalError::Csrf)
    }
}

/// How a portal request fails: back to sign-in, a refused form, or the API's own error shown
/// as a page.
#[derive(Debug, thiserror::Error)]
pub enum PortalError {
    #[error("sign in")]
    SignIn { expired: bool },
    #[error("this form has expired; reload the page and try again")]
    Csrf,
    #[error(transparent)]
    Api(#[from] ApiError),
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    ctx: Ctx,
    status: u16,
    title: &'static str,
    message: String,
}

impl From<sqlx::Error> for PortalError {
    fn from(err: sqlx::Error) -> PortalError {
        PortalError::Api(err.into())
    }
}

impl ResponseError for PortalError {
    fn status_code(&self) -> StatusCode {
        match self {
            PortalError::SignIn { .. } => StatusCode::SEE_OTHER,
            PortalError::Csrf => StatusCode::FORBIDDEN,
            PortalError::Api(err) => err.status_code(),
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let PortalError::SignIn { expired } = self {
            let to = if *expired { "/portal/login?expired=1" } else { "/portal/login" };
            let mut gone = cookie(SESSION_COOKIE, String::new(), Some(time::Duration::ZERO), false);
            gone.make_removal();
            return HttpResponse::SeeOther()
                .insert_header(("Location", to))
                .insert_header(("Cache-Control", "no-store"))
                .cookie(gone)
                .finish();
        }
        let status = self.status_code();
        let title = match status {
            StatusCode::FORBIDDEN => "Not allowed",
            StatusCode::NOT_FOUND => "Not found",
            StatusCode::SERVICE_UNAVAILABLE => "Temporarily unavailable",
            _ => "Something went wrong",
        };
        let ctx = Ctx {
            tenant: String::new(),
            user: String::new(),
            nav: "",
            csrf: String::new(),
            fresh_csrf: false,
            https: false,
        };
        let page = ErrorPage { ctx, status: status.as_u16(), title, message: self.to_string() };
        render(status, &page.ctx, &page)
    }
}

/// Formats micro-dollars for people: `$0.0012`, `$12.50`.
pub(crate) fn usd(micros: i64) -> String {
    let text = shield_core::money::Usd(micros).to_decimal();
    match text.split_once('.') {
        Some((whole, frac)) if frac.len() < 2 => format!("${whole}.{frac:0<2}"),
        Some(_) => format!("${text}"),
        None => format!("${text}.00"),
    }
}

/// What a refused form shows: messages beside their fields, the rest above the form.
#[derive(Default)]
pub struct Problems {
    pub status: Option<StatusCode>,
    pub fields: Vec<shield_core::FieldError>,
    pub general: Vec<String>,
}

impl Problems {
    pub fn field(&mut self, field: &str, message: impl Into<String>) {
        self.status = Some(StatusCode::UNPROCESSABLE_ENTITY);
        self.fields.push(shield_core::FieldError::new(field, message));
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty() && self.general.is_empty()
    }

    /// The message for a form field, when there is one.
    pub fn on(&self, field: &str) -> Option<&str> {
        self.fields.iter().find(|e| e.field == field).map(|e| e.message.as_str())
    }

    /// The API's answer to a form: validation errors go to their fields (those the form does
    /// not show go above it, path included); other refusals above the form. A lost session
    /// goes back to sign-in.
    pub fn from_api(err: ApiError, shown: &[&str]) -> Result<Problems, PortalError> {
        let status = err.status_code();
        let mut problems = Problems { status: Some(status), ..Default::default() };
        match err {
            ApiError::Validation(errors) => {
                for error in errors {
                    if shown.contains(&error.field.as_str()) {
                        problems.fields.push(error);
                    } else {
                        problems.general.push(format!("{}: {}", error.field, error.message));
                    }
                }
            }
            ApiError::Unauthorized(_) => return Err(PortalError::SignIn { expired: true }),
            ApiError::Internal => return Err(PortalError::Api(err)),
            other => problems.general.push(other.to_string()),
        }
        Ok(problems)
    }
}
