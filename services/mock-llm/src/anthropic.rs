//! The mock in Anthropic's shape: `POST /v1/messages` (and `/mock/{scenario}/v1/messages`)
//! with the same directives as the OpenAI endpoint, streaming included, so routing, failover
//! and accounting tests run across formats. Besides those: `cache:R-W` reports R cache-read
//! and W cache-write input tokens, and `err:CODE` becomes the error's
//! `details.error_code` with CODE (underscores as spaces) as its message — e.g.
//! `err:prompt_is_too_long`, `err:enforced_spend_limit_reached`; `think` answers (or streams) a thinking
//! block (with a signature) before the text.

use actix_web::HttpResponseBuilder;
use actix_web::http::StatusCode;
use actix_web::web::Bytes;
use actix_web::{HttpResponse, web};
use serde_json::{Value, json};

use crate::{MockState, Piece, Scenario, Wire, canned, pieces_in, prefill, stream};

/// Anthropic's error `type` for a status (ANTHROPIC.md "Errors").
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

pub(crate) fn error_body(status: StatusCode, code: Option<&str>) -> Value {
    let message = match code {
        Some(code) => code.replace('_', " "),
        None => format!("mock failure {}", status.as_u16()),
    };
    let mut error = json!({"type": error_type(status), "message": message});
    if let Some(code) = code {
        error["details"] = json!({"error_code": code});
    }
    json!({"type": "error", "error": error, "request_id": "req_mock"})
}

/// The text of the last user turn (a string, or its text blocks).
fn last_user_text(request: &Value) -> String {
    let messages = request.get("messages").and_then(Value::as_array);
    let last = messages.into_iter().flatten().rev().find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
    match last.and_then(|m| m.get("content")) {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => {
            blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("")
        }
        _ => String::new(),
    }
}

fn usage(request: &Value, scenario: &Scenario, output_chars: usize) -> Value {
    let prompt_chars = request.get("messages").map(|m| m.to_string().len()).unwrap_or(0) as u64;
    let (input, output) = scenario.usage.unwrap_or((prompt_chars.div_ceil(4), (output_chars as u64).div_ceil(4)));
    let (read, write) = scenario.cache.unwrap_or((0, 0));
    json!({"input_tokens": input, "output_tokens": output, "cache_read_input_tokens": read,
        "cache_creation_input_tokens": write})
}

fn message(request: &Value, scenario: &Scenario) -> Value {
    let model = request.get("model").and_then(Value::as_str).unwrap_or("mock");
    let text = scenario
        .reply
        .clone()
        .or_else(|| canned(scenario.say.as_deref()).map(str::to_string))
        .unwrap_or_else(|| format!("mock answer to: {}", last_user_text(request)));
    let (content, stop_reason) = match &scenario.tool {
        Some(tool) => {
            let input: Value = serde_json::from_str(&scenario.tool_arguments()).unwrap_or_else(|_| json!({}));
            let call = json!({"type": "tool_use", "id": "toolu_mock1", "name": tool, "input": input});
            let thinking = json!({"type": "thinking", "thinking": "Let me think.", "signature": "c2ln"});
            (if scenario.think { json!([thinking, call]) } else { json!([call]) }, "tool_use")
        }
        None if scenario.think => (
            json!([{"type": "thinking", "thinking": "Let me think.", "signature": "c2ln"}, {"type": "text", "text": text}]),
            "end_turn",
        ),
        None => (json!([{"type": "text", "text": text}]), "end_turn"),
    };
    json!({"id": "msg_mock", "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason, "stop_sequence": null, "usage": usage(request, scenario, text.len())})
}

/// `POST …/v1/messages`, after the shared directives (delay, hang, reset, status) ran.
pub(crate) fn answer(
    mut response: HttpResponseBuilder,
    status: StatusCode,
    scenario: Scenario,
    body: &Bytes,
    state: web::Data<MockState>,
) -> HttpResponse {
    if !status.is_success() {
        return response.json(error_body(status, scenario.error_code.as_deref()));
    }
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let prefill = prefill(&request);
    if scenario.no_prefill && prefill.is_some() {
        return HttpResponse::BadRequest()
            .json(error_body(StatusCode::BAD_REQUEST, Some("assistant_prefill_is_not_supported")));
    }
    if request.get("stream").and_then(Value::as_bool) == Some(true) {
        let (input, output) = scenario.usage.unwrap_or((10, scenario.chunks.unwrap_or(3) as u64));
        let (read, write) = scenario.cache.unwrap_or((0, 0));
        let wire = AnthropicWire {
            model: request.get("model").and_then(Value::as_str).unwrap_or("mock").to_string(),
            usage: json!({"input_tokens": input, "output_tokens": output, "cache_read_input_tokens": read,
                "cache_creation_input_tokens": write}),
            think: scenario.think,
        };
        let skip = prefill.map(|text| pieces_in(&scenario, &text)).unwrap_or(0);
        return response.content_type("text/event-stream").streaming(stream(state.into_inner(), scenario, wire, skip));
    }
    match scenario.body.as_deref() {
        Some("garbage") => response.content_type("application/json").body("this is not json"),
        Some("nochoices") => response.json(json!({"id": "msg_x", "type": "message"})),
        Some("error") => response.json(error_body(StatusCode::from_u16(529).unwrap_or_default(), None)),
        _ => response.json(message(&request, &scenario)),
    }
}

/// Anthropic's stream: `message_start` with the input usage, one text block, `message_delta`
/// with the stop reason and output usage, `message_stop`.
struct AnthropicWire {
    model: String,
    usage: Value,
    /// `think`: a thinking block (with its signature) comes before the text.
    think: bool,
}

fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

impl Wire for AnthropicWire {
    fn render(&self, piece: &Piece) -> Option<Bytes> {
        // With `think`, block 0 is the thinking and the text is block 1.
        let text_index = u64::from(self.think);
        let delta = |text: &str| {
            event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": text_index, "delta": {"type": "text_delta", "text": text}}),
            )
        };
        let start = |block: Value| {
            let mut start_usage = self.usage.clone();
            start_usage["output_tokens"] = json!(1);
            let message = json!({"type": "message_start", "message": {"id": "msg_mock", "type": "message",
                "role": "assistant", "model": self.model, "content": [], "stop_reason": null,
                "stop_sequence": null, "usage": start_usage}});
            let thinking = if self.think {
                let start = json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "thinking", "thinking": ""}});
                let think = json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "thinking_delta", "thinking": "Let me think."}});
                let sign = json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "signature_delta", "signature": "c2ln"}});
                let stop = json!({"type": "content_block_stop", "index": 0});
                [
                    event("content_block_start", &start),
                    event("content_block_delta", &think),
                    event("content_block_delta", &sign),
                    event("content_block_stop", &stop),
                ]
                .concat()
            } else {
                String::new()
            };
            let block = json!({"type": "content_block_start", "index": text_index, "content_block": block});
            [
                event("message_start", &message),
                thinking,
                event("content_block_start", &block),
                event("ping", &json!({"type": "ping"})),
            ]
            .concat()
        };
        let text = match piece {
            Piece::Text { first: true, text } => start(json!({"type": "text", "text": ""})) + &delta(text),
            Piece::Text { text, .. } => delta(text),
            Piece::ToolCall { name } => {
                start(json!({"type": "tool_use", "id": "toolu_mock1", "name": name, "input": {}}))
            }
            Piece::ToolArgs(args) => event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": text_index, "delta": {"type": "input_json_delta", "partial_json": args}}),
            ),
            Piece::Finish { tool } => {
                let stop_reason = if *tool { "tool_use" } else { "end_turn" };
                let delta = json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                    "usage": {"output_tokens": self.usage["output_tokens"]}});
                [
                    event("content_block_stop", &json!({"type": "content_block_stop", "index": text_index})),
                    event("message_delta", &delta),
                ]
                .concat()
            }
            // Anthropic reports usage in `message_start` and `message_delta`.
            Piece::Usage(..) => return None,
            Piece::Done => event("message_stop", &json!({"type": "message_stop"})),
            Piece::Error => event(
                "error",
                &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ),
            Piece::Malformed => "event: content_block_delta\ndata: {this is not json\n\n".to_string(),
        };
        Some(Bytes::from(text))
    }
}
