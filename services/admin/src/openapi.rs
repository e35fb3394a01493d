//! The OpenAPI document of the admin API, generated from the handlers. `openapi/openapi.json`
//! is this document, committed; a test fails when they differ.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api;

#[derive(OpenApi)]
#[openapi(
    info(title = "Shield Gateway admin API", description = "Control plane of Shield Gateway: tenants, targets, routes, secrets, keys, rate limits, guardrails, audit."),
    paths(
        api::ops::healthz, api::ops::readyz,
        api::login::login,
        api::tenants::create, api::tenants::list, api::tenants::get_budget, api::tenants::put_budget, api::tenants::delete_budget,
        api::targets::list, api::targets::get, api::targets::put, api::targets::delete, api::targets::reset,
        api::routes::list, api::routes::get, api::routes::put, api::routes::delete,
        api::health::get, api::simulate::simulate, api::usage::get,
        api::secrets::list, api::secrets::get, api::secrets::put, api::secrets::delete,
        api::keys::list, api::keys::create, api::keys::patch, api::keys::rotate, api::keys::revoke,
        api::limits::get, api::limits::put, api::responses::get, api::responses::put,
        api::guardrails::get, api::guardrails::put,
        api::audit::list,
        api::webhooks::list, api::webhooks::create, api::webhooks::remove, api::webhooks::deliveries,
    ),
    components(schemas(ErrorBody, ErrorDetail, shield_core::FieldError)),
    modifiers(&BearerAuth),
)]
pub struct ApiDoc;

/// Every non-2xx answer: `{"error": {"type", "message", "field"?, "errors"?}}`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct ErrorBody {
    error: ErrorDetail,
}

#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct ErrorDetail {
    /// `validation_error`, `authentication_error`, `permission_error`, `not_found`, `conflict`, …
    r#type: String,
    message: String,
    /// Validation errors: the JSON path of the first problem.
    field: Option<String>,
    errors: Option<Vec<shield_core::FieldError>>,
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build()),
        );
    }
}
