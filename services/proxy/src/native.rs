//! `POST /v1/shield/chat/completions`: Shield's native shape (API.md). Request `{model,
//! messages}` or `{model, prompt, system?}`; response `{id, model, content, finish_reason,
//! usage, guardrail_results, routing}`; refusals (guardrails, deny rules, tool RBAC) are 403
//! `{error, guardrail_results, routing}`; every target failed is 502 (deadline 504). The same
//! request path as every endpoint ([`crate::pipeline`]); it does not stream.

use crate::server::{Request, Response};
use http::StatusCode;
use serde_json::{Map, Value, json};
use shield_core::exchange::Stop;
use std::sync::Arc;

use crate::ProxyState;
use crate::body::{self, ChatRequest};
use crate::dispatch::RoutedResult;
use crate::egress::Egress;
use crate::error::ProxyError;
use crate::pipeline::{Ingress, Outcome, admit, pipeline, with_routing_headers};
use crate::x_shield::routing_record;

pub async fn chat(
    req: Request,
    payload: crate::server::Payload,
    state: Arc<ProxyState>,
    egress: Arc<Egress>,
) -> Response {
    let result = async {
        let caller = admit(&req, &state).await?;
        let raw = body::read(payload).await?;
        let fields = native_to_messages(&raw)?;
        let raw = bytes::Bytes::from(serde_json::to_vec(&fields).unwrap_or_default());
        let request = ChatRequest::parse_shared(&raw)?;
        let served = pipeline(&req, caller, raw.clone(), &request, &state, &egress, INGRESS).await?;
        Ok::<_, ProxyError>(served.render(render))
    };
    result.await.unwrap_or_else(|err| err.error_response())
}

/// `{model, prompt, system?}` becomes `{model, messages}`; a body with `messages` is kept.
fn native_to_messages(raw: &[u8]) -> Result<Map<String, Value>, ProxyError> {
    let value: Value =
        serde_json::from_slice(raw).map_err(|e| ProxyError::BadRequest(format!("malformed JSON body: {e}")))?;
    let Value::Object(mut fields) = value else {
        return Err(ProxyError::BadRequest("the body must be a JSON object".into()));
    };
    if !fields.contains_key("messages") {
        let prompt = match fields.remove("prompt") {
            Some(Value::String(prompt)) => prompt,
            _ => {
                return Err(ProxyError::BadRequest(
                    "send `messages`, or `prompt` (a string) with an optional `system`".into(),
                ));
            }
        };
        let mut messages = Vec::new();
        if let Some(Value::String(system)) = fields.remove("system") {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        fields.insert("messages".into(), Value::Array(messages));
    }
    Ok(fields)
}

/// API.md's `finish_reason` values (the Chat Completions words this shape was defined with).
fn finish_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn => "stop",
        Stop::MaxTokens => "length",
        Stop::ToolUse => "tool_calls",
        Stop::Refusal => "content_filter",
    }
}

/// The Shield-native endpoint does not stream; unrouted models take the default path.
const INGRESS: Ingress = Ingress { stream: false, default_path: Some("chat/completions") };

fn render(outcome: Outcome) -> Response {
    match outcome {
        Outcome::Relayed(response) => response,
        // Not reached: the pipeline refuses `stream: true` for this endpoint.
        Outcome::Stream(_) => {
            Response::build(StatusCode::BAD_REQUEST).json(json!({"error": "this endpoint does not stream"}))
        }
        Outcome::InputBlocked { reason, guardrails } => Response::build(StatusCode::FORBIDDEN).json(
            json!({"error": reason, "guardrail_results": guardrails, "routing": {"reason": reason, "halt": "denied"}}),
        ),
        Outcome::Routed { mut routed, guardrails } => {
            let result = std::mem::replace(&mut routed.result, RoutedResult::Unavailable);
            let target = match &result {
                RoutedResult::Answer { target, .. } | RoutedResult::Refused { target, .. } => Some(target.clone()),
                RoutedResult::Refusal { target, .. } => target.clone(),
                RoutedResult::Unavailable => None,
            };
            let (status, body) = match result {
                RoutedResult::Answer { model, body, usage, .. } => {
                    // API.md: the answer's text (null when it only calls tools), the stop in
                    // Chat Completions' words, the usage as counted.
                    let answer = &body.answer;
                    let has_text = answer.blocks.iter().any(|b| matches!(b, shield_core::exchange::Block::Text(_)));
                    let answer = json!({
                        "id": answer.id, "model": model,
                        "content": if has_text { Value::String(answer.visible_text()) } else { Value::Null },
                        "finish_reason": answer.stop.map(finish_reason),
                        "usage": usage.map(|u| json!({"prompt_tokens": u.input, "completion_tokens": u.output,
                            "total_tokens": u.input + u.output})),
                    });
                    (StatusCode::OK, answer)
                }
                RoutedResult::Refusal { reason, target } => {
                    routed.result = RoutedResult::Refusal { reason: reason.clone(), target };
                    (StatusCode::FORBIDDEN, json!({"error": reason}))
                }
                RoutedResult::Refused { target, status, .. } => {
                    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
                    (status, json!({"error": format!("target `{target}` answered {}", status.as_u16())}))
                }
                RoutedResult::Unavailable => {
                    let status = if routed.halt == shield_core::run::Halt::Deadline {
                        StatusCode::GATEWAY_TIMEOUT
                    } else {
                        StatusCode::BAD_GATEWAY
                    };
                    (
                        status,
                        json!({"error": format!("no target of route `{}` answered ({})", routed.route, routed.halt.as_str())}),
                    )
                }
            };
            let mut body = body;
            crate::json::set(&mut body, &["guardrail_results"], json!(guardrails));
            crate::json::set(&mut body, &["routing"], json!(routing_record(&routed, target.as_deref())));
            with_routing_headers(Response::build(status), &routed, target.as_deref()).json(body)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_become_messages() {
        let fields = native_to_messages(br#"{"model": "m", "prompt": "hi", "system": "be brief"}"#).unwrap();
        assert_eq!(
            fields["messages"],
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
        );
        assert!(native_to_messages(br#"{"model": "m"}"#).is_err());
        let kept = native_to_messages(br#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#).unwrap();
        assert_eq!(kept["messages"][0]["content"], "x");
    }
}
