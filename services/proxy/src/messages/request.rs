//! An Anthropic Messages request as the normalised chat request the pipeline routes, guards
//! and accounts, with what only Anthropic's shape has kept beside it, typed
//! ([`AnthropicOrigin`]): the caller's body as sent (an Anthropic target gets it back, so
//! thinking, documents, `cache_control` and server tools are never lost), its `anthropic-beta`
//! and `anthropic-version`, its reasoning controls, and what other flavors cannot take.
//!
//! The rules for other flavors (README "Callers in Anthropic's shape"):
//! * `role: "system"` messages inside `messages` stay where they stand (OpenAI's shape takes
//!   them anywhere).
//! * `thinking` and `output_config.effort` become the target's reasoning control when its
//!   capabilities say it has one (`reasoning_effort`), else they are dropped and named.
//! * `context_management`, `top_k`, `output_config.format`, server tools and MCP servers are
//!   dropped and named (`X-Shield-Dropped-Fields`); hints (`cache_control`, `service_tier`)
//!   are simply absent.
//! * Content only Anthropic can read (documents, search results, server-tool history, images
//!   by file id) makes the request need an Anthropic target; a route with none answers 400.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use shield_core::chat_request::{AnthropicOrigin, BadRequest, ChatRequest, Effort, MAX_MESSAGES, Reasoning};

/// The caller's Anthropic headers, forwarded as sent to Anthropic targets.
#[derive(Default)]
pub struct Headers {
    pub beta: Option<String>,
    pub version: Option<String>,
}

impl Headers {
    pub fn of(headers: &actix_web::http::header::HeaderMap) -> Headers {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        Headers { beta: text("anthropic-beta").filter(|b| !b.trim().is_empty()), version: text("anthropic-version") }
    }
}

fn bad(message: impl Into<String>) -> BadRequest {
    BadRequest(message.into())
}

/// What the conversion found that other flavors lack.
#[derive(Default)]
struct Found {
    requires: Vec<String>,
    unmapped: Vec<String>,
}

/// Checks a Messages body the way Anthropic's API does and converts it. `count_only` is the
/// token-counting endpoint's body, which has no `max_tokens`.
pub fn normalise(body: &[u8], headers: Headers, count_only: bool) -> Result<ChatRequest, BadRequest> {
    let value: Value = serde_json::from_slice(body).map_err(|e| bad(format!("malformed JSON body: {e}")))?;
    let Value::Object(original) = value else { return Err(bad("the body must be a JSON object")) };
    let model = match original.get("model") {
        Some(Value::String(model)) if !model.is_empty() => model.clone(),
        Some(_) => return Err(bad("model: must be a non-empty string")),
        None => return Err(bad("model: Field required")),
    };
    let max_tokens = original.get("max_tokens");
    if !count_only && max_tokens.and_then(Value::as_u64).is_none_or(|n| n < 1) {
        return Err(bad("max_tokens: Field required (a positive integer)"));
    }
    let messages = match original.get("messages") {
        Some(Value::Array(messages)) if messages.is_empty() => {
            return Err(bad("messages: at least one message is required"));
        }
        Some(Value::Array(messages)) if messages.len() > MAX_MESSAGES => {
            return Err(bad(format!("messages: at most {MAX_MESSAGES} messages are accepted")));
        }
        Some(Value::Array(messages)) => messages,
        _ => return Err(bad("messages: Field required (an array of messages)")),
    };
    let mut fields = Map::new();
    let mut found = Found::default();
    let mut system_messages = false;
    let mut chat = Vec::new();
    if let Some(system) = original.get("system") {
        let text = text_of(system).ok_or_else(|| bad("system: must be a string or an array of text blocks"))?;
        if !text.is_empty() {
            chat.push(json!({"role": "system", "content": text}));
        }
    }
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str);
        let content = message.get("content").ok_or_else(|| bad(format!("messages.{i}.content: Field required")))?;
        let blocks = blocks_of(content)
            .ok_or_else(|| bad(format!("messages.{i}.content: must be a string or an array of content blocks")))?;
        match role {
            Some("user") => user_turn(i, &blocks, &mut chat, &mut found),
            Some("assistant") => chat.push(assistant_turn(i, &blocks, &mut found)),
            // Mid-conversation system messages (Claude Code's reminders): kept where they stand.
            Some("system") => {
                let text = text_of(content)
                    .ok_or_else(|| bad(format!("messages.{i}.content: must be a string or text blocks")))?;
                chat.push(json!({"role": "system", "content": text}));
                system_messages = true;
            }
            _ => return Err(bad(format!("messages.{i}.role: must be \"user\", \"assistant\" or \"system\""))),
        }
    }
    fields.insert("model".into(), Value::String(model.clone()));
    fields.insert("messages".into(), Value::Array(chat));
    if let Some(max_tokens) = max_tokens {
        fields.insert("max_tokens".into(), max_tokens.clone());
    }
    if let Some(stop) = original.get("stop_sequences").filter(|s| s.is_array()) {
        fields.insert("stop".into(), stop.clone());
    }
    for key in ["temperature", "top_p"] {
        if let Some(value) = original.get(key).filter(|v| v.is_number()) {
            fields.insert(key.into(), value.clone());
        }
    }
    if original.get("stream").and_then(Value::as_bool) == Some(true) {
        // Usage for `message_delta`: the OpenAI adapter asks `openai` targets for it itself
        // (`azure` ones, whose older API versions refuse `stream_options`, are estimated).
        fields.insert("stream".into(), Value::Bool(true));
    }
    if let Some(tools) = original.get("tools").and_then(Value::as_array) {
        let mut functions = Vec::new();
        for tool in tools {
            match tool.get("type").and_then(Value::as_str) {
                None | Some("custom") => functions.push(json!({"type": "function", "function": {
                    "name": tool.get("name").cloned().unwrap_or(Value::Null),
                    "description": tool.get("description").cloned().unwrap_or(json!("")),
                    "parameters": tool.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"})),
                }})),
                // Server tools (web search, code execution, …) run at Anthropic: other flavors
                // answer without them.
                Some(kind) => found.unmapped.push(format!("tools ({kind})")),
            }
        }
        if !functions.is_empty() {
            fields.insert("tools".into(), Value::Array(functions));
        }
    }
    if let Some(choice) = original.get("tool_choice") {
        match choice.get("type").and_then(Value::as_str) {
            Some("auto") => {
                fields.insert("tool_choice".into(), json!("auto"));
            }
            Some("any") => {
                fields.insert("tool_choice".into(), json!("required"));
            }
            Some("none") => {
                fields.insert("tool_choice".into(), json!("none"));
            }
            Some("tool") => {
                let name = choice.get("name").cloned().unwrap_or(Value::Null);
                fields.insert("tool_choice".into(), json!({"type": "function", "function": {"name": name}}));
            }
            _ => return Err(bad("tool_choice.type: must be auto, any, tool or none")),
        }
        if choice.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
            fields.insert("parallel_tool_calls".into(), Value::Bool(false));
        }
    }
    if let Some(user) = original.get("metadata").and_then(|m| m.get("user_id")).and_then(Value::as_str) {
        fields.insert("user".into(), json!(user));
    }
    if original.get("mcp_servers").is_some_and(|m| m.as_array().is_some_and(|m| !m.is_empty())) {
        found.unmapped.push("mcp_servers".into());
    }
    for key in ["context_management", "top_k"] {
        if original.get(key).is_some_and(|v| !v.is_null()) {
            found.unmapped.push(key.into());
        }
    }
    if original.get("output_config").and_then(|c| c.get("format")).is_some_and(|f| !f.is_null()) {
        found.unmapped.push("output_config.format".into());
    }
    let reasoning = reasoning(&original)?;
    // Text the conversion has no place for (documents, search results, …) still goes past the
    // input guardrails: an Anthropic target receives it.
    let mut guard_text = String::new();
    for message in messages {
        for block in message.get("content").and_then(Value::as_array).into_iter().flatten() {
            let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
            if !matches!(kind, "text" | "image" | "tool_use" | "tool_result") {
                collect_text(block, &mut guard_text);
            }
        }
    }
    let origin = AnthropicOrigin {
        original,
        beta: headers.beta,
        version: headers.version,
        requires: found.requires,
        guard_text,
        reasoning,
        unmapped: found.unmapped,
        system_messages,
    };
    Ok(ChatRequest { fields, model, anthropic: Some(Arc::new(origin)) })
}

/// `thinking` and `output_config.effort` as the effort every reasoning control shares.
fn reasoning(original: &Map<String, Value>) -> Result<Option<Reasoning>, BadRequest> {
    let mut fields = Vec::new();
    let mut effort = None;
    if let Some(thinking) = original.get("thinking").filter(|t| !t.is_null()) {
        match thinking.get("type").and_then(Value::as_str) {
            Some("enabled") => {
                let budget = thinking.get("budget_tokens").and_then(Value::as_u64).ok_or_else(|| {
                    bad("thinking.budget_tokens: Field required (a positive integer) when thinking is enabled")
                })?;
                effort = Some(Effort::of_budget(budget));
                fields.push("thinking");
            }
            Some("adaptive") => fields.push("thinking"),
            Some("disabled") => {}
            _ => return Err(bad("thinking.type: must be enabled, adaptive or disabled")),
        }
    }
    if let Some(level) = original.get("output_config").and_then(|c| c.get("effort")).filter(|e| !e.is_null()) {
        effort = Some(match level.as_str() {
            Some("low") => Effort::Low,
            Some("medium") => Effort::Medium,
            Some("high" | "xhigh" | "max") => Effort::High,
            _ => return Err(bad("output_config.effort: must be low, medium, high, xhigh or max")),
        });
        fields.push("output_config.effort");
    }
    Ok((!fields.is_empty()).then_some(Reasoning { effort, fields }))
}

/// Every text a block carries, however nested: `text`, `thinking`, string `content`, and the
/// `data` of a plain-text source.
fn collect_text(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let plain = map.get("media_type").and_then(Value::as_str).is_some_and(|m| m.starts_with("text/"));
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("text" | "thinking" | "content" | "title" | "context", Value::String(text)) => {
                        out.push_str(text);
                        out.push('\n');
                    }
                    ("data", Value::String(text)) if plain => {
                        out.push_str(text);
                        out.push('\n');
                    }
                    (_, nested @ (Value::Object(_) | Value::Array(_))) => collect_text(nested, out),
                    _ => {}
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_text(item, out)),
        _ => {}
    }
}

/// A string, or text blocks joined.
fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Array(blocks) => {
            Some(blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n"))
        }
        _ => None,
    }
}

/// Content as blocks (a string is one text block).
fn blocks_of(content: &Value) -> Option<Vec<Value>> {
    match content {
        Value::String(text) => Some(vec![json!({"type": "text", "text": text})]),
        Value::Array(blocks) if blocks.iter().all(|b| b.get("type").and_then(Value::as_str).is_some()) => {
            Some(blocks.clone())
        }
        _ => None,
    }
}

/// A user turn: its tool results become `tool` messages (first, as OpenAI wants them right
/// after the assistant's calls), the rest one user message.
fn user_turn(turn: usize, blocks: &[Value], chat: &mut Vec<Value>, found: &mut Found) {
    let mut parts = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("tool_result") => {
                let content = block.get("content").and_then(text_of).unwrap_or_default();
                chat.push(
                    json!({"role": "tool", "tool_call_id": block.get("tool_use_id").cloned().unwrap_or(json!("")),
                    "content": content}),
                );
            }
            Some("text") => {
                parts.push(json!({"type": "text", "text": block.get("text").cloned().unwrap_or(json!(""))}))
            }
            Some("image") => match image_url(block.get("source").unwrap_or(&Value::Null)) {
                Some(url) => parts.push(json!({"type": "image_url", "image_url": {"url": url}})),
                None => found.requires.push(format!("messages.{turn}.content.{i} (image by file id)")),
            },
            // Documents (PDFs, citations), search results and the like exist only there.
            Some(kind) => found.requires.push(format!("messages.{turn}.content.{i} ({kind})")),
            None => {}
        }
    }
    if parts.is_empty() {
        // A turn of only blocks other APIs lack (a document, say) is still a user turn; only
        // Anthropic targets are eligible for it, and they get the original.
        if blocks.iter().any(|b| b.get("type").and_then(Value::as_str) != Some("tool_result")) {
            chat.push(json!({"role": "user", "content": ""}));
        }
        return;
    }
    let only_text = parts.iter().all(|p| p["type"] == "text");
    let content = if only_text {
        Value::String(parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"))
    } else {
        Value::Array(parts)
    };
    chat.push(json!({"role": "user", "content": content}));
}

/// An assistant turn: text and tool calls (earlier thinking is history: dropped for other
/// providers, kept in the original for Anthropic).
fn assistant_turn(turn: usize, blocks: &[Value], found: &mut Found) -> Value {
    let mut text = String::new();
    let mut calls = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => {
                calls.push(json!({"id": block.get("id").cloned().unwrap_or(json!("")), "type": "function",
                "function": {"name": block.get("name").cloned().unwrap_or(json!("")),
                    "arguments": block.get("input").map(Value::to_string).unwrap_or_else(|| "{}".into())}}))
            }
            Some("thinking" | "redacted_thinking") => {}
            Some(kind) => found.requires.push(format!("messages.{turn}.content.{i} ({kind})")),
            None => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) }});
    if !calls.is_empty() {
        crate::json::set(&mut message, &["tool_calls"], Value::Array(calls));
    }
    message
}

/// An image source as an OpenAI image URL (`data:` for base64).
fn image_url(source: &Value) -> Option<String> {
    match source.get("type").and_then(Value::as_str)? {
        "base64" => Some(format!(
            "data:{};base64,{}",
            source.get("media_type").and_then(Value::as_str)?,
            source.get("data").and_then(Value::as_str)?
        )),
        "url" => source.get("url").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalised(body: Value) -> ChatRequest {
        normalise(body.to_string().as_bytes(), Headers::default(), false).unwrap()
    }

    #[test]
    fn a_messages_request_becomes_a_chat_request() {
        let request = normalised(
            json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5, "metadata": {"user_id": "u1"},
            "tools": [{"name": "search", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "find x"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "Looking."}, {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "x"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]},
                    {"type": "text", "text": "and y?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}]},
            ]}),
        );
        let f = &request.fields;
        assert_eq!(request.model, "claude-sonnet-4-5");
        assert_eq!(f["messages"][0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(f["messages"][1], json!({"role": "user", "content": "find x"}));
        assert_eq!(f["messages"][2]["content"], "Looking.");
        assert_eq!(
            f["messages"][2]["tool_calls"][0]["function"],
            json!({"name": "search", "arguments": "{\"q\":\"x\"}"})
        );
        assert_eq!(f["messages"][3], json!({"role": "tool", "tool_call_id": "toolu_1", "content": "42"}));
        assert_eq!(f["messages"][4]["content"][1]["image_url"]["url"], "data:image/png;base64,iVBOR");
        assert_eq!(
            (f["max_tokens"].clone(), f["stop"].clone(), f["user"].clone()),
            (json!(100), json!(["END"]), json!("u1"))
        );
        assert_eq!(f["tools"][0]["function"]["parameters"], json!({"type": "object"}));
        assert_eq!((f["tool_choice"].clone(), f["parallel_tool_calls"].clone()), (json!("required"), json!(false)));
        assert!(f.get("top_k").is_none(), "a hint other APIs lack is dropped, not renamed");
        let origin = request.anthropic.as_deref().unwrap();
        assert!(origin.requires.is_empty());
        assert_eq!(origin.original["top_k"], 5, "an Anthropic target gets the original back");
        assert_eq!(origin.unmapped, ["top_k"], "and another flavor's caller is told it was dropped");
    }

    fn origin_with(key: &str, value: Value) -> AnthropicOrigin {
        let mut body = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        body[key] = value;
        normalised(body).anthropic.as_deref().unwrap().clone()
    }

    #[test]
    fn only_content_other_flavors_cannot_read_needs_an_anthropic_target() {
        let document = json!([{"role": "user", "content": [{"type": "text", "text": "see"},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}}]}]);
        assert_eq!(origin_with("messages", document).requires, ["messages.0.content.1 (document)"]);
        // Controls and tools other flavors lack are dropped for them (and named), not refused.
        let server_tool = origin_with("tools", json!([{"type": "web_search_20250305", "name": "web_search"}]));
        assert!(server_tool.requires.is_empty());
        assert_eq!(server_tool.unmapped, ["tools (web_search_20250305)"]);
        assert!(origin_with("thinking", json!({"type": "enabled", "budget_tokens": 2048})).requires.is_empty());
        assert!(origin_with("tools", json!([{"name": "f", "input_schema": {"type": "object"}}])).unmapped.is_empty());
        assert_eq!(origin_with("context_management", json!({"edits": []})).unmapped, ["context_management"]);
        assert_eq!(
            origin_with("mcp_servers", json!([{"type": "url", "url": "https://m.example"}])).unmapped,
            ["mcp_servers"]
        );
    }

    #[test]
    fn thinking_and_effort_become_one_effort() {
        let reasoning = |key: &str, value: Value| origin_with(key, value).reasoning;
        assert_eq!(
            reasoning("thinking", json!({"type": "enabled", "budget_tokens": 2048})),
            Some(Reasoning { effort: Some(Effort::Low), fields: vec!["thinking"] })
        );
        assert_eq!(
            reasoning("thinking", json!({"type": "enabled", "budget_tokens": 32000})).unwrap().effort,
            Some(Effort::High)
        );
        assert_eq!(
            reasoning("thinking", json!({"type": "adaptive"})),
            Some(Reasoning { effort: None, fields: vec!["thinking"] }),
            "adaptive thinking leaves the effort to the model"
        );
        assert_eq!(reasoning("thinking", json!({"type": "disabled"})), None);
        let both = normalised(json!({"model": "m", "max_tokens": 10, "thinking": {"type": "adaptive"},
            "output_config": {"effort": "xhigh"}, "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(
            both.anthropic.as_deref().unwrap().reasoning,
            Some(Reasoning { effort: Some(Effort::High), fields: vec!["thinking", "output_config.effort"] })
        );
        let refused = |body: Value| normalise(body.to_string().as_bytes(), Headers::default(), false).err().unwrap().0;
        let base = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        let mut body = base.clone();
        body["thinking"] = json!({"type": "sometimes"});
        assert!(refused(body).starts_with("thinking.type"));
        let mut body = base;
        body["output_config"] = json!({"effort": "extreme"});
        assert!(refused(body).starts_with("output_config.effort"));
    }

    #[test]
    fn system_messages_inside_messages_stay_where_they_stand() {
        let request = normalised(json!({"model": "team-coder", "max_tokens": 10, "system": "You are a coder.",
            "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": [{"type": "text", "text": "reminder"}]},
                {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]}));
        let roles: Vec<&str> =
            request.fields["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "system", "assistant", "user"]);
        assert_eq!(request.fields["messages"][2]["content"], "reminder");
        assert!(request.anthropic.as_deref().unwrap().system_messages);
    }

    #[test]
    fn requests_anthropic_would_refuse_are_refused_by_name() {
        let refused = |body: Value| normalise(body.to_string().as_bytes(), Headers::default(), false).err().unwrap().0;
        assert!(
            refused(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]})).starts_with("max_tokens")
        );
        assert!(refused(json!({"model": "m", "max_tokens": 5, "messages": []})).starts_with("messages"));
        assert!(
            refused(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}))
                .starts_with("messages.0.role")
        );
        assert!(refused(json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})).starts_with("model"));
        assert!(normalise(b"{nope", Headers::default(), false).err().unwrap().0.starts_with("malformed JSON"));
        assert!(
            normalise(br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#, Headers::default(), true).is_ok(),
            "count_tokens needs no max_tokens"
        );
    }

    #[test]
    fn text_only_anthropic_blocks_carry_still_reaches_the_guardrails() {
        let request = normalised(json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "AKIA-secret-in-a-document"}},
        ]}]}));
        assert!(request.prompt_text().contains("AKIA-secret-in-a-document"));
        assert_eq!(request.requires_anthropic(), ["messages.0.content.0 (document)"]);
        assert_eq!(
            request.fields["messages"],
            json!([{"role": "user", "content": ""}]),
            "a document-only turn is a turn"
        );
        assert!(request.check_routable().is_ok());
    }
}
