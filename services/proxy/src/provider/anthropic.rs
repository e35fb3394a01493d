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
use shield_core::spliced::Spliced;
use shield_core::target::Target;
use shield_core::usage::TokenUsage;
use url::Url;

use shield_core::exchange::{self, Delta, Part, Role, Stop, ToolChoice};

mod message;
mod request;

pub use message::AnthropicAnswer;

use super::{Answer, Chunk, Completion, Decoded, Native, Provider, StreamDecoder, join, reset_hint};
use crate::body::ChatRequest;
use crate::egress::Failure;

pub struct Anthropic;

pub static ANTHROPIC: Anthropic = Anthropic;

/// `max_tokens` when neither the request nor the target's capabilities set one.
const DEFAULT_MAX_TOKENS: u64 = 4096;

const VERSION_HEADER: HeaderName = HeaderName::from_static("anthropic-version");
const BETA_HEADER: HeaderName = HeaderName::from_static("anthropic-beta");

impl Anthropic {
    /// A caller who spoke Anthropic's shape gets its own fields back as they were (model set to
    /// the target's, system messages folded for a model that does not take them); others'
    /// requests are converted.
    pub(super) fn request_body<'r>(&self, request: &'r ChatRequest, target: &Target, stream: bool) -> MessagesBody<'r> {
        let (mut body, converted) = match request.anthropic() {
            Some(origin) => {
                let mut body = origin.full().into_owned();
                body.insert("model".into(), Value::String(target.model.clone()));
                body.remove("stream");
                let takes_system = target.capabilities.as_ref().and_then(|c| c.system_messages).unwrap_or(false);
                if origin.system_messages && !takes_system {
                    fold_system_messages(&mut body);
                }
                if thinking_breaks_history(&origin.original, &request.exchange.messages) {
                    body.remove("thinking");
                }
                (body, None)
            }
            None => (messages_request(&request.exchange, target), Some(&*request.exchange)),
        };
        if stream {
            body.insert("stream".into(), Value::Bool(true));
        }
        for (key, value) in target.extra_body.iter().flatten() {
            body.insert(key.clone(), value.clone());
        }
        MessagesBody { fields: body, converted }
    }
}

/// A Messages body to write: its fields and, for a request of another shape, that request,
/// whose `system`, `messages` and `tools` are written straight into the body when it is
/// ([`request`]). Such a field among the fields (a target's `extra_body`) stands instead.
pub(super) struct MessagesBody<'r> {
    pub fields: Map<String, Value>,
    converted: Option<&'r exchange::Request>,
}

impl MessagesBody<'_> {
    pub(super) fn to_vec(&self) -> Vec<u8> {
        let Some(converted) = self.converted else { return shield_core::json_write::map_to_vec(&self.fields) };
        let size = super::history_size(converted) + request::tools_size(&converted.tools) + 64;
        let mut object = shield_core::json_write::Object::new(&self.fields, size);
        if request::has_system(converted) {
            object.field("system", |out| request::system(converted, out));
        }
        object.field("messages", |out| request::messages(converted, out));
        if !converted.tools.is_empty() {
            object.field("tools", |out| request::tools(&converted.tools, out));
        }
        object.finish()
    }
}

impl Anthropic {
    /// [`Anthropic::request_body`] for the common same-shape call, written from the caller's
    /// text as sent (issue 33: no tree of a 150 KB body cloned and serialised again). `None`
    /// when the body must change beyond its top-level fields (system messages to fold,
    /// thinking to drop) or was not kept.
    fn relayed_as_sent(&self, request: &ChatRequest, target: &Target, stream: bool) -> Option<Spliced> {
        let origin = request.anthropic()?;
        let sent = origin.verbatim.as_ref()?;
        let takes_system = target.capabilities.as_ref().and_then(|c| c.system_messages).unwrap_or(false);
        if (origin.system_messages && !takes_system)
            || thinking_breaks_history(&origin.original, &request.exchange.messages)
        {
            return None;
        }
        let model = Value::String(target.model.clone());
        let streams = Value::Bool(true);
        let mut set: Vec<(&str, &Value)> = vec![("model", &model)];
        if stream {
            set.push(("stream", &streams));
        }
        set.extend(target.extra_body.iter().flatten().map(|(key, value)| (key.as_str(), value)));
        Some(sent.relay(|key| key == "stream", &set))
    }
}

impl Provider for Anthropic {
    fn endpoint(&self, target: &Target) -> Result<Url, &'static str> {
        join(target, "/messages")
    }

    /// A caller in Anthropic's shape has its `anthropic-version` and `anthropic-beta` forwarded
    /// as sent (less the flags the target strips); others get the target's version.
    fn headers(&self, target: &Target, request: &ChatRequest, headers: &mut HeaderMap) {
        let options = target.anthropic.as_ref();
        let origin = request.anthropic();
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

    fn body(&self, request: &ChatRequest, target: &Target, stream: bool) -> Spliced {
        if let Some(body) = self.relayed_as_sent(request, target, stream) {
            return body;
        }
        self.request_body(request, target, stream).to_vec().into()
    }

    /// An OpenAI-shaped caller's fields the Messages API has no place for.
    fn dropped(&self, request: &ChatRequest, target: &Target) -> Vec<String> {
        if let Some(origin) = request.anthropic() {
            let breaks = thinking_breaks_history(&origin.original, &request.exchange.messages);
            return if breaks { vec!["thinking".into()] } else { Vec::new() };
        }
        // A JSON schema is rendered as `output_config.format`; JSON mode has no equivalent.
        // An effort is rendered as thinking when the target reasons.
        let schema = matches!(request.exchange.format, Some(exchange::Format::JsonSchema { .. }));
        let thinks =
            thinking_budget(&request.exchange, target, &mut max_tokens_of(&request.exchange, target)).is_some();
        let Some(fields) = request.openai_fields() else {
            // Another shape (the Responses API): the typed request names its own fields.
            let mut dropped: Vec<String> = Vec::new();
            if let Some(reasoning) = request.exchange.reasoning.as_ref().filter(|r| r.effort.is_some() && !thinks) {
                dropped.extend(reasoning.fields.iter().map(|f| f.to_string()));
            }
            if request.exchange.format == Some(exchange::Format::JsonObject) {
                dropped.push("text.format".into());
            }
            return dropped;
        };
        OPENAI_ONLY
            .iter()
            .filter(|key| fields.contains_key(**key) && !(schema && **key == "response_format"))
            .filter(|key| !(thinks && **key == "reasoning_effort"))
            .map(|key| key.to_string())
            .collect()
    }

    fn answer(&self, body: Vec<u8>) -> Option<Answer> {
        let (native, answer, usage) = AnthropicAnswer::read(body)?;
        Some(Answer { body: Completion { answer, native: Some(Native::Anthropic(native)) }, usage })
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

/// Whether the request asks for thinking while its last assistant turn calls tools without
/// starting with thinking: Anthropic refuses that ("a final assistant message must start with
/// a thinking block"). It happens when a turn was answered by a target of another flavor (a
/// failover on a mixed route): such a request goes without `thinking`, and the caller is told.
fn thinking_breaks_history(original: &Map<String, Value>, messages: &exchange::History) -> bool {
    let thinks =
        original.get("thinking").and_then(|t| t.get("type")).and_then(Value::as_str).is_some_and(|t| t != "disabled");
    // What each turn holds is known without typing the history (a directly read body has no
    // tree of it; a string content is one text part, as it is one text block).
    let last_assistant = || messages.last_turn(exchange::Role::Assistant);
    thinks && last_assistant().is_some_and(|turn| turn.calls_tools && !turn.starts_thinking)
}

/// For a model that does not take `role: "system"` messages inside `messages`: each becomes a
/// user turn in its place holding one `<system-reminder>` text block (Anthropic joins
/// consecutive user turns; the turns before keep their bytes, so a prompt cache still hits),
/// and one before any other turn joins the top-level `system`. One between an assistant's tool
/// calls and their results follows the results (a user turn must start with them).
fn fold_system_messages(body: &mut Map<String, Value>) {
    let Some(Value::Array(messages)) = body.remove("messages") else { return };
    let mut folded = Vec::with_capacity(messages.len());
    let mut leading = Vec::new();
    let mut held: Vec<Value> = Vec::new();
    let calls_tools = |message: &Value| {
        message.get("role").and_then(Value::as_str) == Some("assistant")
            && message
                .get("content")
                .and_then(Value::as_array)
                .is_some_and(|blocks| blocks.iter().any(|b| b.get("type").and_then(Value::as_str) == Some("tool_use")))
    };
    for message in messages {
        if message.get("role").and_then(Value::as_str) != Some("system") {
            // Held reminders are held only right after tool calls: this is the results' turn.
            folded.push(message);
            folded.append(&mut held);
            continue;
        }
        let text = match message.get("content") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(blocks)) => {
                blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
            }
            _ => String::new(),
        };
        if folded.is_empty() {
            leading.push(json!({"type": "text", "text": text}));
            continue;
        }
        let reminder = format!("<system-reminder>\n{text}\n</system-reminder>");
        let turn = json!({"role": "user", "content": [{"type": "text", "text": reminder}]});
        if folded.last().is_some_and(calls_tools) || !held.is_empty() {
            held.push(turn);
        } else {
            folded.push(turn);
        }
    }
    folded.append(&mut held);
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

/// The fields of the Messages request for `target` from a typed request of another shape,
/// but its `system`, `messages` and `tools`, which [`MessagesBody::to_vec`] writes.
fn messages_request(request: &exchange::Request, target: &Target) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("model".into(), Value::String(target.model.clone()));
    let mut max_tokens = max_tokens_of(request, target);
    let thinking = thinking_budget(request, target, &mut max_tokens);
    body.insert("max_tokens".into(), json!(max_tokens));
    if let Some(budget) = thinking {
        body.insert("thinking".into(), json!({"type": "enabled", "budget_tokens": budget}));
    }
    if !request.stop.is_empty() {
        body.insert("stop_sequences".into(), json!(request.stop));
    }
    // OpenAI's temperature runs to 2, Anthropic's to 1: the nearest value it takes. Thinking
    // takes neither.
    if let Some(temperature) = request.temperature.filter(|_| thinking.is_none()) {
        body.insert("temperature".into(), json!(temperature.clamp(0.0, 1.0)));
    }
    if let Some(top_p) = request.top_p.filter(|_| thinking.is_none()) {
        body.insert("top_p".into(), json!(top_p));
    }
    if let Some(choice) = &request.tool_choice {
        let mut choice = match choice {
            ToolChoice::Auto => json!({"type": "auto"}),
            ToolChoice::None => json!({"type": "none"}),
            ToolChoice::Any => json!({"type": "any"}),
            ToolChoice::Tool(name) => json!({"type": "tool", "name": name}),
        };
        if request.parallel_tool_calls == Some(false)
            && let Some(choice) = choice.as_object_mut()
        {
            choice.insert("disable_parallel_tool_use".into(), Value::Bool(true));
        }
        body.insert("tool_choice".into(), choice);
    }
    if let Some(user) = &request.user {
        body.insert("metadata".into(), json!({"user_id": user}));
    }
    // Structured output: Anthropic takes a JSON schema (and has no bare JSON mode, which
    // `dropped` names).
    if let Some(exchange::Format::JsonSchema { schema, .. }) = &request.format {
        body.insert("output_config".into(), json!({"format": {"type": "json_schema", "schema": schema}}));
    }
    body
}

/// `max_tokens`, which Anthropic requires: the caller's, else the target's output limit, else
/// a default.
pub(super) fn max_tokens_of(request: &exchange::Request, target: &Target) -> u64 {
    request
        .max_tokens
        .or_else(|| target.capabilities.as_ref().and_then(|c| c.max_output_tokens).map(u64::from))
        .unwrap_or(DEFAULT_MAX_TOKENS)
}

/// Reasoning asked for in another shape (`reasoning_effort`, the Responses API's
/// `reasoning.effort`) as extended thinking, when the target says it reasons
/// (`capabilities.reasoning`): the effort's budget. Anthropic counts thinking within
/// `max_tokens`: a caller's own cap, or the target's output limit, holds (the budget shrinks
/// to leave at least 1,024 tokens of answer, and below Anthropic's 1,024-token minimum there
/// is no thinking); without either, the budget is added to the default, up to
/// [`UNCAPPED_CEILING`]. Not when the history's last tool-calling turn lacks its thinking. Never with a forced tool choice, which thinking
/// refuses.
pub(super) fn thinking_budget(request: &exchange::Request, target: &Target, max_tokens: &mut u64) -> Option<u64> {
    const MIN_BUDGET: u64 = 1024;
    let effort = request.reasoning.as_ref()?.effort?;
    let reasons = target.capabilities.as_ref().and_then(|c| c.reasoning) == Some(true);
    if !reasons || matches!(request.tool_choice, Some(ToolChoice::Any | ToolChoice::Tool(_))) {
        return None;
    }
    // Thinking Shield could not hand back (a turn another flavor answered, a reasoning item
    // that did not open) would make Anthropic refuse the history: a tool-calling turn must
    // start with its thinking.
    let last_call = request.messages.iter().rev().find(|m| m.role == Role::Assistant);
    let starts_thinking = |turn: &exchange::Message| {
        let first = turn.content.iter().find(|p| !matches!(p, Part::Thinking { .. }) || anthropics_thinking(p));
        matches!(first, Some(Part::Thinking { .. } | Part::RedactedThinking(_)))
    };
    if let Some(turn) = last_call.filter(|m| m.content.iter().any(|p| matches!(p, Part::ToolUse { .. })))
        && !starts_thinking(turn)
    {
        return None;
    }
    let capped =
        request.max_tokens.is_some() || target.capabilities.as_ref().and_then(|c| c.max_output_tokens).is_some();
    if !capped {
        // Room for the budget over the default answer, within every current model's limit.
        *max_tokens = (*max_tokens + effort.budget_tokens()).min(UNCAPPED_CEILING);
    }
    let budget = effort.budget_tokens().min(max_tokens.saturating_sub(MIN_BUDGET));
    (budget >= MIN_BUDGET).then_some(budget)
}

/// `max_tokens` with thinking when neither the caller nor the target set one: Claude Opus 4's
/// output limit, the lowest of the current models that think. A target's
/// `capabilities.max_output_tokens` lifts it.
const UNCAPPED_CEILING: u64 = 32_000;

/// Whether a thinking part is one Anthropic signed (and so will take back).
pub(super) fn anthropics_thinking(part: &Part) -> bool {
    matches!(part, Part::Thinking { signature, .. } if !signature.is_empty() && !signature.starts_with(super::GEMINI_SIGNATURE))
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
        reasoning: 0,
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
