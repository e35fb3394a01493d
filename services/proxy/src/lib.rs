//! shield-proxy: the data plane. A skeleton until the data-plane issue lands: it serves
//! liveness and readiness so `shield up` and docker-compose can run it, and answers every other
//! path with an OpenAI-shaped 501 so no caller mistakes it for a working gateway.

use actix_web::{App, HttpResponse, HttpServer, get, web};
use serde_json::json;

#[get("/healthz")]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

#[get("/readyz")]
async fn readyz() -> HttpResponse {
    HttpResponse::ServiceUnavailable()
        .json(json!({"status": "unavailable", "reason": "the data plane is not implemented yet"}))
}

async fn not_implemented() -> HttpResponse {
    HttpResponse::NotImplemented().json(json!({"error": {
        "message": "the Shield data plane is not implemented in this build",
        "type": "not_implemented", "code": "not_implemented", "param": null,
    }}))
}

pub async fn serve(addr: &str) -> std::io::Result<()> {
    tracing::info!(%addr, "proxy listening (skeleton)");
    HttpServer::new(|| {
        App::new()
            .service(healthz)
            .service(readyz)
            .default_service(web::to(not_implemented))
    })
    .bind(addr)?
    .run()
    .await
}
