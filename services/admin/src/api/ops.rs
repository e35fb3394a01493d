//! Liveness, readiness and the OpenAPI document.

use actix_web::{HttpResponse, get};
use serde_json::json;
use utoipa::OpenApi;

use super::State;

/// What this service is and where to go from here (the address `shield up` prints).
#[get("/")]
pub async fn index() -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "service": "shield-admin",
        "portal": "/portal",
        "docs": "/docs/",
        "openapi": "/openapi.json",
        "health": ["/healthz", "/readyz"],
    }))
}

/// API.md promises the browser at `/docs`; Swagger UI serves it under `/docs/`.
#[get("/docs")]
pub async fn docs() -> HttpResponse {
    HttpResponse::PermanentRedirect().insert_header(("location", "/docs/")).finish()
}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "alive")))]
#[get("/healthz")]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Postgres answers: the admin can serve reads and writes.
#[utoipa::path(get, path = "/readyz", tag = "ops", responses((status = 200, description = "ready"), (status = 503, description = "Postgres unreachable")))]
#[get("/readyz")]
pub async fn readyz(state: State) -> HttpResponse {
    match sqlx::query("SELECT 1").execute(&state.db).await {
        Ok(_) => HttpResponse::Ok().json(json!({"status": "ready"})),
        Err(_) => HttpResponse::ServiceUnavailable()
            .json(json!({"status": "unavailable", "reason": "Postgres is unreachable"})),
    }
}

/// Prometheus text format.
#[get("/metrics")]
pub async fn metrics(state: State) -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(state.metrics.render())
}

#[get("/openapi.json")]
pub async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok().json(crate::openapi::ApiDoc::openapi())
}
