//! Google's Gemini API as a target (`flavor: "gemini"`, issue 30; PROVIDERS.md §6, §8):
//! `POST {base_url}/models/{model}:generateContent`, or `:streamGenerateContent?alt=sse` for a
//! stream, the key in `x-goog-api-key`.
//!
//! Out: the typed request as `contents` (`user` / `model` turns of parts: `text`,
//! `inlineData`, `fileData`, `functionCall`, `functionResponse`), `systemInstruction` (the
//! system prompt and every system message: Gemini has no system turn), `tools` as
//! `functionDeclarations` with the caller's JSON Schema (`parametersJsonSchema`), `toolConfig`
//! from the tool choice, and `generationConfig` (limits, sampling, stops, structured output as
//! `responseJsonSchema`, an effort as `thinkingConfig` on a target that declares reasoning).
//! A tool result names its function, as Gemini requires: the name comes from the call it
//! answers. Thought signatures go back on the part they came with.
//!
//! In: `candidates[0]` — thought parts as thinking, text, function calls (ids minted when
//! Gemini sends none) — with a thought signature as a thinking block's signature before the
//! part it was on, so any caller shape can hand it back; `finishReason` as the stop (a function
//! call means a tool-use stop whatever the reason says); `usageMetadata` as usage (prompt
//! tokens include cached ones; output is candidates plus thoughts). A stream is a sequence of
//! whole `GenerateContentResponse`s with new parts only, ending at EOF; its usage is a running
//! total. Errors are Google's `{"error": {code, message, status, details}}`.

use http::header::HeaderMap;
use serde_json::{Map, Value, json};
use shield_core::exchange::{self, Block, Delta, Image, Part, Role, Stop, ToolChoice};
use shield_core::outcome::{Class, classify_status};
use shield_core::spliced::Spliced;
use shield_core::target::Target;
use shield_core::usage::TokenUsage;
use url::Url;

use super::{
    Answer, Chunk, Completion, Decoded, GEMINI_SIGNATURE, Provider, StreamDecoder, join, reset_hint, with_method,
};
use crate::body::ChatRequest;
use crate::egress::Failure;

pub struct Gemini;

pub static GEMINI: Gemini = Gemini;

/// What Google's documentation says to send as the signature of a function call that has
/// none (history another model wrote): Gemini 3 refuses a current-turn call without one.
const NO_SIGNATURE: &str = "skip_thought_signature_validator";

/// The largest thinking budget every current Gemini model that thinks accepts (2.5 Flash's).
const MAX_THINKING_BUDGET: u64 = 24_576;

impl Provider for Gemini {
    /// `{base_url}/models/{model}`; the method is added per call.
    fn endpoint(&self, target: &Target) -> Result<Url, &'static str> {
        if target.model.is_empty() || target.model.contains(['/', '?', '#', ':']) {
            return Err("a gemini target's model is a model id such as gemini-2.5-flash");
        }
        join(target, &format!("/models/{}", target.model))
    }

    fn call_url<'u>(&self, endpoint: &'u Url, stream: bool) -> std::borrow::Cow<'u, Url> {
        with_method(endpoint, if stream { ":streamGenerateContent?alt=sse" } else { ":generateContent" })
    }

    fn body(&self, request: &ChatRequest, target: &Target, _stream: bool) -> Spliced {
        let mut body = generate_request(&request.exchange, target);
        for (key, value) in target.extra_body.iter().flatten() {
            body.insert(key.clone(), value.clone());
        }
        shield_core::json_write::map_to_vec(&body).into()
    }

    /// What the request carries that Gemini has no place for, by the caller's field names.
    fn dropped(&self, request: &ChatRequest, target: &Target) -> Vec<String> {
        let mut dropped = Vec::new();
        let thinks = reasons(target);
        if let Some(reasoning) = request.exchange.reasoning.as_ref().filter(|r| r.effort.is_some() && !thinks) {
            dropped.extend(reasoning.fields.iter().map(|f| f.to_string()));
        }
        if let Some(fields) = request.openai_fields() {
            for key in ["logprobs", "top_logprobs", "n", "seed", "logit_bias", "audio", "prediction"] {
                if fields.contains_key(key) {
                    dropped.push(key.to_string());
                }
            }
        }
        dropped
    }

    fn answer(&self, body: Vec<u8>) -> Option<Answer> {
        let response: Value = serde_json::from_slice(&body).ok()?;
        let response = response.as_object()?;
        // A prompt refused outright has no candidates, only its feedback.
        let Some(candidate) = response.get("candidates").and_then(Value::as_array).and_then(|c| c.first()) else {
            response.get("promptFeedback")?.get("blockReason")?;
            let answer = exchange::Answer {
                id: text(response.get("responseId")),
                blocks: Vec::new(),
                stop: Some(Stop::Refusal),
            };
            let usage = response.get("usageMetadata").map(usage_of);
            return Some(Answer { body: Completion { answer, native: None }, usage });
        };
        let mut blocks = Vec::new();
        let mut calls = 0;
        for part in parts(candidate) {
            if let Some(signature) = part.get("thoughtSignature").and_then(Value::as_str) {
                blocks.push(Block::Thinking {
                    thinking: String::new(),
                    signature: format!("{GEMINI_SIGNATURE}{signature}"),
                });
            }
            if part.get("thought").and_then(Value::as_bool) == Some(true) {
                let thought = text(part.get("text"));
                match blocks.last_mut() {
                    Some(Block::Thinking { thinking, .. }) if thinking.is_empty() => *thinking = thought,
                    _ => blocks.push(Block::Thinking { thinking: thought, signature: String::new() }),
                }
            } else if let Some(call) = part.get("functionCall") {
                calls += 1;
                blocks.push(Block::ToolUse {
                    id: call_id(call),
                    name: text(call.get("name")),
                    input: call.get("args").map_or_else(|| "{}".to_string(), Value::to_string),
                });
            } else if let Some(said) = part.get("text").and_then(Value::as_str) {
                blocks.push(Block::Text(said.to_string()));
            }
        }
        let reason = candidate.get("finishReason").and_then(Value::as_str);
        if reason.is_some_and(failed_generation) {
            // Not an answer: the request goes to the next target.
            return None;
        }
        let stop = reason.map(|reason| stop_of(reason, calls > 0));
        let answer = exchange::Answer { id: text(response.get("responseId")), blocks, stop };
        let usage = response.get("usageMetadata").map(usage_of);
        Some(Answer { body: Completion { answer, native: None }, usage })
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(Decoder::default())
    }

    fn failure(&self, status: u16, headers: &HeaderMap, body: Vec<u8>) -> Failure {
        let body = unwrapped(body);
        let class = classify(status, &body);
        // A daily quota parks the target for the longest cooldown, whatever delay it names.
        let reset_hint_ms =
            (class == Class::RateLimited).then(|| retry_delay_ms(&body).or_else(|| reset_hint(headers))).flatten();
        // A bad key comes as a 400: it is the target's credential, as a 401 says.
        let status = if bad_key(&body) { 401 } else { status };
        Failure { class, status: Some(status), body: Some(body), reset_hint_ms }
    }
}

fn text(value: Option<&Value>) -> String {
    value.and_then(Value::as_str).unwrap_or_default().to_string()
}

fn parts(candidate: &Value) -> impl Iterator<Item = &Value> {
    candidate.pointer("/content/parts").and_then(Value::as_array).into_iter().flatten()
}

/// Gemini's id for a function call, or one minted (Gemini often sends none, and every caller
/// shape needs one to answer the call).
fn call_id(call: &Value) -> String {
    match call.get("id").and_then(Value::as_str).filter(|id| !id.is_empty()) {
        Some(id) => id.to_string(),
        None => format!("call_{}", uuid::Uuid::new_v4().simple()),
    }
}

fn reasons(target: &Target) -> bool {
    target.capabilities.as_ref().and_then(|c| c.reasoning) == Some(true)
}

/// The typed request as a `GenerateContentRequest`.
fn generate_request(request: &exchange::Request, target: &Target) -> Map<String, Value> {
    let mut system: Vec<Value> = request.system.iter().filter(|t| !t.is_empty()).map(|t| json!({"text": t})).collect();
    // A tool result must name its function: the call it answers says which.
    let names: std::collections::HashMap<&str, &str> = request
        .messages
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|p| if let Part::ToolUse { id, name, .. } = p { Some((id.as_str(), name.as_str())) } else { None })
        .collect();
    let mut contents: Vec<(&str, Vec<Value>)> = Vec::new();
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
            Role::Assistant => "model",
        };
        let mut parts = Vec::new();
        // A signature goes back on the part after it (the call or text it came with); only
        // Gemini's own, and the stand-in only on a turn's first call, as Gemini signs them.
        let mut signature: Option<&str> = None;
        let mut first_call = true;
        for part in &message.content {
            let mut out = match part {
                Part::Thinking { signature: s, .. } => {
                    signature = s.strip_prefix(GEMINI_SIGNATURE).filter(|s| !s.is_empty());
                    continue;
                }
                Part::Text(said) if said.is_empty() => continue,
                Part::Text(said) => json!({"text": said}),
                Part::Image(Image::Base64 { media_type, data }) => {
                    json!({"inlineData": {"mimeType": media_type, "data": data}})
                }
                Part::Image(Image::Url(url)) => json!({"fileData": {"mimeType": mime_of(url), "fileUri": url}}),
                Part::ToolUse { id, name, input } => {
                    // Gemini takes an object; arguments that are not one become `{}`.
                    let args =
                        serde_json::from_str::<Value>(input).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
                    if signature.is_none() && first_call {
                        signature = Some(NO_SIGNATURE);
                    }
                    first_call = false;
                    json!({"functionCall": {"id": id, "name": name, "args": args}})
                }
                Part::ToolResult { id, content, is_error } => {
                    let name = names.get(id.as_str()).copied().unwrap_or_default();
                    let response = if *is_error { json!({"error": content}) } else { json!({"content": content}) };
                    json!({"functionResponse": {"id": id, "name": name, "response": response}})
                }
                // Redacted thinking and other shapes' own parts have no place here.
                Part::RedactedThinking(_) | Part::Opaque { .. } => continue,
            };
            if let (Some(s), Some(fields)) = (signature.take(), out.as_object_mut()) {
                fields.insert("thoughtSignature".into(), json!(s));
            }
            parts.push(out);
        }
        if parts.is_empty() {
            continue;
        }
        match contents.last_mut() {
            Some((last, merged)) if *last == role => merged.extend(parts),
            _ => contents.push((role, parts)),
        }
    }
    let mut body = Map::new();
    let contents: Vec<Value> =
        contents.into_iter().map(|(role, parts)| json!({"role": role, "parts": parts})).collect();
    body.insert("contents".into(), Value::Array(contents));
    if !system.is_empty() {
        body.insert("systemInstruction".into(), json!({"parts": system}));
    }
    if !request.tools.is_empty() {
        let declarations: Vec<Value> = request
            .tools
            .iter()
            .map(
                |tool| json!({"name": tool.name, "description": tool.description, "parametersJsonSchema": tool.schema.value()}),
            )
            .collect();
        body.insert("tools".into(), json!([{"functionDeclarations": declarations}]));
    }
    if let Some(choice) = &request.tool_choice {
        let config = match choice {
            ToolChoice::Auto => json!({"mode": "AUTO"}),
            ToolChoice::None => json!({"mode": "NONE"}),
            ToolChoice::Any => json!({"mode": "ANY"}),
            ToolChoice::Tool(name) => json!({"mode": "ANY", "allowedFunctionNames": [name]}),
        };
        body.insert("toolConfig".into(), json!({"functionCallingConfig": config}));
    }
    let mut generation = Map::new();
    if let Some(max_tokens) = request.max_tokens {
        generation.insert("maxOutputTokens".into(), json!(max_tokens));
    }
    if let Some(temperature) = request.temperature {
        generation.insert("temperature".into(), json!(temperature));
    }
    if let Some(top_p) = request.top_p {
        generation.insert("topP".into(), json!(top_p));
    }
    if !request.stop.is_empty() {
        generation.insert("stopSequences".into(), json!(request.stop));
    }
    match &request.format {
        Some(exchange::Format::JsonSchema { schema, .. }) => {
            generation.insert("responseMimeType".into(), json!("application/json"));
            generation.insert("responseJsonSchema".into(), schema.clone());
        }
        Some(exchange::Format::JsonObject) => {
            generation.insert("responseMimeType".into(), json!("application/json"));
        }
        None => {}
    }
    if let Some(effort) = request.reasoning.as_ref().and_then(|r| r.effort).filter(|_| reasons(target)) {
        // Gemini 2.5 Flash takes at most 24,576; thinking counts within `maxOutputTokens`,
        // so a cap leaves room for the answer.
        let mut budget = effort.budget_tokens().min(MAX_THINKING_BUDGET);
        if let Some(max_tokens) = request.max_tokens {
            budget = budget.min(max_tokens / 2);
        }
        generation.insert("thinkingConfig".into(), json!({"thinkingBudget": budget, "includeThoughts": true}));
    }
    if !generation.is_empty() {
        body.insert("generationConfig".into(), Value::Object(generation));
    }
    body
}

/// An image URL's media type, from its extension (Gemini needs one for `fileData`).
fn mime_of(url: &str) -> &'static str {
    let path = url.split(['?', '#']).next().unwrap_or_default().to_ascii_lowercase();
    if path.ends_with(".png") {
        "image/png"
    } else if path.ends_with(".gif") {
        "image/gif"
    } else if path.ends_with(".webp") {
        "image/webp"
    } else {
        "image/jpeg"
    }
}

/// Finish reasons that say the model produced nothing usable: a failed generation, not an
/// answer (it fails over as a bad response).
fn failed_generation(reason: &str) -> bool {
    matches!(reason, "MALFORMED_FUNCTION_CALL" | "UNEXPECTED_TOOL_CALL" | "TOO_MANY_TOOL_CALLS")
}

/// `finishReason` as the typed stop; a function call is a tool-use stop whatever it says.
fn stop_of(reason: &str, called: bool) -> Stop {
    match reason {
        _ if called => Stop::ToolUse,
        "MAX_TOKENS" => Stop::MaxTokens,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => Stop::Refusal,
        _ => Stop::EndTurn,
    }
}

/// `usageMetadata`: the prompt count includes cached tokens, as Shield's input does; output is
/// what the candidates and the thoughts took.
fn usage_of(usage: &Value) -> TokenUsage {
    let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
    let thoughts = n("thoughtsTokenCount");
    TokenUsage {
        input: n("promptTokenCount"),
        output: n("candidatesTokenCount").saturating_add(thoughts),
        cache_read: n("cachedContentTokenCount"),
        cache_write: 0,
        reasoning: thoughts,
    }
}

/// Google sometimes sends its error object inside a one-element array.
fn unwrapped(body: Vec<u8>) -> Vec<u8> {
    match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Array(mut items)) if items.len() == 1 && items.first().is_some_and(|e| e.get("error").is_some()) => {
            items.pop().map_or(body, |error| error.to_string().into_bytes())
        }
        _ => body,
    }
}

/// Whether an error says the API key is not valid (`API_KEY_INVALID`).
fn bad_key(body: &[u8]) -> bool {
    let error: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    error.pointer("/error/details").is_some_and(|d| d.to_string().contains("API_KEY_INVALID"))
}

/// PROVIDERS.md §8: Google's error statuses as failure classes.
fn classify(status: u16, body: &[u8]) -> Class {
    let error: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let error = error.get("error").unwrap_or(&Value::Null);
    let message = error.get("message").and_then(Value::as_str).unwrap_or_default().to_ascii_lowercase();
    let details = error.get("details").map(Value::to_string).unwrap_or_default();
    match (status, error.get("status").and_then(Value::as_str).unwrap_or_default()) {
        // A daily quota does not come back within a retry.
        (429, _) if details.contains("PerDay") => Class::QuotaExhausted,
        (429, _) | (_, "RESOURCE_EXHAUSTED") => Class::RateLimited,
        (400, _) if message.contains("token count") || message.contains("exceeds the maximum number of tokens") => {
            Class::ContextLength
        }
        (500..=599, _) | (_, "UNAVAILABLE" | "INTERNAL" | "DEADLINE_EXCEEDED") => Class::ServerError,
        _ => classify_status(status, body),
    }
}

/// `google.rpc.RetryInfo.retryDelay` (a Duration such as `"37s"` or `"1.5s"`) in ms.
fn retry_delay_ms(body: &[u8]) -> Option<u64> {
    let error: Value = serde_json::from_slice(body).ok()?;
    let details = error.pointer("/error/details")?.as_array()?;
    let delay = details.iter().find_map(|d| d.get("retryDelay").and_then(Value::as_str))?;
    let seconds: f64 = delay.strip_suffix('s')?.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| (seconds * 1000.0).round() as u64)
}

/// Per-stream state: the response id, whether a thinking block is open, the calls so far, and
/// the running usage.
#[derive(Default)]
struct Decoder {
    id: String,
    thinking: bool,
    calls: u32,
    usage: Option<TokenUsage>,
    usage_final: bool,
}

impl StreamDecoder for Decoder {
    fn decode(&mut self, _event: &str, data: &str, out: &mut Vec<Chunk>) -> Decoded {
        let Ok(mut value) = serde_json::from_str::<Value>(data) else { return Decoded::Malformed };
        if let Value::Array(items) = &mut value
            && items.len() == 1
        {
            value = items.pop().unwrap_or(Value::Null);
        }
        if value.get("error").is_some() {
            let status = value.pointer("/error/code").and_then(Value::as_u64).unwrap_or(500);
            let status = u16::try_from(status).unwrap_or(500);
            return Decoded::Error(classify(status, data.as_bytes()), data.as_bytes().to_vec());
        }
        if !value.is_object() {
            return Decoded::Malformed;
        }
        if self.id.is_empty() {
            self.id = text(value.get("responseId"));
        }
        let mut deltas = Vec::new();
        let candidate = value.get("candidates").and_then(Value::as_array).and_then(|c| c.first());
        for part in candidate.into_iter().flat_map(parts) {
            if let Some(signature) = part.get("thoughtSignature").and_then(Value::as_str) {
                if !std::mem::replace(&mut self.thinking, true) {
                    deltas.push(Delta::ThinkingStart);
                }
                deltas.push(Delta::Signature(format!("{GEMINI_SIGNATURE}{signature}")));
            }
            if part.get("thought").and_then(Value::as_bool) == Some(true) {
                if !std::mem::replace(&mut self.thinking, true) {
                    deltas.push(Delta::ThinkingStart);
                }
                deltas.push(Delta::Thinking(text(part.get("text"))));
                continue;
            }
            self.thinking = false;
            if let Some(call) = part.get("functionCall") {
                let index = self.calls;
                self.calls += 1;
                deltas.push(Delta::ToolCall { index, id: call_id(call), name: text(call.get("name")) });
                let args = call.get("args").map_or_else(|| "{}".to_string(), Value::to_string);
                deltas.push(Delta::ToolArguments { index, json: args });
            } else if let Some(said) = part.get("text").and_then(Value::as_str).filter(|t| !t.is_empty()) {
                deltas.push(Delta::Text(said.to_string()));
            }
        }
        let stop = candidate.and_then(|c| c.get("finishReason")).and_then(Value::as_str);
        if stop.is_some_and(failed_generation) {
            return Decoded::Error(Class::BadResponse, data.as_bytes().to_vec());
        }
        if let Some(reason) = stop {
            deltas.push(Delta::Stop(stop_of(reason, self.calls > 0)));
        } else if candidate.is_none() && value.pointer("/promptFeedback/blockReason").is_some() {
            deltas.push(Delta::Stop(Stop::Refusal));
        }
        let usage = value.get("usageMetadata").map(usage_of);
        if let Some(usage) = usage {
            self.usage = Some(usage);
            self.usage_final |= stop.is_some();
        }
        if !deltas.is_empty() || usage.is_some() {
            out.push(Chunk { deltas, usage: usage.is_some(), openai: None });
        }
        Decoded::Continue
    }

    fn message_id(&self) -> &str {
        &self.id
    }

    fn usage(&self) -> Option<TokenUsage> {
        self.usage
    }

    /// The running total is final with the chunk that says why the answer ended.
    fn usage_final(&self) -> bool {
        self.usage_final
    }
}

#[cfg(test)]
mod tests;
