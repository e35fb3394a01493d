//! HTTP handlers of the admin API, one module per resource. Every handler reads the same way:
//! principal → scope → tenant (from the token) → decode → validate → transaction → publish.

pub mod audit;
pub mod guardrails;
pub mod health;
pub mod keys;
pub mod limits;
pub mod login;
pub mod ops;
pub mod responses;
pub mod routes;
pub mod secrets;
pub mod simulate;
pub mod targets;
pub mod tenants;
pub mod usage;
pub mod webhooks;

use actix_web::{HttpResponse, web};
use serde::de::DeserializeOwned;
use utoipa::OpenApi;

use crate::error::ApiError;

/// Bodies above this are refused with 413 before they are read whole.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

pub type State = web::Data<crate::AdminState>;

/// Decodes a JSON body strictly (unknown fields refused, problems named by path).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    Ok(shield_core::parse::decode(body)?)
}

/// 201 with the body when the write created the object, 200 when it replaced one.
pub fn created_or_replaced(created: bool, body: impl serde::Serialize) -> HttpResponse {
    if created { HttpResponse::Created().json(body) } else { HttpResponse::Ok().json(body) }
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    let openapi = crate::openapi::ApiDoc::openapi();
    cfg.app_data(web::PayloadConfig::new(MAX_BODY_BYTES))
        .app_data(
            web::PathConfig::default().error_handler(|err, _| ApiError::BadRequest(format!("bad path: {err}")).into()),
        )
        .app_data(
            web::QueryConfig::default()
                .error_handler(|err, _| ApiError::BadRequest(format!("bad query: {err}")).into()),
        )
        .service(ops::index)
        .service(ops::docs)
        .service(ops::healthz)
        .service(ops::readyz)
        .service(ops::metrics)
        .service(ops::openapi_json)
        .service(utoipa_swagger_ui::SwaggerUi::new("/docs/{_:.*}").url("/docs/openapi.json", openapi))
        .service(login::login)
        .service(tenants::create)
        .service(tenants::list)
        .service(tenants::get_budget)
        .service(tenants::put_budget)
        .service(tenants::delete_budget)
        .service(targets::list)
        .service(targets::get)
        .service(targets::put)
        .service(targets::delete)
        .service(targets::reset)
        .service(health::get)
        .service(usage::get)
        .service(simulate::simulate)
        .service(routes::list)
        .service(routes::get)
        .service(routes::put)
        .service(routes::delete)
        .service(secrets::list)
        .service(secrets::get)
        .service(secrets::put)
        .service(secrets::delete)
        .service(keys::list)
        .service(keys::create)
        .service(keys::patch)
        .service(keys::rotate)
        .service(keys::revoke)
        .service(limits::get)
        .service(limits::put)
        .service(responses::get)
        .service(responses::put)
        .service(guardrails::get)
        .service(guardrails::put)
        .service(audit::list)
        .service(webhooks::list)
        .service(webhooks::create)
        .service(webhooks::remove)
        .service(webhooks::deliveries)
        .default_service(web::to(|| async {
            Err::<HttpResponse, _>(ApiError::NotFound("no such endpoint; see /docs".into()))
        }));
}

/// A request body read whole, up to [`MAX_BODY_BYTES`]; a larger one is refused with 413.
pub struct Body(pub web::Bytes);

impl std::ops::Deref for Body {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl actix_web::FromRequest for Body {
    type Error = ApiError;
    type Future = futures_util::future::LocalBoxFuture<'static, Result<Body, ApiError>>;

    fn from_request(req: &actix_web::HttpRequest, payload: &mut actix_web::dev::Payload) -> Self::Future {
        let bytes = web::Bytes::from_request(req, payload);
        Box::pin(async move {
            bytes.await.map(Body).map_err(|err| match err.as_error::<actix_web::error::PayloadError>() {
                Some(actix_web::error::PayloadError::Overflow) => ApiError::PayloadTooLarge(MAX_BODY_BYTES),
                _ => ApiError::BadRequest(format!("could not read the body: {err}")),
            })
        })
    }
}
