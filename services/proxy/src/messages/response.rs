//! Answers and errors in Anthropic's shape: a `message` object from the normalised completion
//! (whichever flavor answered), refusals as a 200 message with `stop_reason: "refusal"`, and
//! `{"type":"error","error":{"type","message"}}` with Anthropic's error types.

use crate::server::{Response, ResponseBuilder};
use http::StatusCode;
use serde_json::{Value, json};
use shield_core::exchange::{self, Block, Stop};
use shield_core::outcome::Class;
use shield_core::run::Halt;
use shield_core::usage::TokenUsage;

use crate::body::ChatRequest;
use crate::dispatch::{Routed, RoutedResult};
use crate::error::ProxyError;
use crate::guard::GuardrailRecord;
use crate::pipeline::{unavailable_message, upstream_refusal, with_routing_headers};
use crate::provider::Native;
use crate::x_shield::{XShield, routing_record};

/// Anthropic's error `type` for a status (design/ANTHROPIC.md "Errors").
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 | 508 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

pub fn error_body(status: StatusCode, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

/// A refusal of the data plane itself (bad key, bad body, unknown route, …).
pub fn proxy_error(err: &ProxyError) -> Response {
    let status = err.status_code();
    let mut response = Response::build(status).json(error_body(status, &err.to_string()));
    err.decorate(&mut response);
    no_retry(status, &mut response);
    response
}

/// Anthropic's SDKs (and Claude Code) retry 408, 409, 429 and 5xx unless told not to: a
/// deterministic refusal (any other 4xx) says so with `x-should-retry: false`.
fn no_retry(status: StatusCode, response: &mut Response) {
    if status.is_client_error() && !matches!(status.as_u16(), 408 | 409 | 429) {
        response.headers_mut().insert(
            http::header::HeaderName::from_static("x-should-retry"),
            http::header::HeaderValue::from_static("false"),
        );
    }
}

/// `stop_reason` of a typed stop.
pub fn stop_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn => "end_turn",
        Stop::MaxTokens => "max_tokens",
        Stop::ToolUse => "tool_use",
        Stop::Refusal => "refusal",
    }
}

/// Anthropic's usage object: its `input_tokens` excludes cache reads and writes.
pub fn usage_json(usage: &TokenUsage) -> Value {
    let uncached = usage.input.saturating_sub(usage.cache_read + usage.cache_write);
    json!({"input_tokens": uncached, "output_tokens": usage.output,
        "cache_read_input_tokens": usage.cache_read, "cache_creation_input_tokens": usage.cache_write})
}

/// A typed answer as a `message`: every block (thinking and its signature included), in order.
fn message(answer: &exchange::Answer, model: &str, usage: TokenUsage) -> Value {
    let content: Vec<Value> = answer
        .blocks
        .iter()
        .filter_map(|block| match block {
            Block::Text(text) if text.is_empty() => None,
            Block::Text(text) => Some(json!({"type": "text", "text": text})),
            Block::Thinking { thinking, signature } => {
                Some(json!({"type": "thinking", "thinking": thinking, "signature": signature}))
            }
            Block::RedactedThinking(data) => Some(json!({"type": "redacted_thinking", "data": data})),
            Block::ToolUse { id, name, input } => {
                // Arguments that are not a JSON object (a model's broken output) become `{}`.
                let input =
                    serde_json::from_str::<Value>(input).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
                Some(json!({"type": "tool_use", "id": id, "name": name, "input": input}))
            }
        })
        .collect();
    let id = match answer.id.as_str() {
        id if id.starts_with("msg_") => id.to_string(),
        "" => "msg_shield".into(),
        id => format!("msg_{id}"),
    };
    json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason(answer.stop.unwrap_or(Stop::EndTurn)), "stop_sequence": null, "usage": usage_json(&usage)})
}

/// A refusal (input guardrail, deny rule, budget block, output guardrail): a 200 message whose
/// text is the reason.
pub fn refusal_message(model: &str, reason: &str) -> Value {
    json!({"id": "msg_shield_refusal", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": reason}], "stop_reason": "refusal", "stop_sequence": null,
        "usage": {"input_tokens": 0, "output_tokens": 0}})
}

/// The refusal as a stream: the same message as Anthropic's event sequence.
pub fn refusal_events(model: &str, reason: &str) -> String {
    let mut start = refusal_message(model, reason);
    crate::json::set(&mut start, &["content"], json!([]));
    crate::json::set(&mut start, &["stop_reason"], Value::Null);
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    [
        event("message_start", json!({"type": "message_start", "message": start})),
        event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
        event("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": reason}})),
        event("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "refusal", "stop_sequence": null}, "usage": {"output_tokens": 0}})),
        event("message_stop", json!({"type": "message_stop"})),
    ]
    .concat()
}

/// A refusal in the shape the caller asked for (a message, or a stream of events).
pub fn refusal(head: ResponseBuilder, request: &ChatRequest, reason: &str) -> Response {
    let mut head = head;
    if request.stream() {
        return head.insert_header(("content-type", "text/event-stream")).body(refusal_events(&request.model, reason));
    }
    head.json(refusal_message(&request.model, reason))
}

/// A routed call's result in Anthropic's shape, with Shield's headers (and `x_shield`).
pub fn respond(mut routed: Routed, request: &ChatRequest, guardrails: Vec<GuardrailRecord>) -> Response {
    match std::mem::replace(&mut routed.result, RoutedResult::Unavailable) {
        RoutedResult::Answer { target, model, body, usage } => {
            // An Anthropic target's own message as it sent it (only `model` set); any other
            // target's typed answer as a message.
            let x_shield = XShield { routing: routing_record(&routed, Some(&target)), guardrail_results: &guardrails };
            let json = match body.native {
                Some(Native::Anthropic(native)) => native.render(&model, &x_shield),
                _ => {
                    let mut answer = message(&body.answer, &model, usage.unwrap_or_default());
                    crate::json::set(&mut answer, &["x_shield"], json!(x_shield));
                    serde_json::to_vec(&answer).unwrap_or_default()
                }
            };
            with_routing_headers(Response::ok(), &routed, Some(&target)).content_type("application/json").body(json)
        }
        RoutedResult::Refusal { reason, target } => {
            routed.result = RoutedResult::Refusal { reason: reason.clone(), target: target.clone() };
            refusal(with_routing_headers(Response::ok(), &routed, target.as_deref()), request, &reason)
        }
        RoutedResult::Refused { target, status, body } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut error = anthropic_error(status, body.as_deref())
                .unwrap_or_else(|| error_body(status, &upstream_refusal(&target, status, body.as_deref()).message));
            crate::json::set(&mut error, &["x_shield"], json!({"routing": routing_record(&routed, Some(&target))}));
            let mut response = with_routing_headers(Response::build(status), &routed, Some(&target)).json(error);
            no_retry(status, &mut response);
            response
        }
        RoutedResult::Unavailable => {
            let (status, message) = unavailable_message(&routed);
            let status = unavailable_status(&routed, status);
            let mut error = error_body(status, &message);
            crate::json::set(&mut error, &["x_shield"], json!({"routing": routing_record(&routed, None)}));
            with_routing_headers(Response::build(status), &routed, None).json(error)
        }
    }
}

/// An Anthropic target's own error, as it said it: Claude Code's recovery (retrying without
/// thinking, a smaller `max_tokens`, …) matches the upstream's `type` and wording, so they are
/// relayed unchanged, credentials in the message redacted. A 401/403 is the target's
/// credential problem, not the caller's: its text is replaced, as for every flavor.
fn anthropic_error(status: StatusCode, body: Option<&[u8]>) -> Option<Value> {
    let said: Value = serde_json::from_slice(body?).ok()?;
    if said.get("type").and_then(Value::as_str) != Some("error") {
        return None;
    }
    let error = said.get("error")?;
    let kind = error.get("type")?.as_str()?;
    let message = error.get("message")?.as_str()?;
    if matches!(status.as_u16(), 401 | 403) {
        return None;
    }
    let message: String = shield_core::detect::redact_secrets(message).chars().take(2000).collect();
    Some(json!({"type": "error", "error": {"type": kind, "message": message}}))
}

/// Nothing answered: 504 at the deadline; 429 when every attempt was rate-limited (or every
/// target parked for its rate window); 529 when every attempt was overloaded; 502 otherwise.
fn unavailable_status(routed: &Routed, status: StatusCode) -> StatusCode {
    let attempts = &routed.attempts;
    let all = |pred: &dyn Fn(&shield_core::run::Attempt) -> bool| !attempts.is_empty() && attempts.iter().all(pred);
    if routed.halt == Halt::Deadline {
        StatusCode::GATEWAY_TIMEOUT
    } else if all(&|a| matches!(a.class, Some(Class::RateLimited | Class::QuotaExhausted)))
        || (attempts.is_empty()
            && !routed.excluded.is_empty()
            && routed.excluded.iter().all(|e| e.reason.as_str() == "exhausted"))
    {
        StatusCode::TOO_MANY_REQUESTS
    } else if all(&|a| a.status == Some(529)) {
        StatusCode::from_u16(529).unwrap_or(StatusCode::BAD_GATEWAY)
    } else {
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anthropic_targets_error_keeps_its_type_and_wording() {
        let body = br#"{"type":"error","error":{"type":"invalid_request_error","message":"messages.1: thinking blocks cannot be modified (key sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123)"}}"#;
        let error = anthropic_error(StatusCode::BAD_REQUEST, Some(body)).unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert_eq!(error["error"]["message"], "messages.1: thinking blocks cannot be modified (key [redacted])");
        assert!(
            anthropic_error(
                StatusCode::UNAUTHORIZED,
                Some(br#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#)
            )
            .is_none(),
            "a credential problem is Shield's to word"
        );
        assert!(
            anthropic_error(
                StatusCode::BAD_REQUEST,
                Some(br#"{"error":{"message":"x","type":"invalid_request_error"}}"#)
            )
            .is_none(),
            "OpenAI's shape is converted, not relayed"
        );
    }

    #[test]
    fn every_typed_block_reaches_an_anthropic_caller_in_order() {
        let answer = exchange::Answer {
            id: "chatcmpl-1".into(),
            blocks: vec![
                Block::Thinking { thinking: "hm".into(), signature: "s".into() },
                Block::Text("42".into()),
                Block::ToolUse { id: "t".into(), name: "f".into(), input: "not json".into() },
            ],
            stop: Some(Stop::ToolUse),
        };
        let message = message(&answer, "m", TokenUsage::default());
        assert_eq!(message["id"], "msg_chatcmpl-1");
        assert_eq!(message["content"][0], json!({"type": "thinking", "thinking": "hm", "signature": "s"}));
        assert_eq!(message["content"][1], json!({"type": "text", "text": "42"}));
        assert_eq!(message["content"][2]["input"], json!({}));
        assert_eq!(message["stop_reason"], "tool_use");
    }
}
