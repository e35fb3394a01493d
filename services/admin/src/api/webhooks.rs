//! `/v1/tenant/me/webhooks`: where `budget_exceeded` and `gateway_target_down` are delivered.
//! The signing secret is generated, shown once (at creation) and stored encrypted. A URL on a
//! private or loopback address needs `allow_private`, which needs `registry:write` (as for
//! targets).

use actix_web::{HttpResponse, delete, get, post, web};
use serde::{Deserialize, Serialize};
use shield_core::url_safety;
use shield_core::vault::secret_aad;
use uuid::Uuid;

use super::{Body, State, decode};
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ApiResult};
use crate::random;
use crate::repo::audit::{self, Action};
use crate::repo::webhooks::{self, Delivery, WebhookMeta};

/// The events a webhook may subscribe to: every kind the proxy writes to `gw_events`.
pub const EVENTS: [&str; 2] = shield_core::records::events::KINDS;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWebhook {
    pub url: String,
    pub events: Vec<String>,
    #[serde(default)]
    pub allow_private: bool,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct WebhookCreated {
    pub id: Uuid,
    pub url: String,
    pub events: Vec<String>,
    /// The HMAC key (its UTF-8 bytes) of `X-Shield-Signature`: shown only here.
    pub secret: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookMeta>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct DeliveryList {
    pub deliveries: Vec<Delivery>,
}

/// The AAD of a webhook's signing secret.
pub fn secret_name(id: Uuid) -> String {
    format!("webhook:{id}")
}

#[utoipa::path(get, path = "/v1/tenant/me/webhooks", tag = "webhooks", security(("bearer" = ["config:write"])), responses((status = 200, body = WebhookList)))]
#[get("/v1/tenant/me/webhooks")]
pub async fn list(state: State, principal: Principal) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    Ok(HttpResponse::Ok().json(WebhookList { webhooks: webhooks::list(&state.db, tenant.id).await? }))
}

#[utoipa::path(post, path = "/v1/tenant/me/webhooks", tag = "webhooks", security(("bearer" = ["config:write"])), request_body = CreateWebhook,
    responses((status = 201, body = WebhookCreated), (status = 403, description = "allow_private without registry:write"), (status = 422)))]
#[post("/v1/tenant/me/webhooks")]
pub async fn create(state: State, principal: Principal, body: Body) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    let request: CreateWebhook = decode(&body)?;
    if request.allow_private {
        principal.require(Scope::RegistryWrite)?;
    }
    let url = url_safety::parse_outbound_url(&request.url).map_err(|why| ApiError::validation("url", why))?;
    if let Some(why) = url_safety::url_private_reason(&url).filter(|_| !request.allow_private) {
        return Err(ApiError::validation(
            "url",
            format!("host is {why}; set allow_private: true (needs registry:write) to use it"),
        ));
    }
    if request.events.is_empty() {
        return Err(ApiError::validation("events", format!("list at least one of: {}", EVENTS.join(", "))));
    }
    for (i, event) in request.events.iter().enumerate() {
        if !EVENTS.contains(&event.as_str()) {
            return Err(ApiError::validation(
                format!("events[{i}]"),
                format!("{event:?} is not an event (one of: {})", EVENTS.join(", ")),
            ));
        }
    }
    let id = Uuid::new_v4();
    let secret = format!("whsec_{}", random::b64url(32));
    let sealed = state.keyring.seal(&secret_aad(&tenant.slug, &secret_name(id)), secret.as_bytes(), random::bytes());
    let mut tx = state.db.begin().await?;
    let meta = webhooks::insert(&mut *tx, tenant.id, id, url.as_str(), &request.events, request.allow_private, &sealed)
        .await?;
    audit::record(&mut *tx, tenant.id, principal.actor(), Action::WebhookCreated, &id.to_string(), (None, None), None)
        .await?;
    tx.commit().await?;
    Ok(HttpResponse::Created().json(WebhookCreated { id, url: meta.url, events: meta.events, secret }))
}

#[utoipa::path(delete, path = "/v1/tenant/me/webhooks/{id}", tag = "webhooks", security(("bearer" = ["config:write"])),
    params(("id" = Uuid, Path)), responses((status = 204), (status = 404)))]
#[delete("/v1/tenant/me/webhooks/{id}")]
pub async fn remove(state: State, principal: Principal, id: web::Path<String>) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    let id = parse_id(&id)?;
    let mut tx = state.db.begin().await?;
    if !webhooks::delete(&mut *tx, tenant.id, id).await? {
        return Err(not_found(id));
    }
    audit::record(&mut *tx, tenant.id, principal.actor(), Action::WebhookDeleted, &id.to_string(), (None, None), None)
        .await?;
    tx.commit().await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(get, path = "/v1/tenant/me/webhooks/{id}/deliveries", tag = "webhooks", security(("bearer" = ["config:write"])),
    params(("id" = Uuid, Path)), responses((status = 200, body = DeliveryList), (status = 404)))]
#[get("/v1/tenant/me/webhooks/{id}/deliveries")]
pub async fn deliveries(state: State, principal: Principal, id: web::Path<String>) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    let id = parse_id(&id)?;
    if !webhooks::exists(&state.db, tenant.id, id).await? {
        return Err(not_found(id));
    }
    Ok(HttpResponse::Ok().json(DeliveryList { deliveries: webhooks::deliveries(&state.db, id, 200).await? }))
}

fn parse_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|_| ApiError::NotFound(format!("webhook {text} does not exist")))
}

fn not_found(id: Uuid) -> ApiError {
    ApiError::NotFound(format!("webhook {id} does not exist"))
}
