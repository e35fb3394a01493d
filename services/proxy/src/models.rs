//! `GET /v1/models` and `GET /v1/models/{id}`: the tenant's route names as models, plus the
//! default upstream's models when one is configured. In OpenAI's shape, or in Anthropic's when
//! the request carries `anthropic-version` (what the Anthropic SDKs and Claude Code send):
//! `{data: [{type: "model", id, display_name, created_at}], has_more, first_id, last_id}`.
//! A route has no creation date Shield could vouch for: both shapes give the Unix epoch.

use std::time::Duration;

use crate::server::{Request, Response};
use http::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;

use crate::ProxyState;
use crate::auth::authenticate;
use crate::egress::Egress;
use crate::error::ProxyError;

/// Which shape the caller reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    OpenAi,
    Anthropic,
}

/// Whether a request to an endpoint both shapes share asks for Anthropic's (its SDKs and
/// Claude Code send `anthropic-version`).
pub fn wants_anthropic(headers: &http::header::HeaderMap) -> bool {
    headers.contains_key("anthropic-version")
}

impl Shape {
    fn of(req: &Request) -> Shape {
        if wants_anthropic(req.headers()) { Shape::Anthropic } else { Shape::OpenAi }
    }

    fn model(self, id: &str) -> Value {
        match self {
            Shape::OpenAi => json!({"id": id, "object": "model", "created": 0, "owned_by": "shield"}),
            Shape::Anthropic => {
                json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"})
            }
        }
    }

    fn error(self, err: &ProxyError) -> Response {
        match self {
            Shape::OpenAi => err.error_response(),
            Shape::Anthropic => crate::messages::proxy_error(err),
        }
    }
}

/// The ids the caller may name: enabled routes, then the default upstream's models.
async fn model_ids(req: &Request, state: &ProxyState, egress: &Egress) -> Result<Vec<String>, ProxyError> {
    let caller = authenticate(req, &state.caches).await?;
    let mut ids: Vec<String> = Vec::new();
    if state.config.routing_enabled
        && let Some(tenant) = state.tenant_config(&caller.tenant).await
    {
        ids.extend(tenant.snapshot.routes.values().filter(|r| r.enabled).map(|r| r.name.clone()));
    }
    if let Some(base) = &state.config.default_upstream {
        let url = url::Url::parse(&format!("{}/models", base.as_str().trim_end_matches('/')));
        if let Ok(url) = url
            && let Some(Value::Array(models)) =
                egress.get_json(url, Duration::from_secs(3)).await.and_then(|v| v.get("data").cloned())
        {
            ids.extend(models.iter().filter_map(|m| m.get("id").and_then(Value::as_str)).map(str::to_string));
        }
    }
    // Issue 32: a key with a route allow-list sees only what it may name (the default
    // upstream's models count as route names here).
    ids.retain(|id| caller.may_use(id));
    Ok(ids)
}

pub async fn list(req: Request, state: Arc<ProxyState>, egress: Arc<Egress>) -> Response {
    let shape = Shape::of(&req);
    let ids = match model_ids(&req, &state, &egress).await {
        Ok(ids) => ids,
        Err(err) => return shape.error(&err),
    };
    let data: Vec<Value> = ids.iter().map(|id| shape.model(id)).collect();
    let body = match shape {
        Shape::OpenAi => json!({"object": "list", "data": data}),
        Shape::Anthropic => {
            json!({"data": data, "has_more": false, "first_id": ids.first(), "last_id": ids.last()})
        }
    };
    Response::ok().json(body)
}

pub async fn get(req: Request, id: String, state: Arc<ProxyState>, egress: Arc<Egress>) -> Response {
    let shape = Shape::of(&req);
    match model_ids(&req, &state, &egress).await {
        Ok(ids) if ids.contains(&id) => Response::build(StatusCode::OK).json(shape.model(&id)),
        Ok(_) => shape.error(&ProxyError::ModelNotFound(id)),
        Err(err) => shape.error(&err),
    }
}
