//! `POST /v1/responses`: callers in OpenAI's Responses shape (issue 29, first part). The
//! ingress adapter for that shape: read the body into the typed request, run the shared
//! [`crate::pipeline`] (any provider flavor), render the typed answer as a `response` object
//! or a stream of Responses events ([`wire`]). Errors are OpenAI's error object, as the SDKs
//! expect.
//!
//! Mapping (RESPONSES.md): `instructions` → the system prompt; `input` (a string, or items:
//! `message` with user / assistant / system / developer roles and `input_text`,
//! `input_image`, `output_text` parts; `function_call` / `function_call_output`;
//! `custom_tool_call` / `custom_tool_call_output`) → messages; `reasoning` items are dropped
//! (their `encrypted_content` is not Shield's to forward); `function` tools as they are;
//! `custom` (freeform) tools as function tools taking one string `input`, and their calls back
//! as `custom_tool_call` items; other tool types are dropped and named in
//! `X-Shield-Dropped-Fields`; `reasoning.effort` → the typed effort; `max_output_tokens`,
//! `temperature`, `top_p`, `tool_choice`, `parallel_tool_calls` as typed; other fields
//! (`store`, `include`, `prompt_cache_key`, `metadata`, `service_tier`, `text`) are accepted
//! and ignored. Not yet: stored responses (`previous_response_id`), the reasoning round trip.

pub mod wire;

use std::sync::Arc;

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, ResponseError, post, web};
use serde_json::{Map, Value, json};
use shield_core::chat_request::{BadRequest, ChatRequest, Origin};
use shield_core::exchange::{self, Block, Effort, Image, Message, Part, Reasoning, Role, Stop, Tool, ToolChoice};

use crate::ProxyState;
use crate::body;
use crate::dispatch::RoutedResult;
use crate::egress::Egress;
use crate::error::ProxyError;
use crate::pipeline::{Ingress, Outcome, admit, pipeline, routing_record, with_routing_headers};

const INGRESS: Ingress = Ingress { stream: true, default_path: false };
const DROPPED_TOOLS: HeaderName = HeaderName::from_static("x-shield-dropped-fields");

#[post("/v1/responses")]
pub async fn responses(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<ProxyState>,
    egress: web::Data<Egress>,
) -> HttpResponse {
    let result = async {
        let caller = admit(&req, &state).await?;
        let raw = body::read(payload).await?;
        let (request, custom, dropped) = parse(&raw)?;
        let served = pipeline(&req, caller, raw, &request, &state, &egress, INGRESS).await?;
        Ok::<_, ProxyError>(served.render(|outcome| {
            let mut response = render(outcome, &request, &custom);
            if !dropped.is_empty()
                && let Ok(value) = HeaderValue::from_str(&dropped.join(", "))
            {
                response.headers_mut().insert(DROPPED_TOOLS, value);
            }
            response
        }))
    };
    result.await.unwrap_or_else(|err| err.error_response())
}

/// `GET /v1/responses`: Codex tries a WebSocket here when its provider says it supports them;
/// a 426 with an error object makes it fall back to HTTP at once. Anything else is a 405.
#[actix_web::get("/v1/responses")]
pub async fn upgrade(req: HttpRequest) -> HttpResponse {
    let websocket = req
        .headers()
        .get(actix_web::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if websocket {
        let error = crate::error::openai_error(
            "Shield serves the Responses API over HTTP only: POST /v1/responses",
            "invalid_request_error",
            "websocket_unsupported",
            Value::Null,
        );
        return HttpResponse::build(actix_web::http::StatusCode::UPGRADE_REQUIRED).json(error);
    }
    let error = crate::error::openai_error(
        "use POST /v1/responses",
        "invalid_request_error",
        "method_not_allowed",
        Value::Null,
    );
    HttpResponse::MethodNotAllowed().json(error)
}

/// The typed request, the names of the caller's freeform (`custom`) tools, and the tool types
/// dropped.
fn parse(body: &[u8]) -> Result<(ChatRequest, Vec<String>, Vec<String>), BadRequest> {
    let value: Value = serde_json::from_slice(body).map_err(|e| BadRequest(format!("malformed JSON body: {e}")))?;
    let Value::Object(fields) = value else { return Err(BadRequest("the body must be a JSON object".into())) };
    let model = match fields.get("model") {
        Some(Value::String(model)) if !model.is_empty() => model.clone(),
        _ => return Err(BadRequest("`model` must be a non-empty string".into())),
    };
    if fields.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(BadRequest(
            "`previous_response_id`: Shield stores no responses yet; send the whole conversation in `input`".into(),
        ));
    }
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut messages: Vec<Message> = Vec::new();
    let mut push = |role: Role, part: Part| match messages.last_mut() {
        Some(last) if last.role == role && role != Role::System => last.content.push(part),
        _ => messages.push(Message { role, content: vec![part] }),
    };
    match fields.get("input") {
        Some(Value::String(said)) => push(Role::User, Part::Text(said.clone())),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
                match kind {
                    "message" => {
                        let role = match item.get("role").and_then(Value::as_str) {
                            Some("user") => Role::User,
                            Some("assistant") => Role::Assistant,
                            Some("system" | "developer") => Role::System,
                            _ => {
                                return Err(BadRequest(format!(
                                    "input.{i}.role: must be user, assistant, system or developer"
                                )));
                            }
                        };
                        for part in parts_of(item.get("content")) {
                            push(role, part);
                        }
                    }
                    "function_call" | "custom_tool_call" => {
                        let input = if kind == "function_call" {
                            text(item, "arguments")
                        } else {
                            json!({"input": text(item, "input")}).to_string()
                        };
                        push(
                            Role::Assistant,
                            Part::ToolUse { id: text(item, "call_id"), name: text(item, "name"), input },
                        );
                    }
                    "function_call_output" | "custom_tool_call_output" => {
                        let output = match item.get("output") {
                            Some(Value::String(output)) => output.clone(),
                            other => parts_of(other)
                                .into_iter()
                                .filter_map(|p| if let Part::Text(t) = p { Some(t) } else { None })
                                .collect::<Vec<_>>()
                                .join("\n"),
                        };
                        push(
                            Role::User,
                            Part::ToolResult { id: text(item, "call_id"), content: output, is_error: false },
                        );
                    }
                    // Reasoning items (and kinds added later) carry nothing Shield forwards.
                    _ => {}
                }
            }
        }
        _ => return Err(BadRequest("`input` must be a string or an array of items".into())),
    }
    let mut tools = Vec::new();
    let mut custom = Vec::new();
    let mut dropped = Vec::new();
    for tool in fields.get("tools").and_then(Value::as_array).into_iter().flatten() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => tools.push(Tool {
                name: text(tool, "name"),
                description: text(tool, "description"),
                schema: tool.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            }),
            // A freeform tool as a function taking its text in one string (`input`).
            Some("custom") => {
                let name = text(tool, "name");
                custom.push(name.clone());
                tools.push(Tool {
                    name,
                    description: text(tool, "description"),
                    schema: json!({"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}),
                });
            }
            Some(kind) => dropped.push(format!("tools ({kind})")),
            None => {}
        }
    }
    let tool_choice = match fields.get("tool_choice") {
        Some(Value::String(choice)) if choice == "auto" => Some(ToolChoice::Auto),
        Some(Value::String(choice)) if choice == "none" => Some(ToolChoice::None),
        Some(Value::String(choice)) if choice == "required" => Some(ToolChoice::Any),
        Some(choice @ Value::Object(_)) => {
            choice.get("name").and_then(Value::as_str).map(|n| ToolChoice::Tool(n.into()))
        }
        _ => None,
    };
    let effort = match fields.get("reasoning").and_then(|r| r.get("effort")).and_then(Value::as_str) {
        Some("minimal" | "low") => Some(Effort::Low),
        Some("medium") => Some(Effort::Medium),
        Some("high" | "xhigh") => Some(Effort::High),
        _ => None,
    };
    let typed = exchange::Request {
        system: fields.get("instructions").and_then(Value::as_str).map(str::to_string).into_iter().collect(),
        messages,
        tools,
        tool_choice,
        parallel_tool_calls: fields.get("parallel_tool_calls").and_then(Value::as_bool),
        max_tokens: fields.get("max_output_tokens").and_then(Value::as_u64),
        temperature: fields.get("temperature").and_then(Value::as_f64),
        top_p: fields.get("top_p").and_then(Value::as_f64),
        stop: Vec::new(),
        reasoning: effort.map(|effort| Reasoning { effort: Some(effort), fields: vec!["reasoning.effort"] }),
        stream: fields.get("stream").and_then(Value::as_bool) == Some(true),
        user: None,
    };
    if typed.messages.is_empty() {
        return Err(BadRequest("`input` holds no message".into()));
    }
    let request = ChatRequest { model, exchange: Arc::new(typed), origin: Origin::Responses(Arc::new(fields)) };
    Ok((request, custom, dropped))
}

/// Responses content (a string, or `input_text` / `output_text` / `input_image` parts).
fn parts_of(content: Option<&Value>) -> Vec<Part> {
    match content {
        Some(Value::String(text)) => vec![Part::Text(text.clone())],
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| match part.get("type").and_then(Value::as_str) {
                Some("input_text" | "output_text" | "text") => {
                    part.get("text").and_then(Value::as_str).map(|t| Part::Text(t.to_string()))
                }
                Some("input_image") => {
                    let url = part.get("image_url").and_then(Value::as_str)?;
                    match shield_core::chat_request::image_of(url)? {
                        Part::Image(Image::Url(url)) => Some(Part::Image(Image::Url(url))),
                        other => Some(other),
                    }
                }
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn render(outcome: Outcome, request: &ChatRequest, custom: &[String]) -> HttpResponse {
    match outcome {
        Outcome::Relayed(response) => response,
        Outcome::InputBlocked { reason, .. } => refusal(HttpResponse::Ok(), request, &reason),
        Outcome::Stream(start) => start.respond(Box::new(wire::ResponsesWire::new(&request.model, custom.to_vec()))),
        Outcome::Routed { routed, guardrails } => routed_response(*routed, guardrails, request, custom),
    }
}

fn routed_response(
    mut routed: crate::dispatch::Routed,
    guardrails: Vec<crate::guard::GuardrailRecord>,
    request: &ChatRequest,
    custom: &[String],
) -> HttpResponse {
    match std::mem::replace(&mut routed.result, RoutedResult::Unavailable) {
        RoutedResult::Answer { target, model, body, usage } => {
            let mut answer = response_of(&body.answer, &model, usage.unwrap_or_default(), custom);
            let x_shield = json!({"routing": routing_record(&routed, Some(&target)), "guardrail_results": guardrails});
            crate::json::set(&mut answer, &["x_shield"], x_shield);
            with_routing_headers(HttpResponse::Ok(), &routed, Some(&target)).json(answer)
        }
        RoutedResult::Refusal { reason, target } => {
            routed.result = RoutedResult::Refusal { reason: reason.clone(), target: target.clone() };
            refusal(with_routing_headers(HttpResponse::Ok(), &routed, target.as_deref()), request, &reason)
        }
        RoutedResult::Refused { target, status, body } => {
            let status =
                actix_web::http::StatusCode::from_u16(status).unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY);
            let error = crate::chat::refused_error(&target, status, body.as_deref());
            with_routing_headers(HttpResponse::build(status), &routed, Some(&target)).json(error)
        }
        RoutedResult::Unavailable => {
            let (status, message) = crate::pipeline::unavailable_message(&routed);
            let error = crate::error::openai_error(&message, "upstream_error", routed.halt.as_str(), Value::Null);
            with_routing_headers(HttpResponse::build(status), &routed, None).json(error)
        }
    }
}

/// A refusal (guardrail, deny rule, budget block): a response whose text is the reason,
/// marked `incomplete_details.reason: "content_filter"` (as a stream of events when the
/// caller asked for one).
fn refusal(mut head: actix_web::HttpResponseBuilder, request: &ChatRequest, reason: &str) -> HttpResponse {
    if request.stream() {
        let mut wire = wire::ResponsesWire::new(&request.model, Vec::new());
        let events =
            crate::client_wire::ClientWire::blocked(&mut wire, reason, &request.model, Value::Null, Default::default());
        return head.insert_header(("content-type", "text/event-stream")).body(events);
    }
    let answer = exchange::Answer {
        blocks: vec![Block::Text(reason.to_string())],
        stop: Some(Stop::Refusal),
        ..Default::default()
    };
    head.json(response_of(&answer, &request.model, Default::default(), &[]))
}

/// A typed answer as a `response` object.
fn response_of(
    answer: &exchange::Answer,
    model: &str,
    usage: shield_core::usage::TokenUsage,
    custom: &[String],
) -> Value {
    let id = if answer.id.is_empty() { "resp_shield".to_string() } else { format!("resp_{}", answer.id) };
    let mut output = Vec::new();
    let text = answer.visible_text();
    if !text.is_empty() {
        output.push(json!({"type": "message", "id": format!("msg_{id}"), "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}));
    }
    for block in &answer.blocks {
        if let Block::ToolUse { id: call_id, name, input } = block {
            if custom.contains(name) {
                let input: Value = serde_json::from_str(input).unwrap_or(Value::Null);
                let input = input.get("input").and_then(Value::as_str).unwrap_or_default().to_string();
                output.push(json!({"type": "custom_tool_call", "id": format!("ctc_{call_id}"), "call_id": call_id,
                    "name": name, "input": input, "status": "completed"}));
            } else {
                output.push(json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
                    "name": name, "arguments": input, "status": "completed"}));
            }
        }
    }
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let incomplete = match answer.stop {
        Some(Stop::MaxTokens) => json!({"reason": "max_output_tokens"}),
        Some(Stop::Refusal) => json!({"reason": "content_filter"}),
        _ => Value::Null,
    };
    let status = if incomplete.is_null() { "completed" } else { "incomplete" };
    let mut response = Map::new();
    response.insert("id".into(), json!(id));
    response.insert("object".into(), json!("response"));
    response.insert("created_at".into(), json!(created));
    response.insert("status".into(), json!(status));
    response.insert("model".into(), json!(model));
    response.insert("output".into(), Value::Array(output));
    response.insert("parallel_tool_calls".into(), json!(true));
    response.insert("tool_choice".into(), json!("auto"));
    response.insert("tools".into(), json!([]));
    response.insert("error".into(), Value::Null);
    response.insert("incomplete_details".into(), incomplete);
    response.insert(
        "usage".into(),
        json!({"input_tokens": usage.input, "input_tokens_details": {"cached_tokens": usage.cache_read},
            "output_tokens": usage.output, "output_tokens_details": {"reasoning_tokens": usage.reasoning},
            "total_tokens": usage.input + usage.output}),
    );
    Value::Object(response)
}
