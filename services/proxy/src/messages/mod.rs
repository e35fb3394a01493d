//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: callers in Anthropic's shape
//! (Claude Code, the `anthropic` SDKs). The ingress adapter for that shape, in the order it
//! runs: loop check → authenticate (`x-api-key` or `Authorization: Bearer`, a Shield key) →
//! read the body → convert it to the normalised request ([`request`]) → the shared pipeline
//! (guardrails, rules, budgets, routing to any flavor, accounting) → render its outcome in
//! Anthropic's shape ([`response`], and [`wire`] for streams). `model` is a route name; there
//! is no default path here (its upstream speaks OpenAI's shape).

mod direct;
pub(crate) mod request;
mod response;
mod wire;

use crate::server::{Request, Response};
use serde_json::json;
use std::sync::Arc;

use crate::ProxyState;
use crate::body;
use crate::egress::Egress;
use crate::error::ProxyError;
use crate::pipeline::{Ingress, Outcome, admit, pipeline};

pub use response::proxy_error;

const INGRESS: Ingress = Ingress { stream: true, default_path: None };

pub async fn messages(
    req: Request,
    payload: crate::server::Payload,
    state: Arc<ProxyState>,
    egress: Arc<Egress>,
) -> Response {
    let result = async {
        let caller = admit(&req, &state).await?;
        let raw = body::read(payload).await?;
        let memo = crate::pipeline::schemas_memo(&state, &caller, &raw);
        let headers = request::Headers::of(req.headers());
        let request = request::normalise_remembering(&raw, headers, false, memo.as_deref())?;
        let served = pipeline(&req, caller, raw, &request, &state, &egress, INGRESS).await?;
        Ok::<_, ProxyError>(served.render(|outcome| match outcome {
            Outcome::Relayed(response) => response,
            Outcome::Stream(start) => start.respond(Box::new(wire::AnthropicWire::new(&request.model))),
            Outcome::InputBlocked { reason, .. } => response::refusal(Response::ok(), &request, &reason),
            Outcome::Routed { routed, guardrails } => response::respond(*routed, &request, guardrails),
        }))
    };
    result.await.unwrap_or_else(|err| response::proxy_error(&err))
}

/// `{input_tokens}`: the same estimate the router uses (4 characters a token of the prompt's
/// text, system included). No upstream is called.
pub async fn count_tokens(req: Request, payload: crate::server::Payload, state: Arc<ProxyState>) -> Response {
    let result = async {
        let caller = admit(&req, &state).await?;
        let raw = body::read(payload).await?;
        let request = request::normalise(&raw, request::Headers::default(), true)?;
        if !caller.key.may_use(&request.model) {
            return Err(ProxyError::PermissionDenied(request.model.clone()));
        }
        // Only a model the caller could send to: a route of its tenant (no default path here).
        let tenant = state.tenant_config(&caller.key.tenant).await.filter(|_| state.config.routing_enabled);
        if tenant.as_deref().and_then(|t| t.enabled_route(&request.model)).is_none() {
            return Err(ProxyError::ModelNotFound(request.model.clone()));
        }
        let tokens = (request.prompt_chars() as u64).div_ceil(4);
        Ok::<_, ProxyError>(Response::ok().json(json!({"input_tokens": tokens})))
    };
    result.await.unwrap_or_else(|err| response::proxy_error(&err))
}
