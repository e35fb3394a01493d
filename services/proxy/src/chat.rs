//! `POST /v1/chat/completions`, in the order it runs: loop check → authenticate → read and
//! parse the body once → resolve the tenant's route (or take the default path) → dispatch with
//! failover → respond with the routing record.

use actix_web::http::StatusCode;
use actix_web::http::header::HeaderMap as InboundHeaders;
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder, ResponseError, post, web};
use serde_json::{Value, json};

use crate::auth::authenticate;
use crate::body::{self, ChatRequest};
use crate::dispatch::{Call, Committed, HOP_HEADER, Routed, RoutedResult, dispatch, dispatch_stream};
use crate::egress::Egress;
use crate::error::{ProxyError, openai_error};
use crate::metrics::Observed;
use crate::{ProxyState, default_path};

pub const UPSTREAM_KEY_HEADER: &str = "x-shield-upstream-key";

#[post("/v1/chat/completions")]
pub async fn chat_completions(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<ProxyState>,
    egress: web::Data<Egress>,
) -> HttpResponse {
    handle(req, payload, &state, &egress).await.unwrap_or_else(|err| err.error_response())
}

async fn handle(
    req: HttpRequest,
    payload: web::Payload,
    state: &ProxyState,
    egress: &Egress,
) -> Result<HttpResponse, ProxyError> {
    let started = std::time::Instant::now();
    let hop = inbound_hop(req.headers(), state.config.max_hops)?;
    let caller = authenticate(&req, &state.caches).await?;
    let raw = body::read(payload).await?;
    let request = ChatRequest::parse(&raw)?;

    let tenant = match state.config.routing_enabled {
        true => state.tenant_config(&caller.tenant).await,
        false => None,
    };
    let Some((tenant, route)) =
        tenant.as_deref().and_then(|t| t.snapshot.routes.get(&request.model).filter(|r| r.enabled).map(|r| (t, r)))
    else {
        return default_path::forward(state, egress, &request.model, raw, hop + 1).await;
    };
    request.check_routable()?;
    let upstream_key = req.headers().get(UPSTREAM_KEY_HEADER).and_then(|v| v.to_str().ok()).filter(|k| !k.is_empty());
    let call = Call { tenant, route, request: &request, upstream_key, next_hop: hop + 1 };
    if request.stream() {
        return Ok(match dispatch_stream(egress, &state.health, call).await {
            Ok(committed) => {
                let attempts = &committed.run.attempts;
                let m = &state.metrics;
                m.routed(Observed {
                    tenant: &caller.tenant,
                    route: &committed.route,
                    target: Some(&committed.target),
                    halt: "committed",
                    attempts,
                    total: started.elapsed(),
                    stream: true,
                });
                stream_response(committed, state, &request)
            }
            Err(routed) => {
                let m = &state.metrics;
                m.routed(Observed {
                    tenant: &caller.tenant,
                    route: &routed.route,
                    target: None,
                    halt: routed.halt.as_str(),
                    attempts: &routed.attempts,
                    total: started.elapsed(),
                    stream: true,
                });
                respond(routed)
            }
        });
    }
    let routed = dispatch(egress, &state.health, call).await;
    let target = match &routed.result {
        RoutedResult::Answer { target, .. } | RoutedResult::Refused { target, .. } => Some(target.as_str()),
        RoutedResult::Unavailable => None,
    };
    state.metrics.routed(Observed {
        tenant: &caller.tenant,
        route: &routed.route,
        target,
        halt: routed.halt.as_str(),
        attempts: &routed.attempts,
        total: started.elapsed(),
        stream: false,
    });
    tracing::debug!(
        tenant = %caller.tenant, route = %routed.route, halt = routed.halt.as_str(), attempts = routed.attempts.len(),
        failovers = routed.failovers, "routed"
    );
    Ok(respond(routed))
}

/// The committed stream's response: routing headers on the head, then the relayed events.
fn stream_response(committed: Committed, state: &ProxyState, request: &ChatRequest) -> HttpResponse {
    let failovers = committed.run.attempts.iter().filter(|a| a.outcome == "failed").count();
    let mut response = HttpResponse::Ok();
    response
        .insert_header(("content-type", "text/event-stream"))
        .insert_header(("cache-control", "no-cache"))
        .insert_header(("x-accel-buffering", "no"))
        .insert_header(("x-shield-route", committed.route.as_str()))
        .insert_header(("x-shield-target", committed.target.as_str()))
        .insert_header(("x-shield-failovers", failovers.to_string()))
        .insert_header(("x-shield-budget", "ok"));
    let body = crate::relay::relay(
        committed,
        state.health.clone(),
        state.metrics.clone(),
        request.wants_usage(),
        request.prompt_chars(),
    );
    response.streaming(body)
}

/// `X-Shield-Hop` of the inbound request; at `SHIELD_MAX_HOPS` or more the call is refused.
pub fn inbound_hop(headers: &InboundHeaders, max_hops: u32) -> Result<u32, ProxyError> {
    let Some(value) = headers.get(HOP_HEADER) else {
        return Ok(0);
    };
    let hop: u32 = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| ProxyError::BadRequest("X-Shield-Hop must be a non-negative integer".into()))?;
    if hop >= max_hops { Err(ProxyError::LoopDetected(hop)) } else { Ok(hop) }
}

fn routing_record(routed: &Routed, target: Option<&str>) -> Value {
    json!({
        "route": routed.route, "target": target, "attempts": routed.attempts, "excluded": routed.excluded,
        "rule": null, "cost": null, "cost_micros": null, "halt": routed.halt, "budget": "ok",
    })
}

fn with_routing_headers(
    mut response: HttpResponseBuilder,
    routed: &Routed,
    target: Option<&str>,
) -> HttpResponseBuilder {
    response.insert_header(("x-shield-route", routed.route.as_str()));
    if let Some(target) = target {
        response.insert_header(("x-shield-target", target));
    }
    response.insert_header(("x-shield-failovers", routed.failovers.to_string()));
    response.insert_header(("x-shield-budget", "ok"));
    response
}

fn respond(mut routed: Routed) -> HttpResponse {
    match std::mem::replace(&mut routed.result, RoutedResult::Unavailable) {
        RoutedResult::Answer { target, model, mut body } => {
            // Written into the upstream's own map: the answer is not copied.
            body.insert("model".into(), Value::String(model));
            body.insert("x_shield".into(), json!({"routing": routing_record(&routed, Some(&target))}));
            with_routing_headers(HttpResponse::Ok(), &routed, Some(&target)).json(body)
        }
        RoutedResult::Refused { target, status, body } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut error = refused_error(&target, status, body.as_deref());
            error["x_shield"] = json!({"routing": routing_record(&routed, Some(&target))});
            with_routing_headers(HttpResponse::build(status), &routed, Some(&target)).json(error)
        }
        RoutedResult::Unavailable => {
            let (status, message) = unavailable_message(&routed);
            let mut error = openai_error(&message, "upstream_error", routed.halt.as_str(), Value::Null);
            error["error"]["attempts"] = json!(routed.attempts);
            error["error"]["excluded"] = json!(routed.excluded);
            error["x_shield"] = json!({"routing": routing_record(&routed, None)});
            with_routing_headers(HttpResponse::build(status), &routed, None).json(error)
        }
    }
}

/// An upstream 4xx in OpenAI error shape, naming the target. A 401/403 is the target's
/// credential problem: its text is not relayed (providers echo parts of keys there).
fn refused_error(target: &str, status: StatusCode, body: Option<&[u8]>) -> Value {
    let upstream: Value = body.and_then(|b| serde_json::from_slice(b).ok()).unwrap_or(Value::Null);
    let upstream = upstream.get("error").cloned().unwrap_or(upstream);
    let field = |key: &str| upstream.get(key).filter(|v| !v.is_null()).cloned();
    let code = status.as_u16();
    let message = if matches!(code, 401 | 403) {
        format!("target `{target}` refused the request ({code}): check the target's credential")
    } else {
        let said = field("message").and_then(|m| m.as_str().map(|s| s.chars().take(500).collect::<String>()));
        match said {
            Some(said) => format!("target `{target}` answered {code}: {said}"),
            None => format!("target `{target}` answered {code}"),
        }
    };
    let kind =
        field("type").and_then(|t| t.as_str().map(str::to_string)).unwrap_or_else(|| "invalid_request_error".into());
    let mut error = openai_error(&message, &kind, "", field("param").unwrap_or(Value::Null));
    error["error"]["code"] = field("code").unwrap_or(Value::Null);
    error
}

fn unavailable_message(routed: &Routed) -> (StatusCode, String) {
    let route = &routed.route;
    let tried = routed
        .attempts
        .iter()
        .map(|a| match (a.class, a.status) {
            (Some(class), Some(status)) => format!("{} ({} {status})", a.target, class.as_str()),
            (Some(class), None) => format!("{} ({})", a.target, class.as_str()),
            _ => a.target.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let excluded =
        routed.excluded.iter().map(|e| format!("{} ({})", e.target, e.reason.as_str())).collect::<Vec<_>>().join(", ");
    use shield_core::run::Halt;
    match routed.halt {
        Halt::Deadline => {
            (StatusCode::GATEWAY_TIMEOUT, format!("route `{route}` reached its deadline; tried: {tried}"))
        }
        Halt::NoEligibleTarget => {
            (StatusCode::BAD_GATEWAY, format!("no target of route `{route}` is eligible: {excluded}"))
        }
        Halt::AttemptBound => {
            (StatusCode::BAD_GATEWAY, format!("route `{route}` used all its attempts; tried: {tried}"))
        }
        _ => (StatusCode::BAD_GATEWAY, format!("every eligible target of route `{route}` failed: {tried}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_limits() {
        let mut headers = InboundHeaders::new();
        assert_eq!(inbound_hop(&headers, 3).unwrap(), 0);
        headers.insert(HOP_HEADER.try_into().unwrap(), "2".try_into().unwrap());
        assert_eq!(inbound_hop(&headers, 3).unwrap(), 2);
        headers.insert(HOP_HEADER.try_into().unwrap(), "3".try_into().unwrap());
        assert!(matches!(inbound_hop(&headers, 3), Err(ProxyError::LoopDetected(3))));
        headers.insert(HOP_HEADER.try_into().unwrap(), "x".try_into().unwrap());
        assert!(matches!(inbound_hop(&headers, 3), Err(ProxyError::BadRequest(_))));
    }

    #[test]
    fn refused_errors_name_the_target_and_hide_credential_text() {
        let body = br#"{"error":{"message":"Incorrect API key provided: sk-abc***xyz","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        let error = refused_error("openai-4o", StatusCode::UNAUTHORIZED, Some(body));
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("openai-4o") && !message.contains("sk-abc"), "{message}");
        let body = br#"{"error":{"message":"Unknown parameter: foo","type":"invalid_request_error","param":"foo","code":null}}"#;
        let error = refused_error("openai-4o", StatusCode::BAD_REQUEST, Some(body));
        assert_eq!(error["error"]["message"], "target `openai-4o` answered 400: Unknown parameter: foo");
        assert_eq!(error["error"]["param"], "foo");
    }
}
