//! A typed request of another shape (an Anthropic caller's, say) as a Chat Completions body.
//! System messages stay where they stand (the top-level system prompt first); a user turn's
//! tool results become `tool` messages before the rest of it, as OpenAI wants them right after
//! the assistant's calls; thinking and parts only their own shape carries have no place here
//! and are left out.

use serde_json::{Map, Value, json};
use shield_core::exchange::{self, Image, Message, Part, Role, ToolChoice};

/// The body for a target whose model is `model`. `ask_usage`: a stream asks for the final
/// usage chunk. `added` (e.g. `reasoning_effort`) goes under `extra_body`, which goes over all.
pub fn render(
    request: &exchange::Request,
    model: &str,
    ask_usage: bool,
    added: &[(&str, Value)],
    extra: Option<&Map<String, Value>>,
) -> Vec<u8> {
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if !request.system.is_empty() {
        messages.push(json!({"role": "system", "content": request.system.join("\n")}));
    }
    for message in &request.messages {
        render_message(message, &mut messages);
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    if let Some(max_tokens) = request.max_tokens {
        body.insert("max_tokens".into(), json!(max_tokens));
    }
    if !request.stop.is_empty() {
        body.insert("stop".into(), json!(request.stop));
    }
    if let Some(temperature) = request.temperature {
        body.insert("temperature".into(), json!(temperature));
    }
    if let Some(top_p) = request.top_p {
        body.insert("top_p".into(), json!(top_p));
    }
    if request.stream {
        body.insert("stream".into(), Value::Bool(true));
        if ask_usage {
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| json!({"type": "function", "function": {"name": tool.name, "description": tool.description, "parameters": tool.schema}}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = &request.tool_choice {
        let choice = match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Any => json!("required"),
            ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
        };
        body.insert("tool_choice".into(), choice);
    }
    if let Some(parallel) = request.parallel_tool_calls {
        body.insert("parallel_tool_calls".into(), Value::Bool(parallel));
    }
    if let Some(user) = &request.user {
        body.insert("user".into(), json!(user));
    }
    for (key, value) in added {
        body.insert((*key).to_string(), value.clone());
    }
    for (key, value) in extra.into_iter().flatten() {
        body.insert(key.clone(), value.clone());
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

fn texts(content: &[Part], separator: &str) -> String {
    content
        .iter()
        .filter_map(|p| if let Part::Text(text) = p { Some(text.as_str()) } else { None })
        .collect::<Vec<_>>()
        .join(separator)
}

fn render_message(message: &Message, out: &mut Vec<Value>) {
    match message.role {
        Role::System => out.push(json!({"role": "system", "content": texts(&message.content, "\n")})),
        Role::Assistant => {
            let text = texts(&message.content, "");
            let calls: Vec<Value> = message
                .content
                .iter()
                .filter_map(|part| match part {
                    Part::ToolUse { id, name, input } => {
                        Some(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}))
                    }
                    _ => None,
                })
                .collect();
            let content = if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) };
            let mut rendered = json!({"role": "assistant", "content": content});
            if !calls.is_empty() {
                crate::json::set(&mut rendered, &["tool_calls"], Value::Array(calls));
            }
            out.push(rendered);
        }
        Role::User => {
            let mut parts = Vec::new();
            for part in &message.content {
                match part {
                    Part::ToolResult { id, content, .. } => {
                        out.push(json!({"role": "tool", "tool_call_id": id, "content": content}))
                    }
                    Part::Text(text) => parts.push(json!({"type": "text", "text": text})),
                    Part::Image(image) => {
                        let url = match image {
                            Image::Url(url) => url.clone(),
                            Image::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
                        };
                        parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
                    }
                    _ => {}
                }
            }
            let only_tool_results =
                parts.is_empty() && message.content.iter().all(|p| matches!(p, Part::ToolResult { .. }));
            if only_tool_results && !message.content.is_empty() {
                return;
            }
            let content = if parts.iter().all(|p| p["type"] == "text") {
                Value::String(texts(&message.content, "\n"))
            } else {
                Value::Array(parts)
            };
            out.push(json!({"role": "user", "content": content}));
        }
    }
}
