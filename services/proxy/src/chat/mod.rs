//! `POST /v1/chat/completions`: callers in OpenAI's Chat Completions shape. The ingress
//! adapter for that shape: read the body into a chat request, run the shared
//! [`crate::pipeline`], render its outcome as a `chat.completion` (an OpenAI-flavour target's
//! own answer as sent; any other target's typed answer converted), an SSE stream ([`wire`]),
//! a refusal or an error in OpenAI's shape.

use crate::server::{Request, Response, ResponseBuilder};
use http::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};
use shield_core::usage::TokenUsage;
use std::sync::Arc;

use crate::ProxyState;
use crate::body::{self, ChatRequest};
use crate::dispatch::{Routed, RoutedResult};
use crate::egress::Egress;
use crate::error::{ProxyError, openai_error};
use crate::guard::GuardrailRecord;
use crate::pipeline::{Ingress, Outcome, admit, pipeline, unavailable_message, upstream_refusal, with_routing_headers};
use crate::provider::Native;
use crate::x_shield::{XShield, routing_record};

pub mod wire;

use wire::OpenAiWire;

pub async fn chat_completions(
    req: Request,
    payload: crate::server::Payload,
    state: Arc<ProxyState>,
    egress: Arc<Egress>,
) -> Response {
    let result = async {
        let caller = admit(&req, &state).await?;
        let raw = body::read(payload).await?;
        let memo = crate::pipeline::schemas_memo(&state, &caller, &raw);
        let request = ChatRequest::parse_remembering(&raw, memo.as_deref())?;
        let ingress = Ingress { stream: true, default_path: Some("chat/completions") };
        let served = pipeline(&req, caller, raw, &request, &state, &egress, ingress).await?;
        Ok::<_, ProxyError>(served.render(|outcome| match outcome {
            Outcome::Relayed(response) => response,
            Outcome::Stream(start) => start.respond(Box::new(OpenAiWire::new(request.wants_usage()))),
            Outcome::InputBlocked { reason, guardrails } => refusal(&request, &reason, None, guardrails),
            Outcome::Routed { routed, guardrails } => respond(*routed, &request, guardrails),
        }))
    };
    result.await.unwrap_or_else(|err| err.error_response())
}

fn respond(mut routed: Routed, request: &ChatRequest, guardrails: Vec<GuardrailRecord>) -> Response {
    let x_shield = |routed: &Routed, target: Option<&str>| json!({"routing": routing_record(routed, target), "guardrail_results": guardrails});
    match std::mem::replace(&mut routed.result, RoutedResult::Unavailable) {
        RoutedResult::Answer { target, model, body, usage } => {
            // An OpenAI-flavour target's own answer with `model` and Shield's `x_shield` spliced
            // in (an upstream's own `x_shield` is dropped: the one the caller reads is
            // Shield's); any other target's typed answer as a completion.
            let x_shield = XShield { routing: routing_record(&routed, Some(&target)), guardrail_results: &guardrails };
            let json = match body.native {
                Some(Native::OpenAi(native)) => native.render(&model, &x_shield),
                _ => completion_of(&body.answer, &model, usage, &x_shield),
            };
            with_routing_headers(Response::ok(), &routed, Some(&target)).content_type("application/json").body(json)
        }
        RoutedResult::Refusal { reason, target } => {
            routed.result = RoutedResult::Refusal { reason: reason.clone(), target: target.clone() };
            let head = with_routing_headers(Response::ok(), &routed, target.as_deref());
            refusal_response(head, request, &reason, x_shield(&routed, target.as_deref()))
        }
        RoutedResult::Refused { target, status, body } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut error = refused_error(&target, status, body.as_deref());
            crate::json::set(&mut error, &["x_shield"], x_shield(&routed, Some(&target)));
            with_routing_headers(Response::build(status), &routed, Some(&target)).json(error)
        }
        RoutedResult::Unavailable => {
            let (status, message) = unavailable_message(&routed);
            let mut error = openai_error(&message, "upstream_error", routed.halt.as_str(), Value::Null);
            crate::json::set(&mut error, &["error", "attempts"], json!(routed.attempts));
            crate::json::set(&mut error, &["error", "excluded"], json!(routed.excluded));
            crate::json::set(&mut error, &["x_shield"], x_shield(&routed, None));
            with_routing_headers(Response::build(status), &routed, None).json(error)
        }
    }
}

/// A typed answer as a `chat.completion`: its text (thinking has no place here) and tool
/// calls as one choice.
fn completion_of(
    answer: &shield_core::exchange::Answer,
    model: &str,
    usage: Option<TokenUsage>,
    x_shield: &impl Serialize,
) -> Vec<u8> {
    use shield_core::exchange::{Block, Stop};
    let calls: Vec<Value> = answer
        .blocks
        .iter()
        .filter_map(|block| match block {
            Block::ToolUse { id, name, input } => {
                Some(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}))
            }
            _ => None,
        })
        .collect();
    let text = answer.visible_text();
    let mut message = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) }});
    if !calls.is_empty() {
        crate::json::set(&mut message, &["tool_calls"], Value::Array(calls));
    }
    let finish = wire::finish_reason(answer.stop.unwrap_or(Stop::EndTurn));
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    #[derive(Serialize)]
    struct Completion<'a, X> {
        id: &'a str,
        object: &'static str,
        created: u64,
        model: &'a str,
        choices: [Value; 1],
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<Value>,
        x_shield: &'a X,
    }
    let completion = Completion {
        id: &answer.id,
        object: "chat.completion",
        created,
        model,
        choices: [json!({"index": 0, "message": message, "finish_reason": finish})],
        usage: usage.as_ref().map(wire::usage_json),
        x_shield,
    };
    serde_json::to_vec(&completion).unwrap_or_default()
}

/// A refusal before routing (an input guardrail in block mode).
fn refusal(request: &ChatRequest, reason: &str, routing: Option<Value>, guardrails: Vec<GuardrailRecord>) -> Response {
    let x_shield = json!({"routing": routing.unwrap_or_else(|| json!({"reason": reason, "halt": "denied"})), "guardrail_results": guardrails});
    refusal_response(Response::ok(), request, reason, x_shield)
}

/// API.md: a refusal is HTTP 200 with one choice, `finish_reason: "content_filter"` and the
/// reason as its content, in the shape the client asked for (a completion, or an SSE stream).
fn refusal_response(mut head: ResponseBuilder, request: &ChatRequest, reason: &str, x_shield: Value) -> Response {
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let id = format!("chatcmpl-shield-{created:x}");
    if request.stream() {
        let chunk = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": request.model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": reason}, "finish_reason": "content_filter"}],
            "x_shield": x_shield});
        return head
            .insert_header(("content-type", "text/event-stream"))
            .body(format!("data: {chunk}\n\ndata: [DONE]\n\n"));
    }
    head.json(json!({
        "id": id, "object": "chat.completion", "created": created, "model": request.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reason}, "finish_reason": "content_filter"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        "x_shield": x_shield,
    }))
}

/// An upstream 4xx in OpenAI error shape, naming the target.
pub(crate) fn refused_error(target: &str, status: StatusCode, body: Option<&[u8]>) -> Value {
    let refusal = upstream_refusal(target, status, body);
    let kind = refusal.kind.unwrap_or_else(|| "invalid_request_error".into());
    let mut error = openai_error(&refusal.message, &kind, "", refusal.param);
    crate::json::set(&mut error, &["error", "code"], refusal.code);
    error
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[tokio::test]
    async fn an_answer_carries_shields_own_x_shield_once_and_the_exact_cost() {
        let (native, answer, _) = crate::provider::OpenAiAnswer::parse(
            br#"{"id": "c1", "model": "up", "choices": [], "x_shield": {"routing": "forged"}}"#.to_vec(),
        )
        .unwrap();
        let routed = Routed {
            route: "smart".into(),
            rule: None,
            attempts: Vec::new(),
            excluded: Vec::new(),
            halt: shield_core::run::Halt::Succeeded,
            failovers: 0,
            result: RoutedResult::Answer {
                target: "a".into(),
                model: "gpt-x".into(),
                body: crate::provider::Completion { answer, native: Some(Native::OpenAi(native)) },
                usage: None,
            },
            cost_micros: Some(1350),
            budget: shield_core::usage::BudgetState::Ok,
            upstream: std::time::Duration::ZERO,
            dropped: Vec::new(),
        };
        let request =
            ChatRequest::parse(br#"{"model": "smart", "messages": [{"role": "user", "content": "hi"}]}"#).unwrap();
        let record = GuardrailRecord {
            findings: Default::default(),
            mode: shield_core::guardrails::Mode::Monitor,
            name: "pii",
            passed: true,
            phase: "output",
        };
        let response = respond(routed, &request, vec![record]);
        assert_eq!(response.headers().get("content-type").unwrap(), "application/json");
        let bytes = response.into_bytes().await;
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert_eq!(text.matches("\"x_shield\"").count(), 1, "{text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(answer["model"], "gpt-x");
        assert_eq!(answer["id"], "c1");
        assert_eq!(answer["x_shield"]["routing"]["target"], "a");
        assert_eq!(answer["x_shield"]["routing"]["cost"].to_string(), "0.00135");
        assert_eq!(answer["x_shield"]["routing"]["cost_micros"], 1350);
        assert_eq!(answer["x_shield"]["routing"]["halt"], "succeeded");
        assert_eq!(answer["x_shield"]["guardrail_results"][0]["name"], "pii");
    }
}
