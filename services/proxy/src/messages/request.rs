//! An Anthropic Messages request as the normalised (OpenAI-shaped) chat request the pipeline
//! routes, guards and accounts, with the caller's original fields kept beside it under the
//! Shield-only `x_anthropic` key: an Anthropic-flavoured target gets them back as they were
//! (thinking, documents, `cache_control`, server tools — nothing lost), any other target gets
//! the conversion. Fields that change the answer and that only Anthropic's API honours
//! (`thinking`, documents, server tools, MCP servers) mark the request as needing an Anthropic
//! target; hints (`cache_control`, `top_k`, `service_tier`) are simply absent from the
//! conversion.

use serde_json::{Map, Value, json};
use shield_core::chat_request::{ANTHROPIC_KEY, BadRequest, ChatRequest, MAX_MESSAGES};

/// `anthropic-beta` flags forwarded to Anthropic targets; any other flag is dropped (never sent
/// to a provider that would reject it, never to a non-Anthropic target).
pub const BETA_ALLOW_LIST: [&str; 8] = [
    "prompt-caching-2024-07-31",
    "extended-cache-ttl-2025-04-11",
    "token-efficient-tools-2025-02-19",
    "fine-grained-tool-streaming-2025-05-14",
    "interleaved-thinking-2025-05-14",
    "output-128k-2025-02-19",
    "context-1m-2025-08-07",
    "context-management-2025-06-27",
];

/// The flags of an `anthropic-beta` header that are on the allow-list, comma-joined.
pub fn allowed_beta(header: Option<&str>) -> Option<String> {
    let flags: Vec<&str> = header?.split(',').map(str::trim).filter(|flag| BETA_ALLOW_LIST.contains(flag)).collect();
    (!flags.is_empty()).then(|| flags.join(","))
}

fn bad(message: impl Into<String>) -> BadRequest {
    BadRequest(message.into())
}

/// Checks a Messages body the way Anthropic's API does and converts it. `count_only` is the
/// token-counting endpoint's body, which has no `max_tokens`.
pub fn normalise(body: &[u8], beta: Option<String>, count_only: bool) -> Result<ChatRequest, BadRequest> {
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
    let mut requires_anthropic = false;
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
            Some("user") => user_turn(&blocks, &mut chat, &mut requires_anthropic),
            Some("assistant") => chat.push(assistant_turn(&blocks, &mut requires_anthropic)),
            _ => return Err(bad(format!("messages.{i}.role: must be \"user\" or \"assistant\""))),
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
                // Server tools (web search, code execution, …) run at Anthropic.
                Some(_) => requires_anthropic = true,
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
    if original.get("thinking").is_some_and(|t| t.get("type").and_then(Value::as_str) == Some("enabled"))
        || original.get("mcp_servers").is_some_and(|m| m.as_array().is_some_and(|m| !m.is_empty()))
    {
        requires_anthropic = true;
    }
    let mut native = Map::new();
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
    if !guard_text.is_empty() {
        native.insert("guard_text".into(), Value::String(guard_text));
    }
    native.insert("original".into(), Value::Object(original));
    native.insert("requires".into(), Value::Bool(requires_anthropic));
    if let Some(beta) = beta {
        native.insert("beta".into(), Value::String(beta));
    }
    fields.insert(ANTHROPIC_KEY.into(), Value::Object(native));
    Ok(ChatRequest { fields, model })
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
fn user_turn(blocks: &[Value], chat: &mut Vec<Value>, requires_anthropic: &mut bool) {
    let mut parts = Vec::new();
    for block in blocks {
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
                None => *requires_anthropic = true,
            },
            // Documents (PDFs, citations), search results and the like exist only there.
            Some(_) => *requires_anthropic = true,
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
fn assistant_turn(blocks: &[Value], requires_anthropic: &mut bool) -> Value {
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => {
                calls.push(json!({"id": block.get("id").cloned().unwrap_or(json!("")), "type": "function",
                "function": {"name": block.get("name").cloned().unwrap_or(json!("")),
                    "arguments": block.get("input").map(Value::to_string).unwrap_or_else(|| "{}".into())}}))
            }
            Some("thinking" | "redacted_thinking") => {}
            Some(_) => *requires_anthropic = true,
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
        normalise(body.to_string().as_bytes(), None, false).unwrap()
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
        assert_eq!(f[ANTHROPIC_KEY]["requires"], false);
        assert_eq!(f[ANTHROPIC_KEY]["original"]["top_k"], 5, "an Anthropic target gets the original back");
    }

    #[test]
    fn fields_that_change_the_answer_need_an_anthropic_target() {
        let base = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        let with = |key: &str, value: Value| {
            let mut body = base.clone();
            body[key] = value;
            normalised(body).fields[ANTHROPIC_KEY]["requires"].as_bool().unwrap()
        };
        assert!(with("thinking", json!({"type": "enabled", "budget_tokens": 2048})));
        assert!(with("tools", json!([{"type": "web_search_20250305", "name": "web_search"}])));
        assert!(!with("tools", json!([{"name": "f", "input_schema": {"type": "object"}}])));
        assert!(with(
            "messages",
            json!([{"role": "user", "content": [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}}]}])
        ));
        assert!(!with("thinking", json!({"type": "disabled"})));
    }

    #[test]
    fn requests_anthropic_would_refuse_are_refused_by_name() {
        let refused = |body: Value| normalise(body.to_string().as_bytes(), None, false).err().unwrap().0;
        assert!(
            refused(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]})).starts_with("max_tokens")
        );
        assert!(refused(json!({"model": "m", "max_tokens": 5, "messages": []})).starts_with("messages"));
        assert!(
            refused(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}))
                .starts_with("messages.0.role")
        );
        assert!(refused(json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})).starts_with("model"));
        assert!(normalise(b"{nope", None, false).err().unwrap().0.starts_with("malformed JSON"));
        assert!(
            normalise(br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#, None, true).is_ok(),
            "count_tokens needs no max_tokens"
        );
    }

    #[test]
    fn text_only_anthropic_blocks_carry_still_reaches_the_guardrails() {
        let request = normalised(json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "AKIA-secret-in-a-document"}},
        ]}]}));
        assert!(request.prompt_text().contains("AKIA-secret-in-a-document"));
        assert!(request.fields[ANTHROPIC_KEY]["requires"].as_bool().unwrap());
        assert_eq!(
            request.fields["messages"],
            json!([{"role": "user", "content": ""}]),
            "a document-only turn is a turn"
        );
        assert!(request.check_routable().is_ok());
    }

    #[test]
    fn beta_flags_are_allow_listed() {
        assert_eq!(
            allowed_beta(Some("prompt-caching-2024-07-31, made-up-2099-01-01")),
            Some("prompt-caching-2024-07-31".into())
        );
        assert_eq!(allowed_beta(Some("made-up-2099-01-01")), None);
        assert_eq!(allowed_beta(None), None);
    }
}
