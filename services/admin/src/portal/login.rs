//! Sign-in and sign-out. The session cookie holds the admin JWT the API's login mints, for as
//! long as the token is valid; an expired one sends the user back here with a notice.

use actix_web::cookie::time;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;

use super::{
    CSRF_COOKIE, Ctx, Form, PortalError, SESSION_COOKIE, check_csrf, cookie, https, redirect, render, session,
};
use crate::AdminState;
use crate::api::login::{LoginRequest, authenticate};
use crate::error::ApiError;

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    ctx: Ctx,
    email: String,
    error: Option<String>,
    notice: Option<&'static str>,
}

#[derive(serde::Deserialize)]
pub struct LoginQuery {
    expired: Option<String>,
}

pub async fn page(req: HttpRequest, query: web::Query<LoginQuery>) -> HttpResponse {
    if session(&req).is_ok() {
        return redirect("/portal/targets");
    }
    let notice = query.expired.as_ref().map(|_| "Your session has expired. Sign in again to continue.");
    let page = LoginPage { ctx: Ctx::anonymous(&req), email: String::new(), error: None, notice };
    render(StatusCode::OK, &page.ctx, &page)
}

pub async fn submit(req: HttpRequest, state: web::Data<AdminState>, form: Form) -> Result<HttpResponse, PortalError> {
    check_csrf(&req, &form)?;
    let email = form.get("email").trim().to_string();
    let request = LoginRequest { email: email.clone(), password: form.get("password").to_string() };
    match authenticate(&state, request).await {
        Ok(login) => {
            let ttl = time::Duration::seconds(state.login_token_ttl.as_secs() as i64);
            // A new CSRF value with the new session, so one set before sign-in is not reused.
            Ok(HttpResponse::SeeOther()
                .insert_header(("Location", "/portal/targets"))
                .cookie(cookie(SESSION_COOKIE, login.token, Some(ttl), https(&req)))
                .cookie(cookie(CSRF_COOKIE, crate::random::b64url(24), None, https(&req)))
                .finish())
        }
        Err(err @ (ApiError::Unauthorized(_) | ApiError::RateLimited | ApiError::DatabaseUnavailable)) => {
            let status = actix_web::ResponseError::status_code(&err);
            let page = LoginPage { ctx: Ctx::anonymous(&req), email, error: Some(err.to_string()), notice: None };
            Ok(render(status, &page.ctx, &page))
        }
        Err(err) => Err(err.into()),
    }
}

pub async fn logout(req: HttpRequest, form: Form) -> Result<HttpResponse, PortalError> {
    check_csrf(&req, &form)?;
    let mut gone = cookie(SESSION_COOKIE, String::new(), Some(time::Duration::ZERO), https(&req));
    gone.make_removal();
    Ok(HttpResponse::SeeOther().insert_header(("Location", "/portal/login")).cookie(gone).finish())
}
