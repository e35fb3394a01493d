//! Anthropic's Messages API (flavor `anthropic`; wire facts in design/ANTHROPIC.md).
//!
//! Out: a caller in Anthropic's shape gets its own body back ([`AnthropicOrigin`]); an
//! OpenAI-shaped request becomes a Messages request — system messages to `system`, consecutive
//! same-role messages merged, tool calls and results to `tool_use` / `tool_result` blocks,
//! image data URLs to base64 image blocks, `stop` to `stop_sequences`, `max_tokens` always
//! set. In: a `message` becomes the typed answer (thinking and its signature included); stream
//! events become typed deltas, and nothing is yielded before the first content, so an `error`
//! event before it still fails over (the commit point is the first byte the client gets).
//!
//! [`AnthropicOrigin`]: shield_core::chat_request::AnthropicOrigin
//! Errors: 429 `rate_limit_error` (its reset headers are hints), 529 and 5xx fail over, a 400
//! saying the prompt is too long is `context_length`, spend limits and an empty credit balance
//! are exhaustion.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use shield_core::outcome::{Class, classify_status};
use shield_core::target::Target;
use shield_core::usage::TokenUsage;
use url::Url;

use shield_core::exchange::{self, Block, Delta, Stop};

use super::{Answer, Chunk, Completion, Decoded, Provider, StreamDecoder, join, reset_hint};
use crate::body::ChatRequest;
use crate::egress::Failure;

pub struct Anthropic;

pub static ANTHROPIC: Anthropic = Anthropic;

/// `max_tokens` when neither the request nor the target's capabilities set one.
const DEFAULT_MAX_TOKENS: u64 = 4096;

const VERSION_HEADER: HeaderName = HeaderName::from_static("anthropic-version");
const BETA_HEADER: HeaderName = HeaderName::from_static("anthropic-beta");

impl Provider for Anthropic {
    fn endpoint(&self, target: &Target) -> Result<Url, &'static str> {
        join(target, "/messages")
    }

    /// A caller in Anthropic's shape has its `anthropic-version` and `anthropic-beta` forwarded
    /// as sent (less the flags the target strips); others get the target's version.
    fn headers(&self, target: &Target, request: &ChatRequest, headers: &mut HeaderMap) {
        let options = target.anthropic.as_ref();
        let origin = request.anthropic.as_deref();
        let version = origin
            .and_then(|o| o.version.as_deref())
            .unwrap_or_else(|| options.map_or("2023-06-01", |a| a.version.as_str()));
        if let Ok(value) = HeaderValue::from_str(version) {
            headers.insert(VERSION_HEADER, value);
        }
        let strip = options.map_or(&[][..], |a| a.strip_beta.as_slice());
        if let Some(beta) = origin.and_then(|o| o.beta.as_deref()).and_then(|beta| forwarded_beta(beta, strip)) {
            headers.insert(BETA_HEADER, beta);
        }
    }

    /// A caller who spoke Anthropic's shape gets its own fields back as they were (model set to
    /// the target's, system messages folded for a model that does not take them); others'
    /// requests are converted.
    fn body(&self, request: &ChatRequest, target: &Target, stream: bool) -> Vec<u8> {
        let mut body = match request.anthropic.as_deref() {
            Some(origin) => {
                let mut body = origin.original.clone();
                body.insert("model".into(), Value::String(target.model.clone()));
                body.remove("stream");
                let takes_system = target.capabilities.as_ref().and_then(|c| c.system_messages).unwrap_or(false);
                if origin.system_messages && !takes_system {
                    fold_system_messages(&mut body);
                }
                body
            }
            None => messages_request(&request.fields, target),
        };
        if stream {
            body.insert("stream".into(), Value::Bool(true));
        }
        for (key, value) in target.extra_body.iter().flatten() {
            body.insert(key.clone(), value.clone());
        }
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// An OpenAI-shaped caller's fields the Messages API has no place for.
    fn dropped(&self, request: &ChatRequest, _target: &Target) -> Vec<String> {
        if request.anthropic.is_some() {
            return Vec::new();
        }
        OPENAI_ONLY.iter().filter(|key| request.fields.contains_key(**key)).map(|key| key.to_string()).collect()
    }

    fn answer(&self, body: Vec<u8>) -> Option<Answer> {
        let message: Value = serde_json::from_slice(&body).ok()?;
        if message.get("type").and_then(Value::as_str) != Some("message") {
            return None;
        }
        let blocks = message.get("content")?.as_array()?;
        let text = |block: &Value, key: &str| block.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
        let blocks = blocks
            .iter()
            .filter_map(|block| match block.get("type").and_then(Value::as_str) {
                Some("text") => Some(Block::Text(text(block, "text"))),
                Some("thinking") => {
                    Some(Block::Thinking { thinking: text(block, "thinking"), signature: text(block, "signature") })
                }
                Some("redacted_thinking") => Some(Block::RedactedThinking(text(block, "data"))),
                Some("tool_use") => Some(Block::ToolUse {
                    id: text(block, "id"),
                    name: text(block, "name"),
                    input: block.get("input").map_or_else(|| "{}".to_string(), Value::to_string),
                }),
                // Server-tool blocks and kinds added later have no place in the typed answer.
                _ => None,
            })
            .collect();
        let answer = exchange::Answer {
            id: text(&message, "id"),
            blocks,
            stop: message.get("stop_reason").and_then(Value::as_str).map(stop_of),
        };
        let usage = message.get("usage").map(usage_of);
        Some(Answer { body: Completion { answer, openai: None }, usage })
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(Decoder::default())
    }

    fn failure(&self, status: u16, headers: &HeaderMap, body: Vec<u8>) -> Failure {
        let class = classify(status, &body);
        let reset_hint_ms = matches!(class, Class::RateLimited | Class::QuotaExhausted | Class::CreditExhausted)
            .then(|| reset_hint(headers))
            .flatten();
        Failure { class, status: Some(status), body: Some(body), reset_hint_ms }
    }
}

/// Chat Completions fields that change the answer and that the Messages API has no place for.
const OPENAI_ONLY: [&str; 11] = [
    "response_format",
    "logprobs",
    "top_logprobs",
    "n",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "reasoning_effort",
    "audio",
    "prediction",
];

/// `anthropic-beta` as the caller sent it, less the flags the target strips; `None` when
/// nothing is left.
fn forwarded_beta(beta: &str, strip: &[String]) -> Option<HeaderValue> {
    if strip.is_empty() {
        return HeaderValue::from_str(beta).ok();
    }
    let kept: Vec<&str> =
        beta.split(',').map(str::trim).filter(|flag| !flag.is_empty() && !strip.iter().any(|s| s == flag)).collect();
    (!kept.is_empty()).then(|| HeaderValue::from_str(&kept.join(",")).ok()).flatten()
}

/// For a model that does not take `role: "system"` messages inside `messages`: each becomes a
/// user turn in its place holding one `<system-reminder>` text block (Anthropic joins
/// consecutive user turns; the turns before keep their bytes, so a prompt cache still hits),
/// and one before any other turn joins the top-level `system`.
fn fold_system_messages(body: &mut Map<String, Value>) {
    let Some(Value::Array(messages)) = body.remove("messages") else { return };
    let mut folded = Vec::with_capacity(messages.len());
    let mut leading = Vec::new();
    for message in messages {
        if message.get("role").and_then(Value::as_str) != Some("system") {
            folded.push(message);
            continue;
        }
        let text = text_blocks(message.get("content"))
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str).map(str::to_string))
            .collect::<Vec<_>>()
            .join("\n");
        if folded.is_empty() {
            leading.push(json!({"type": "text", "text": text}));
        } else {
            let reminder = format!("<system-reminder>\n{text}\n</system-reminder>");
            folded.push(json!({"role": "user", "content": [{"type": "text", "text": reminder}]}));
        }
    }
    body.insert("messages".into(), Value::Array(folded));
    if leading.is_empty() {
        return;
    }
    let mut system = match body.remove("system") {
        Some(Value::String(text)) if !text.is_empty() => vec![json!({"type": "text", "text": text})],
        Some(Value::Array(blocks)) => blocks,
        _ => Vec::new(),
    };
    system.extend(leading);
    body.insert("system".into(), Value::Array(system));
}

/// The Messages request for `target` from an OpenAI-shaped chat request.
fn messages_request(fields: &Map<String, Value>, target: &Target) -> Map<String, Value> {
    let mut system = Vec::new();
    let mut messages: Vec<(String, Vec<Value>)> = Vec::new();
    for message in fields.get("messages").and_then(Value::as_array).into_iter().flatten() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("user");
        let (role, blocks) = match role {
            "system" | "developer" => {
                system.extend(text_blocks(message.get("content")));
                continue;
            }
            "assistant" => {
                let mut blocks = text_blocks(message.get("content"));
                for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                    blocks.push(tool_use(call));
                }
                ("assistant", blocks)
            }
            "tool" => {
                let result = json!({"type": "tool_result",
                    "tool_use_id": message.get("tool_call_id").cloned().unwrap_or(json!("")),
                    "content": text_blocks(message.get("content"))});
                ("user", vec![result])
            }
            _ => ("user", content_blocks(message.get("content"))),
        };
        // Anthropic wants user and assistant turns to alternate: consecutive ones merge.
        match messages.last_mut() {
            Some((last, merged)) if last == role => merged.extend(blocks),
            _ => messages.push((role.to_string(), blocks)),
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), Value::String(target.model.clone()));
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    let messages: Vec<Value> =
        messages.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    body.insert("messages".into(), Value::Array(messages));
    let max_tokens = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| fields.get(*k).and_then(Value::as_u64))
        .or_else(|| target.capabilities.as_ref().and_then(|c| c.max_output_tokens).map(u64::from))
        .unwrap_or(DEFAULT_MAX_TOKENS);
    body.insert("max_tokens".into(), json!(max_tokens));
    match fields.get("stop") {
        Some(Value::String(stop)) => {
            body.insert("stop_sequences".into(), json!([stop]));
        }
        Some(Value::Array(stops)) if !stops.is_empty() => {
            body.insert("stop_sequences".into(), Value::Array(stops.clone()));
        }
        _ => {}
    }
    for key in ["temperature", "top_p", "top_k"] {
        if let Some(value) = fields.get(key).filter(|v| v.is_number()) {
            body.insert(key.into(), value.clone());
        }
    }
    // OpenAI's temperature runs to 2, Anthropic's to 1: the nearest value it takes.
    if let Some(temperature) = fields.get("temperature").and_then(Value::as_f64) {
        body.insert("temperature".into(), json!(temperature.clamp(0.0, 1.0)));
    }
    if let Some(tools) = fields.get("tools").and_then(Value::as_array).filter(|t| !t.is_empty()) {
        let tools: Vec<Value> = tools.iter().filter_map(tool_definition).collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    let parallel = fields.get("parallel_tool_calls").and_then(Value::as_bool);
    if let Some(mut choice) = fields.get("tool_choice").and_then(tool_choice) {
        if parallel == Some(false)
            && let Some(choice) = choice.as_object_mut()
        {
            choice.insert("disable_parallel_tool_use".into(), Value::Bool(true));
        }
        body.insert("tool_choice".into(), choice);
    }
    if let Some(user) = fields.get("user").and_then(Value::as_str) {
        body.insert("metadata".into(), json!({"user_id": user}));
    }
    body
}

/// Text content as text blocks (empty text dropped: Anthropic refuses empty blocks).
fn text_blocks(content: Option<&Value>) -> Vec<Value> {
    content_blocks(content).into_iter().filter(|b| b.get("type").and_then(Value::as_str) == Some("text")).collect()
}

/// OpenAI content (a string, or parts) as Messages content blocks.
fn content_blocks(content: Option<&Value>) -> Vec<Value> {
    let text = |t: &str| (!t.is_empty()).then(|| json!({"type": "text", "text": t}));
    match content {
        Some(Value::String(s)) => text(s).into_iter().collect(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| match part.get("type").and_then(Value::as_str) {
                Some("text") => text(part.get("text").and_then(Value::as_str).unwrap_or("")),
                Some("image_url") => image(part.pointer("/image_url/url").and_then(Value::as_str)?),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// `data:image/png;base64,…` → a base64 image block; an http(s) URL → a URL image block.
fn image(url: &str) -> Option<Value> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (media_type, data) = rest.split_once(";base64,")?;
        return Some(json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}));
    }
    (url.starts_with("https://") || url.starts_with("http://"))
        .then(|| json!({"type": "image", "source": {"type": "url", "url": url}}))
}

/// An OpenAI tool call as a `tool_use` block; arguments that are not a JSON object become `{}`.
fn tool_use(call: &Value) -> Value {
    let arguments = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("{}");
    let input = serde_json::from_str::<Value>(arguments).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
    json!({"type": "tool_use", "id": call.get("id").cloned().unwrap_or(json!("")),
        "name": call.pointer("/function/name").cloned().unwrap_or(json!("")), "input": input})
}

/// An OpenAI function tool as an Anthropic tool.
fn tool_definition(tool: &Value) -> Option<Value> {
    let function = tool.get("function")?;
    let mut out = Map::new();
    out.insert("name".into(), function.get("name")?.clone());
    if let Some(description) = function.get("description") {
        out.insert("description".into(), description.clone());
    }
    let schema = function.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    out.insert("input_schema".into(), schema);
    Some(Value::Object(out))
}

/// OpenAI `tool_choice` → Anthropic's: auto, none, required → any, a function → tool.
fn tool_choice(choice: &Value) -> Option<Value> {
    match choice {
        Value::String(s) if s == "auto" => Some(json!({"type": "auto"})),
        Value::String(s) if s == "none" => Some(json!({"type": "none"})),
        Value::String(s) if s == "required" => Some(json!({"type": "any"})),
        Value::Object(_) => Some(json!({"type": "tool", "name": choice.pointer("/function/name")?})),
        _ => None,
    }
}

/// `stop_reason` as the typed stop (ANTHROPIC.md; `stop_sequence` and `pause_turn` end the
/// turn).
fn stop_of(stop_reason: &str) -> Stop {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => Stop::MaxTokens,
        "tool_use" => Stop::ToolUse,
        "refusal" => Stop::Refusal,
        _ => Stop::EndTurn,
    }
}

/// Anthropic's usage: `input_tokens` excludes the cache reads and writes, which are counted
/// in their own fields; the normalised `input` counts all three.
fn usage_of(usage: &Value) -> TokenUsage {
    let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
    let (cache_read, cache_write) = (n("cache_read_input_tokens"), n("cache_creation_input_tokens"));
    TokenUsage {
        input: n("input_tokens") + cache_read + cache_write,
        output: n("output_tokens"),
        cache_read,
        cache_write,
    }
}

/// ANTHROPIC.md "Errors" as failure classes.
fn classify(status: u16, body: &[u8]) -> Class {
    let error: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let error = error.get("error").unwrap_or(&Value::Null);
    let kind = error.get("type").and_then(Value::as_str).unwrap_or("");
    let message = error.get("message").and_then(Value::as_str).unwrap_or("").to_ascii_lowercase();
    let code = error.pointer("/details/error_code").and_then(Value::as_str).unwrap_or("");
    let spend_limit = code == "enforced_spend_limit_reached" || message.contains("spend limit");
    match status {
        // The organisation's or workspace's spend limit: no retry helps until it resets.
        429 | 400 if spend_limit => Class::QuotaExhausted,
        429 => Class::RateLimited,
        402 => Class::CreditExhausted,
        400 if message.contains("credit balance") => Class::CreditExhausted,
        400 | 413 if message.contains("prompt is too long") || message.contains("too many tokens") => {
            Class::ContextLength
        }
        // Overloaded (Anthropic-wide, not this account): fail over.
        529 => Class::ServerError,
        _ if kind == "overloaded_error" => Class::ServerError,
        _ => classify_status(status, body),
    }
}

/// An `error` event's class.
fn classify_event(data: &Value) -> Class {
    match data.pointer("/error/type").and_then(Value::as_str) {
        Some("rate_limit_error") => Class::RateLimited,
        Some("invalid_request_error") => Class::ClientError,
        _ => Class::ServerError,
    }
}

/// Per-stream state: the message's id from `message_start`, which content block is which
/// tool call, and the usage (input from `message_start`, output from `message_delta`).
#[derive(Default)]
struct Decoder {
    id: String,
    usage: Option<TokenUsage>,
    /// `message_delta` brought the final output count.
    usage_final: bool,
    /// Content block index → tool call index, for tool-use blocks.
    tools: Vec<(u64, u32)>,
}

impl Decoder {
    fn tool_index(&self, block: u64) -> Option<u32> {
        self.tools.iter().find(|(b, _)| *b == block).map(|(_, i)| *i)
    }
}

impl StreamDecoder for Decoder {
    fn decode(&mut self, event: &str, data: &str, out: &mut Vec<Chunk>) -> Decoded {
        let Ok(value) = serde_json::from_str::<Value>(data) else { return Decoded::Malformed };
        let kind = value.get("type").and_then(Value::as_str).unwrap_or(event);
        let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
        match kind {
            "message_start" => {
                let message = value.get("message").unwrap_or(&Value::Null);
                self.id = text(message, "id");
                self.usage = message.get("usage").map(usage_of);
            }
            "content_block_start" => {
                let block = value.get("content_block").unwrap_or(&Value::Null);
                let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
                let delta = match block.get("type").and_then(Value::as_str) {
                    Some("text") => Some(text(block, "text")).filter(|t| !t.is_empty()).map(Delta::Text),
                    Some("tool_use") => {
                        let tool = self.tools.len() as u32;
                        self.tools.push((index, tool));
                        Some(Delta::ToolCall { index: tool, id: text(block, "id"), name: text(block, "name") })
                    }
                    Some("thinking") => Some(Delta::ThinkingStart),
                    Some("redacted_thinking") => Some(Delta::RedactedThinking(text(block, "data"))),
                    _ => None,
                };
                if let Some(delta) = delta {
                    out.push(Chunk::of(vec![delta]));
                }
            }
            "content_block_delta" => {
                let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
                let delta = value.get("delta").unwrap_or(&Value::Null);
                let delta = match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => Delta::Text(text(delta, "text")),
                    Some("input_json_delta") => {
                        let Some(tool) = self.tool_index(index) else { return Decoded::Malformed };
                        Delta::ToolArguments { index: tool, json: text(delta, "partial_json") }
                    }
                    Some("thinking_delta") => Delta::Thinking(text(delta, "thinking")),
                    Some("signature_delta") => Delta::Signature(text(delta, "signature")),
                    _ => return Decoded::Continue,
                };
                out.push(Chunk::of(vec![delta]));
            }
            "message_delta" => {
                if let Some(output) = value.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    let usage = self.usage.get_or_insert_with(TokenUsage::default);
                    usage.output = output;
                    self.usage_final = true;
                }
                let stop = value.pointer("/delta/stop_reason").and_then(Value::as_str).map(stop_of);
                out.push(Chunk { deltas: stop.map(Delta::Stop).into_iter().collect(), usage: true, openai: None });
            }
            "message_stop" => return Decoded::Done,
            "error" => return Decoded::Error(classify_event(&value), data.as_bytes().to_vec()),
            // `ping`, `content_block_stop`, and event types added later: nothing to relay.
            _ => {}
        }
        Decoded::Continue
    }

    fn message_id(&self) -> &str {
        &self.id
    }

    fn usage(&self) -> Option<TokenUsage> {
        self.usage
    }

    /// `message_start`'s output count is a placeholder; `message_delta`'s is the figure.
    fn usage_final(&self) -> bool {
        self.usage_final
    }
}

#[cfg(test)]
mod tests;
