//! The typed exchange as Bedrock's Converse body, and Converse's answers and stream events as
//! typed answers and deltas (PROVIDERS.md §1, §2).
//!
//! Out: `system` (the system prompt and every system message: Converse has no system turn),
//! `messages` of `user` / `assistant` turns (consecutive turns of one role merged, as Converse
//! requires alternation) whose blocks are `text`, `image` (inline bytes; a URL has no place),
//! `toolUse`, `toolResult`, and `reasoningContent` (Claude's signed thinking, handed back; a
//! Gemini signature or unsigned thought is not), `inferenceConfig` (limits, sampling clamped to
//! Converse's 0–1, stops), `toolConfig` (tools as `toolSpec`s with the caller's JSON Schema, the
//! choice; "none" keeps the tools a history needs but asks for none), and an effort as Claude's
//! `thinking` in `additionalModelRequestFields` on a target that declares reasoning.
//!
//! In: `output.message.content` (text, tool use, reasoning with its signature, redacted
//! reasoning), `stopReason`, `usage` (cache reads and writes included in input, as Shield
//! counts it, whichever way the total says Bedrock counted them). A stream's events are
//! `messageStart`, `contentBlockStart` (only tool calls open with it; text and reasoning open
//! with their first delta), `contentBlockDelta`, `contentBlockStop`, `messageStop` and
//! `metadata` (usage, last); an `exception` frame is an error inside the stream.

use std::collections::HashMap;

use serde_json::{Map, Value, json};
use shield_core::exchange::{self, Block, Delta, Image, Part, Role, Stop, ToolChoice};
use shield_core::outcome::Class;
use shield_core::target::Target;
use shield_core::usage::TokenUsage;

use super::frames::EXCEPTION;
use crate::body::ChatRequest;
use crate::provider::anthropic::{anthropics_thinking, max_tokens_of, thinking_budget};
use crate::provider::{Answer, Chunk, Completion, Decoded, StreamDecoder};

fn text(value: Option<&Value>) -> String {
    value.and_then(Value::as_str).unwrap_or_default().to_string()
}

/// Whether the target's model takes Claude's extended thinking (declared by the operator).
fn reasons(target: &Target) -> bool {
    target.capabilities.as_ref().and_then(|c| c.reasoning) == Some(true)
}

/// An image's Converse format from its media type; `None` for one Converse does not take.
fn image_format(media_type: &str) -> Option<&'static str> {
    match media_type.to_ascii_lowercase().as_str() {
        "image/png" => Some("png"),
        "image/jpeg" | "image/jpg" => Some("jpeg"),
        "image/gif" => Some("gif"),
        "image/webp" => Some("webp"),
        _ => None,
    }
}

/// One part as a Converse content block; `None` when it has no place in Converse.
fn block_of(part: &Part) -> Option<Value> {
    Some(match part {
        Part::Text(said) if said.is_empty() => return None,
        Part::Text(said) => json!({"text": said}),
        Part::Image(Image::Base64 { media_type, data }) => {
            json!({"image": {"format": image_format(media_type)?, "source": {"bytes": data}}})
        }
        Part::Image(Image::Url(_)) => return None,
        Part::ToolUse { id, name, input } => {
            // Converse takes an object; arguments that are not one become `{}`.
            let input = serde_json::from_str::<Value>(input).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
            json!({"toolUse": {"toolUseId": id, "name": name, "input": input}})
        }
        Part::ToolResult { id, content, is_error } => {
            let status = if *is_error { "error" } else { "success" };
            json!({"toolResult": {"toolUseId": id, "content": [{"text": content}], "status": status}})
        }
        Part::Thinking { thinking, signature } if anthropics_thinking(part) => {
            json!({"reasoningContent": {"reasoningText": {"text": thinking, "signature": signature}}})
        }
        Part::Thinking { .. } => return None,
        Part::RedactedThinking(data) => json!({"reasoningContent": {"redactedContent": data}}),
        Part::Opaque { text, .. } if text.is_empty() => return None,
        Part::Opaque { text, .. } => json!({"text": text}),
    })
}

/// The typed request as a Converse body (without `modelId`, which is in the path).
pub fn request(request: &exchange::Request, target: &Target) -> Map<String, Value> {
    let mut system: Vec<Value> = request.system.iter().filter(|t| !t.is_empty()).map(|t| json!({"text": t})).collect();
    let mut messages: Vec<(&str, Vec<Value>)> = Vec::new();
    let mut has_tool_blocks = false;
    for message in &request.messages {
        let role = match message.role {
            Role::System => {
                system.extend(message.content.iter().filter_map(|p| match p {
                    Part::Text(t) if !t.is_empty() => Some(json!({"text": t})),
                    _ => None,
                }));
                continue;
            }
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        let blocks: Vec<Value> = message.content.iter().filter_map(block_of).collect();
        has_tool_blocks |= blocks.iter().any(|b| b.get("toolUse").is_some() || b.get("toolResult").is_some());
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some((last, merged)) if *last == role => merged.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }
    let mut body = Map::new();
    let messages: Vec<Value> =
        messages.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    body.insert("messages".into(), Value::Array(messages));
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    let mut max_tokens = max_tokens_of(request, target);
    let thinking = thinking_budget(request, target, &mut max_tokens).filter(|_| reasons(target));
    let mut inference = Map::new();
    if request.max_tokens.is_some() || thinking.is_some() {
        inference.insert("maxTokens".into(), json!(max_tokens));
    }
    // Claude refuses sampling settings with thinking on.
    if thinking.is_none() {
        if let Some(temperature) = request.temperature {
            inference.insert("temperature".into(), json!(temperature.clamp(0.0, 1.0)));
        }
        if let Some(top_p) = request.top_p {
            inference.insert("topP".into(), json!(top_p.clamp(0.0, 1.0)));
        }
    }
    if !request.stop.is_empty() {
        inference.insert("stopSequences".into(), json!(request.stop));
    }
    if !inference.is_empty() {
        body.insert("inferenceConfig".into(), Value::Object(inference));
    }
    let choice = match &request.tool_choice {
        None | Some(ToolChoice::Auto) => Some(json!({"auto": {}})),
        Some(ToolChoice::Any) => Some(json!({"any": {}})),
        Some(ToolChoice::Tool(name)) => Some(json!({"tool": {"name": name}})),
        Some(ToolChoice::None) => None,
    };
    let offers_tools = !request.tools.is_empty() && (choice.is_some() || has_tool_blocks);
    if offers_tools {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                let mut spec = Map::new();
                spec.insert("name".into(), json!(tool.name));
                if !tool.description.is_empty() {
                    spec.insert("description".into(), json!(tool.description));
                }
                spec.insert("inputSchema".into(), json!({"json": tool.schema.value()}));
                json!({"toolSpec": spec})
            })
            .collect();
        let mut config = Map::new();
        config.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = choice.filter(|_| request.tool_choice.is_some()) {
            config.insert("toolChoice".into(), choice);
        }
        body.insert("toolConfig".into(), Value::Object(config));
    }
    if let Some(budget) = thinking {
        body.insert(
            "additionalModelRequestFields".into(),
            json!({"thinking": {"type": "enabled", "budget_tokens": budget}}),
        );
    }
    body
}

/// What the request carries that Converse has no place for, by the caller's field names.
pub fn dropped(request: &ChatRequest, target: &Target) -> Vec<String> {
    let mut dropped = Vec::new();
    let thinks = reasons(target)
        && thinking_budget(&request.exchange, target, &mut max_tokens_of(&request.exchange, target)).is_some();
    if let Some(reasoning) = request.exchange.reasoning.as_ref().filter(|r| r.effort.is_some() && !thinks) {
        dropped.extend(reasoning.fields.iter().map(|f| f.to_string()));
    }
    let images_by_url = request
        .exchange
        .messages
        .iter()
        .flat_map(|m| m.content.iter())
        .any(|p| matches!(p, Part::Image(Image::Url(_))));
    if images_by_url {
        dropped.push("image_url".into());
    }
    match request.openai_fields() {
        Some(fields) => {
            for key in ["response_format", "logprobs", "top_logprobs", "n", "seed", "logit_bias", "audio", "prediction"]
            {
                if fields.contains_key(key) {
                    dropped.push(key.to_string());
                }
            }
        }
        None if request.exchange.format.is_some() => {
            let field = if request.anthropic().is_some() { "output_config.format" } else { "text.format" };
            dropped.push(field.into());
        }
        None => {}
    }
    dropped
}

/// Stop reasons that say the model produced nothing usable (it fails over as a bad response).
fn failed_generation(reason: &str) -> bool {
    matches!(reason, "malformed_model_output" | "malformed_tool_use")
}

fn stop_of(reason: &str) -> Stop {
    match reason {
        "tool_use" => Stop::ToolUse,
        "max_tokens" | "model_context_window_exceeded" => Stop::MaxTokens,
        "guardrail_intervened" | "content_filtered" => Stop::Refusal,
        _ => Stop::EndTurn,
    }
}

/// Converse's usage. Whether `inputTokens` counts cached tokens is not documented: the total
/// says (it is their sum with output when it does not).
fn usage_of(usage: &Value) -> TokenUsage {
    let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
    let (input, output) = (n("inputTokens"), n("outputTokens"));
    let (cache_read, cache_write) = (n("cacheReadInputTokens"), n("cacheWriteInputTokens"));
    let cached = cache_read.saturating_add(cache_write);
    let cached_apart = n("totalTokens") >= input.saturating_add(output).saturating_add(cached);
    TokenUsage {
        input: if cached_apart { input.saturating_add(cached) } else { input },
        output,
        cache_read,
        cache_write,
        reasoning: 0,
    }
}

/// A message id for an answer: Converse gives none.
fn minted_id() -> String {
    format!("bedrock-{}", uuid::Uuid::new_v4().simple())
}

/// A 2xx Converse body as a typed answer.
pub fn answer(body: &[u8]) -> Option<Answer> {
    let response: Value = serde_json::from_slice(body).ok()?;
    let content = response.pointer("/output/message/content")?.as_array()?;
    let mut blocks = Vec::new();
    for block in content {
        if let Some(said) = block.get("text").and_then(Value::as_str) {
            blocks.push(Block::Text(said.to_string()));
        } else if let Some(call) = block.get("toolUse") {
            blocks.push(Block::ToolUse {
                id: text(call.get("toolUseId")),
                name: text(call.get("name")),
                input: call.get("input").map_or_else(|| "{}".to_string(), Value::to_string),
            });
        } else if let Some(reasoning) = block.get("reasoningContent") {
            if let Some(said) = reasoning.get("reasoningText") {
                blocks
                    .push(Block::Thinking { thinking: text(said.get("text")), signature: text(said.get("signature")) });
            } else if let Some(data) = reasoning.get("redactedContent").and_then(Value::as_str) {
                blocks.push(Block::RedactedThinking(data.to_string()));
            }
        }
    }
    let reason = response.get("stopReason").and_then(Value::as_str);
    if reason.is_some_and(failed_generation) {
        return None;
    }
    let answer = exchange::Answer { id: minted_id(), blocks, stop: reason.map(stop_of) };
    let usage = response.get("usage").map(usage_of);
    Some(Answer { body: Completion { answer, native: None }, usage })
}

/// Per-stream state: the minted id, which content block is a tool call (its index among the
/// answer's calls), whether a reasoning block is open, the stop reason, and usage.
#[derive(Default)]
pub struct Decoder {
    id: String,
    calls: HashMap<u64, u32>,
    thinking: Option<u64>,
    /// `messageStop`'s reason, until `metadata` brings the usage.
    stop: Option<Stop>,
    usage: Option<TokenUsage>,
}

impl StreamDecoder for Decoder {
    fn decode(&mut self, event: &str, data: &str, out: &mut Vec<Chunk>) -> Decoded {
        if event == EXCEPTION {
            return Decoded::Error(super::classify_exception(data.as_bytes()), data.as_bytes().to_vec());
        }
        let Ok(Value::Object(payload)) = serde_json::from_str::<Value>(data) else { return Decoded::Malformed };
        if self.id.is_empty() {
            self.id = minted_id();
        }
        let index = payload.get("contentBlockIndex").and_then(Value::as_u64).unwrap_or(0);
        let mut deltas = Vec::new();
        match event {
            "messageStart" => {}
            "contentBlockStart" => {
                if let Some(call) = payload.get("start").and_then(|s| s.get("toolUse")) {
                    let n = self.calls.len() as u32;
                    self.calls.insert(index, n);
                    deltas.push(Delta::ToolCall {
                        index: n,
                        id: text(call.get("toolUseId")),
                        name: text(call.get("name")),
                    });
                }
            }
            "contentBlockDelta" => {
                let Some(delta) = payload.get("delta") else { return Decoded::Malformed };
                if let Some(said) = delta.get("text").and_then(Value::as_str) {
                    deltas.push(Delta::Text(said.to_string()));
                } else if let Some(call) = delta.get("toolUse") {
                    let Some(&n) = self.calls.get(&index) else { return Decoded::Malformed };
                    deltas.push(Delta::ToolArguments { index: n, json: text(call.get("input")) });
                } else if let Some(reasoning) = delta.get("reasoningContent") {
                    if self.thinking != Some(index) {
                        self.thinking = Some(index);
                        if reasoning.get("redactedContent").is_none() {
                            deltas.push(Delta::ThinkingStart);
                        }
                    }
                    if let Some(said) = reasoning.get("text").and_then(Value::as_str) {
                        deltas.push(Delta::Thinking(said.to_string()));
                    } else if let Some(signature) = reasoning.get("signature").and_then(Value::as_str) {
                        deltas.push(Delta::Signature(signature.to_string()));
                    } else if let Some(data) = reasoning.get("redactedContent").and_then(Value::as_str) {
                        deltas.push(Delta::RedactedThinking(data.to_string()));
                    }
                } else {
                    return Decoded::Malformed;
                }
            }
            "contentBlockStop" => {
                if self.thinking == Some(index) {
                    self.thinking = None;
                }
            }
            "messageStop" => {
                let reason = payload.get("stopReason").and_then(Value::as_str).unwrap_or("end_turn");
                if failed_generation(reason) {
                    return Decoded::Error(Class::BadResponse, data.as_bytes().to_vec());
                }
                // Held for `metadata`, which follows with the usage: callers' wires report both
                // together (a stop with its usage, as the other providers send them).
                self.stop = Some(stop_of(reason));
            }
            "metadata" => {
                let usage = payload.get("usage").map(usage_of);
                self.usage = usage.or(self.usage);
                deltas.extend(self.stop.take().map(Delta::Stop));
                out.push(Chunk { deltas, usage: usage.is_some(), openai: None });
                return Decoded::Done;
            }
            _ => return Decoded::Malformed,
        }
        if !deltas.is_empty() {
            out.push(Chunk::of(deltas));
        }
        Decoded::Continue
    }

    fn message_id(&self) -> &str {
        &self.id
    }

    fn usage(&self) -> Option<TokenUsage> {
        self.usage
    }

    /// Usage comes once, in the last event.
    fn usage_final(&self) -> bool {
        self.usage.is_some()
    }
}
