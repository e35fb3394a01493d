//! `GET /v1/models`: the tenant's route names as an OpenAI model list, plus the default
//! upstream's models when one is configured.

use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, ResponseError, get, web};
use serde_json::{Value, json};

use crate::ProxyState;
use crate::auth::authenticate;
use crate::egress::Egress;

#[get("/v1/models")]
pub async fn list(req: HttpRequest, state: web::Data<ProxyState>, egress: web::Data<Egress>) -> HttpResponse {
    let caller = match authenticate(&req, &state.caches).await {
        Ok(caller) => caller,
        Err(err) => return err.error_response(),
    };
    let mut data: Vec<Value> = Vec::new();
    if state.config.routing_enabled
        && let Some(tenant) = state.tenant_config(&caller.tenant).await
    {
        for route in tenant.snapshot.routes.values().filter(|r| r.enabled) {
            data.push(json!({"id": route.name, "object": "model", "created": 0, "owned_by": "shield"}));
        }
    }
    if let Some(base) = &state.config.default_upstream {
        let url = url::Url::parse(&format!("{}/models", base.as_str().trim_end_matches('/')));
        if let Ok(url) = url
            && let Some(Value::Array(models)) =
                egress.get_json(url, Duration::from_secs(3)).await.and_then(|v| v.get("data").cloned())
        {
            data.extend(models);
        }
    }
    HttpResponse::Ok().json(json!({"object": "list", "data": data}))
}
