//! `POST /v1/responses` and the stored responses (issue 29): callers in OpenAI's Responses
//! shape. The ingress adapter for that shape: continue a stored conversation ([`history`]),
//! read the body into the typed request, run the shared [`crate::pipeline`] (any provider
//! flavor), render the typed answer as a `response` object or a stream of Responses events
//! ([`wire`]), and keep it when asked ([`store`]). Errors are OpenAI's error object, as the
//! SDKs expect; Codex is told of rate limits the way it waits on.
//!
//! Mapping (RESPONSES.md, README "The Responses API and Codex"): `instructions` → the system
//! prompt; `input` (a string, or items: `message` with user / assistant / system / developer
//! roles and `input_text`, `input_image`, `output_text` parts; `function_call` /
//! `function_call_output`; `custom_tool_call` / `custom_tool_call_output`; `reasoning`) →
//! messages; Shield's own sealed reasoning goes back as the thinking it was ([`reasoning`]),
//! other `encrypted_content` is dropped; `function` tools as they are; `custom` (freeform)
//! tools as function tools taking one string `input`, and their calls back as
//! `custom_tool_call` items; other tool types are dropped and named in
//! `X-Shield-Dropped-Fields`; `reasoning.effort` → the typed effort; `text.format` → the typed
//! structured-output format; `max_output_tokens`, `temperature`, `top_p`, `tool_choice`,
//! `parallel_tool_calls` as typed; `include`, `prompt_cache_key`, `service_tier`,
//! `text.verbosity` and unknown fields are accepted and ignored.

pub mod history;
pub mod reasoning;
pub mod store;
pub mod wire;

use std::sync::Arc;

use crate::server::{Request, Response, ResponseBuilder};
use http::StatusCode;
use http::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use shield_core::chat_request::{BadRequest, ChatRequest, Origin};
use shield_core::exchange::{
    self, Block, Effort, Image, Message, Part, Reasoning, Role, Schema, Stop, Tool, ToolChoice,
};

use crate::ProxyState;
use crate::body;
use crate::dispatch::RoutedResult;
use crate::egress::Egress;
use crate::error::ProxyError;
use crate::pipeline::{Ingress, Outcome, admit, pipeline, with_routing_headers};
use crate::x_shield::routing_record;
use history::Keeper;
use reasoning::Sealer;

const INGRESS: Ingress = Ingress { stream: true, default_path: Some("responses") };
const DROPPED_TOOLS: HeaderName = HeaderName::from_static("x-shield-dropped-fields");
const ORIGINATOR: HeaderName = HeaderName::from_static("originator");

/// What the answer echoes of the request, and how it renders it.
struct Echo {
    id: String,
    custom: Vec<String>,
    fields: Value,
    /// Seals thinking into reasoning items' `encrypted_content`.
    sealer: Sealer,
    /// The caller asked for reasoning summaries (`reasoning.summary`): thinking text is sent
    /// as the summary.
    summaries: bool,
}

pub async fn responses(
    req: Request,
    payload: crate::server::Payload,
    state: Arc<ProxyState>,
    egress: Arc<Egress>,
) -> Response {
    let codex = is_codex(&req);
    let mut streamed = false;
    let result = async {
        let caller = admit(&req, &state).await?;
        let raw = body::read(payload).await?;
        let mut fields = object_of(&raw)?;
        streamed = fields.get("stream").and_then(Value::as_bool) == Some(true);
        let id = format!("resp_{}", uuid::Uuid::new_v4().simple());
        let tenant = state.tenant_config(&caller.key.tenant).await;
        let model = fields.get("model").and_then(Value::as_str).unwrap_or_default();
        // Issue 32: the key's allow-list before anything (a stored conversation) is looked up.
        if !caller.key.may_use(model) {
            return Err(ProxyError::PermissionDenied(model.to_string()));
        }
        let routed =
            tenant.as_deref().is_some_and(|t| state.config.routing_enabled && t.enabled_route(model).is_some());
        let mut keeper = match tenant.as_deref().filter(|_| routed) {
            Some(tenant) => {
                let retention = tenant.snapshot.responses.retention_s;
                history::expand(&mut fields, &caller.key.tenant, retention, &state.responses, &id).await?
            }
            None => None,
        };
        let sealer = Sealer::new(state.reasoning_keyring.clone(), &caller.key.tenant);
        let summaries = fields
            .get("reasoning")
            .and_then(|r| r.get("summary"))
            .is_some_and(|s| !s.is_null() && s.as_str() != Some("none"));
        let echo = Echo { id, custom: Vec::new(), fields: echoed(&fields), sealer, summaries };
        let (request, custom, dropped) = parse(fields, &echo.sealer)?;
        let echo = Echo { custom, ..echo };
        let mut served = pipeline(&req, caller, raw, &request, &state, &egress, INGRESS).await?;
        // A non-streamed answer is kept before it is sent, so that the caller's next turn,
        // on any proxy, finds it.
        let mut answer = None;
        if let Outcome::Routed { routed, .. } = &mut served.outcome
            && let RoutedResult::Answer { model, body, usage, .. } = &routed.result
        {
            let value = response_of(&body.answer, model, usage.unwrap_or_default(), &echo);
            if let Some(keeper) = keeper.take() {
                keeper.keep(&value).await;
            }
            answer = Some(value);
        }
        Ok::<_, ProxyError>(served.render(|outcome| {
            let mut response = render(outcome, &request, echo, answer, keeper, codex);
            // The tool types dropped here, and what the answering target had no place for.
            let target_dropped = response.headers().get(&DROPPED_TOOLS).and_then(|v| v.to_str().ok());
            let all: Vec<&str> = dropped.iter().map(String::as_str).chain(target_dropped).collect();
            if !dropped.is_empty()
                && let Ok(value) = HeaderValue::from_str(&all.join(", "))
            {
                response.headers_mut().insert(DROPPED_TOOLS, value);
            }
            response
        }))
    };
    match result.await {
        Ok(response) => response,
        Err(ProxyError::RateLimited(limited)) if codex && streamed => {
            let mut response = codex_rate_limited(limited.retry_after_s, &limited.message());
            crate::limits::apply(&mut response, limited.headers.iter().cloned());
            response
        }
        Err(err) => err.error_response(),
    }
}

/// Whether the caller is OpenAI's Codex (its `originator` header: `codex_cli_rs`,
/// `codex_exec`, `codex_vscode`, …). Codex gives up on an HTTP 429 but waits and retries a
/// stream that fails with `rate_limit_exceeded`, so it is told of rate limits that way.
fn is_codex(req: &Request) -> bool {
    req.headers().get(ORIGINATOR).and_then(|v| v.to_str().ok()).is_some_and(|o| o.starts_with("codex"))
}

/// A rate limit told the way Codex waits on: a 200 stream that fails at once with
/// `rate_limit_exceeded` and "try again in N s" (RESPONSES.md §4).
fn codex_rate_limited(retry_after_s: u64, message: &str) -> Response {
    let mut wire = wire::ResponsesWire::new("", Vec::new(), format!("resp_{}", uuid::Uuid::new_v4().simple()), None);
    let message = format!("{message} Please try again in {}s.", retry_after_s.max(1));
    let events = wire.failed("rate_limit_exceeded", &message);
    Response::ok()
        .insert_header(("content-type", "text/event-stream"))
        .insert_header(("retry-after", retry_after_s.max(1).to_string()))
        .body(events)
}

/// The request's fields a response object echoes.
fn echoed(fields: &Map<String, Value>) -> Value {
    let mut echo = Map::new();
    for key in ["previous_response_id", "metadata", "store", "instructions", "tool_choice", "parallel_tool_calls"] {
        if let Some(value) = fields.get(key) {
            echo.insert(key.into(), value.clone());
        }
    }
    Value::Object(echo)
}

fn object_of(raw: &[u8]) -> Result<Map<String, Value>, BadRequest> {
    match serde_json::from_slice(raw) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(BadRequest("the body must be a JSON object".into())),
        Err(e) => Err(BadRequest(format!("malformed JSON body: {e}"))),
    }
}

/// `GET /v1/responses/{id}`: a stored response of the caller's tenant.
pub async fn retrieve(req: Request, id: String, state: Arc<ProxyState>) -> Response {
    let result = async {
        let caller = admit(&req, &state).await?;
        let kept = state.responses.load(&caller.key.tenant, &id).await.map_err(|err| store_down("GET", err))?;
        kept.map(|kept| Response::ok().json(kept.response)).ok_or_else(|| not_found(&id))
    };
    result.await.unwrap_or_else(|err| err.error_response())
}

/// `GET /v1/responses/{id}/input_items`: the whole input a stored response answered (the
/// conversation it continued, then its own input), as a list, oldest first.
pub async fn input_items(req: Request, id: String, state: Arc<ProxyState>) -> Response {
    let result = async {
        let caller = admit(&req, &state).await?;
        let tenant = &caller.key.tenant;
        let kept = state.responses.load(tenant, &id).await.map_err(|err| store_down("GET", err))?;
        let kept = kept.ok_or_else(|| not_found(&id))?;
        let mut data = match &kept.previous {
            Some(previous) => {
                let retention = state.tenant_config(tenant).await.map_or(0, |t| t.snapshot.responses.retention_s);
                let history = state.responses.history(tenant, previous, retention).await;
                history.map_err(|err| store_down("GET", err))?.unwrap_or_default()
            }
            None => Vec::new(),
        };
        data.extend(kept.input);
        let id_of = |item: Option<&Value>| item.and_then(|i| i.get("id")).cloned().unwrap_or(Value::Null);
        let (first, last) = (id_of(data.first()), id_of(data.last()));
        Ok::<_, ProxyError>(
            Response::ok()
                .json(json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": false})),
        )
    };
    result.await.unwrap_or_else(|err| err.error_response())
}

/// `DELETE /v1/responses/{id}`: the response and its output items (a conversation that
/// continued it can no longer be continued past it).
pub async fn remove(req: Request, id: String, state: Arc<ProxyState>) -> Response {
    let result = async {
        let caller = admit(&req, &state).await?;
        let deleted = state.responses.delete(&caller.key.tenant, &id).await.map_err(|err| store_down("DELETE", err))?;
        if !deleted {
            return Err(not_found(&id));
        }
        Ok(Response::ok().json(json!({"id": id.as_str(), "object": "response", "deleted": true})))
    };
    result.await.unwrap_or_else(|err| err.error_response())
}

fn store_down(what: &'static str, err: store::StoreDown) -> ProxyError {
    tracing::warn!(error = %err.0, "{what} /v1/responses: the response store is unreachable");
    ProxyError::StoreUnavailable(what)
}

/// The same answer for an id never stored, expired, deleted or another tenant's.
fn not_found(id: &str) -> ProxyError {
    ProxyError::NotFound(format!("Response with id '{id}' not found."))
}

/// `GET /v1/responses`: Codex tries a WebSocket here when its provider says it supports them;
/// a 426 with an error object makes it fall back to HTTP at once. Anything else is a 405.
pub async fn upgrade(req: Request) -> Response {
    let websocket = req
        .headers()
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if websocket {
        let error = crate::error::openai_error(
            "Shield serves the Responses API over HTTP only: POST /v1/responses",
            "invalid_request_error",
            "websocket_unsupported",
            Value::Null,
        );
        return Response::build(http::StatusCode::UPGRADE_REQUIRED).json(error);
    }
    let error = crate::error::openai_error(
        "use POST /v1/responses",
        "invalid_request_error",
        "method_not_allowed",
        Value::Null,
    );
    Response::build(StatusCode::METHOD_NOT_ALLOWED).json(error)
}

/// The typed request, the names of the caller's freeform (`custom`) tools, and the tool types
/// dropped.
fn parse(fields: Map<String, Value>, sealer: &Sealer) -> Result<(ChatRequest, Vec<String>, Vec<String>), BadRequest> {
    let model = match fields.get("model") {
        Some(Value::String(model)) if !model.is_empty() => model.clone(),
        _ => return Err(BadRequest("`model` must be a non-empty string".into())),
    };
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut messages: Vec<Message> = Vec::new();
    let mut push = |role: Role, part: Part| match messages.last_mut() {
        Some(last) if last.role == role && role != Role::System => last.content.push(part),
        _ => messages.push(Message { role, content: vec![part] }),
    };
    match fields.get("input") {
        Some(Value::String(said)) => push(Role::User, Part::Text(said.as_str().into())),
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
                            Part::ToolResult { id: text(item, "call_id"), content: output.into(), is_error: false },
                        );
                    }
                    // Reasoning Shield sealed goes back to the model as the thinking it was;
                    // any other `encrypted_content` (and the summary) is not Shield's to send.
                    "reasoning" => {
                        let sealed = item.get("encrypted_content").and_then(Value::as_str).unwrap_or_default();
                        for part in sealer.open(sealed).into_iter().flatten() {
                            push(Role::Assistant, part);
                        }
                    }
                    // Kinds added later carry nothing Shield forwards.
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
                description: text(tool, "description").into(),
                schema: Schema::of_value(
                    tool.get("parameters").unwrap_or(&json!({"type": "object", "properties": {}})),
                ),
            }),
            // A freeform tool as a function taking its text in one string (`input`).
            Some("custom") => {
                let name = text(tool, "name");
                custom.push(name.clone());
                tools.push(Tool {
                    name,
                    description: text(tool, "description").into(),
                    schema: Schema::of_value(
                        &json!({"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}),
                    ),
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
        system: fields.get("instructions").and_then(Value::as_str).map(exchange::Text::from).into_iter().collect(),
        messages: messages.into(),
        tools: tools.into(),
        tool_choice,
        parallel_tool_calls: fields.get("parallel_tool_calls").and_then(Value::as_bool),
        max_tokens: fields.get("max_output_tokens").and_then(Value::as_u64),
        temperature: fields.get("temperature").and_then(Value::as_f64),
        top_p: fields.get("top_p").and_then(Value::as_f64),
        stop: Vec::new(),
        reasoning: effort.map(|effort| Reasoning { effort: Some(effort), fields: vec!["reasoning.effort"] }),
        format: fields.get("text").and_then(|t| t.get("format")).and_then(exchange::Format::of_openai),
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
        Some(Value::String(text)) => vec![Part::Text(text.as_str().into())],
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| match part.get("type").and_then(Value::as_str) {
                Some("input_text" | "output_text" | "text") => {
                    part.get("text").and_then(Value::as_str).map(|t| Part::Text(t.into()))
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

fn render(
    outcome: Outcome,
    request: &ChatRequest,
    echo: Echo,
    answer: Option<Value>,
    keeper: Option<Keeper>,
    codex: bool,
) -> Response {
    match outcome {
        Outcome::Relayed(response) => response,
        Outcome::InputBlocked { reason, .. } => refusal(Response::ok(), request, &reason, &echo),
        Outcome::Stream(start) => {
            let mut wire = wire::ResponsesWire::new(&request.model, echo.custom, echo.id, keeper);
            wire.reasoning(echo.sealer, echo.summaries);
            wire.echo(echo.fields);
            start.respond(Box::new(wire))
        }
        Outcome::Routed { routed, guardrails } => {
            routed_response(*routed, guardrails, request, &echo, answer, codex && request.stream())
        }
    }
}

fn routed_response(
    mut routed: crate::dispatch::Routed,
    guardrails: Vec<crate::guard::GuardrailRecord>,
    request: &ChatRequest,
    echo: &Echo,
    answer: Option<Value>,
    codex_stream: bool,
) -> Response {
    match std::mem::replace(&mut routed.result, RoutedResult::Unavailable) {
        RoutedResult::Answer { target, model, body, usage } => {
            let mut answer =
                answer.unwrap_or_else(|| response_of(&body.answer, &model, usage.unwrap_or_default(), echo));
            let x_shield = json!({"routing": routing_record(&routed, Some(&target)), "guardrail_results": guardrails});
            crate::json::set(&mut answer, &["x_shield"], x_shield);
            with_routing_headers(Response::ok(), &routed, Some(&target)).json(answer)
        }
        RoutedResult::Refusal { reason, target } => {
            routed.result = RoutedResult::Refusal { reason: reason.clone(), target: target.clone() };
            refusal(with_routing_headers(Response::ok(), &routed, target.as_deref()), request, &reason, echo)
        }
        RoutedResult::Refused { target, status, body } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            let error = crate::chat::refused_error(&target, status, body.as_deref());
            with_routing_headers(Response::build(status), &routed, Some(&target)).json(error)
        }
        RoutedResult::Unavailable => {
            let (status, message) = crate::pipeline::unavailable_message(&routed);
            if codex_stream && upstreams_rate_limited(&routed) {
                // Every target is out of quota for now: Codex waits and retries on this,
                // where it would give up on a 5xx after a few quick retries.
                let mut response = codex_rate_limited(UPSTREAM_RETRY_S, &message);
                let head = with_routing_headers(Response::ok(), &routed, None).finish();
                for (name, value) in head.headers() {
                    response.headers_mut().insert(name.clone(), value.clone());
                }
                return response;
            }
            let error = crate::error::openai_error(&message, "upstream_error", routed.halt.as_str(), Value::Null);
            with_routing_headers(Response::build(status), &routed, None).json(error)
        }
    }
}

/// How long Codex is told to wait when every target of the route was rate-limited upstream
/// (the upstreams' own reset hints park the targets; this is when to look again).
const UPSTREAM_RETRY_S: u64 = 5;

/// Whether a route failed only because its targets are out of quota: every attempt was
/// rate-limited, or none could be made because each target is parked after exhaustion.
fn upstreams_rate_limited(routed: &crate::dispatch::Routed) -> bool {
    use shield_core::outcome::Class;
    use shield_core::plan::Exclusion;
    if routed.attempts.is_empty() {
        !routed.excluded.is_empty() && routed.excluded.iter().all(|e| matches!(e.reason, Exclusion::Exhausted))
    } else {
        routed.attempts.iter().all(|a| a.class == Some(Class::RateLimited))
    }
}

/// A refusal (guardrail, deny rule, budget block): a response whose text is the reason,
/// marked `incomplete_details.reason: "content_filter"` (as a stream of events when the
/// caller asked for one).
fn refusal(mut head: ResponseBuilder, request: &ChatRequest, reason: &str, echo: &Echo) -> Response {
    if request.stream() {
        let mut wire = wire::ResponsesWire::new(&request.model, Vec::new(), echo.id.clone(), None);
        let events =
            crate::client_wire::ClientWire::blocked(&mut wire, reason, &request.model, Value::Null, Default::default());
        return head.insert_header(("content-type", "text/event-stream")).body(events);
    }
    let answer = exchange::Answer {
        blocks: vec![Block::Text(reason.to_string())],
        stop: Some(Stop::Refusal),
        ..Default::default()
    };
    head.json(response_of(&answer, &request.model, Default::default(), echo))
}

/// A typed answer as a `response` object.
fn response_of(answer: &exchange::Answer, model: &str, usage: shield_core::usage::TokenUsage, echo: &Echo) -> Value {
    let id = &echo.id;
    let mut output = Vec::new();
    let text = answer.visible_text();
    // Consecutive thinking blocks make one reasoning item, before what follows them.
    let mut thinking: Vec<Value> = Vec::new();
    let mut summary = String::new();
    let reason = |thinking: &mut Vec<Value>, summary: &mut String, output: &mut Vec<Value>| {
        if thinking.is_empty() {
            return;
        }
        let n = output.len();
        let shown = if echo.summaries { summary.as_str() } else { "" };
        output.push(wire::reasoning_item(&format!("rs_{id}_{n}"), shown, echo.sealer.seal(thinking)));
        thinking.clear();
        summary.clear();
    };
    for block in &answer.blocks {
        match block {
            Block::Thinking { thinking: said, signature } => {
                thinking.push(reasoning::thinking_block(said, signature));
                summary.push_str(said);
                continue;
            }
            Block::RedactedThinking(data) => {
                thinking.push(reasoning::redacted_block(data));
                continue;
            }
            _ => reason(&mut thinking, &mut summary, &mut output),
        }
        let n = output.len();
        // The answer's text, whole, where its first part stands.
        if matches!(block, Block::Text(_)) && !text.is_empty() && !output.iter().any(|i| i["type"] == "message") {
            output.push(wire::message_item(&format!("msg_{id}_{n}"), &text));
        }
        if let Block::ToolUse { id: call_id, name, input } = block {
            output.push(wire::call_item(id, n, call_id, name, input, echo.custom.contains(name)));
        }
    }
    reason(&mut thinking, &mut summary, &mut output);
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
    if let Value::Object(echo) = &echo.fields {
        for (key, value) in echo {
            response.insert(key.clone(), value.clone());
        }
    }
    response.insert("error".into(), Value::Null);
    response.insert("incomplete_details".into(), incomplete);
    response.insert("usage".into(), wire::usage_json(&usage));
    Value::Object(response)
}
