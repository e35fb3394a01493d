//! A typed request of another shape (an Anthropic caller's, say) as a Chat Completions body.
//! System messages stay where they stand (the top-level system prompt first); a user turn's
//! tool results become `tool` messages before the rest of it, as OpenAI wants them right after
//! the assistant's calls; thinking and parts only their own shape carries have no place here
//! and are left out.

use serde_json::{Map, Value, json};
use shield_core::exchange::{self, Format, Image, Message, Part, Role, ToolChoice};

/// How one target takes the request.
pub struct Rendering<'a> {
    pub model: &'a str,
    /// A stream asks for the final usage chunk.
    pub ask_usage: bool,
    /// A reasoning model: its output limit is `max_completion_tokens` (such models refuse
    /// `max_tokens`).
    pub reasoning: bool,
    /// Fields the adapter sets (e.g. `reasoning_effort`), under `extra`.
    pub added: &'a [(&'a str, Value)],
    /// The target's `extra_body`, over all.
    pub extra: Option<&'a Map<String, Value>>,
}

/// The body for one target.
pub fn render(request: &exchange::Request, target: Rendering<'_>) -> Vec<u8> {
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    let system = request.system.iter().filter(|part| !part.is_empty()).cloned().collect::<Vec<_>>();
    if !system.is_empty() {
        messages.push(json!({"role": "system", "content": system.join("\n")}));
    }
    // A system message between an assistant's tool calls and their results waits until the
    // results are given: OpenAI wants `tool` messages right after the calls.
    let mut awaiting_results = false;
    let mut held: Vec<Value> = Vec::new();
    for message in &request.messages {
        match message.role {
            Role::System if awaiting_results => held.push(system_message(message)),
            Role::User => {
                render_user(message, &mut messages, &mut held);
                awaiting_results = false;
            }
            _ => {
                render_message(message, &mut messages);
                awaiting_results = message.role == Role::Assistant
                    && message.content.iter().any(|p| matches!(p, Part::ToolUse { .. }));
            }
        }
    }
    messages.append(&mut held);
    let (model, ask_usage, added, extra) = (target.model, target.ask_usage, target.added, target.extra);
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    if let Some(max_tokens) = request.max_tokens {
        let field = if target.reasoning { "max_completion_tokens" } else { "max_tokens" };
        body.insert(field.into(), json!(max_tokens));
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
    if let Some(choice) = &request.tool_choice {
        let choice = match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Any => json!("required"),
            ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
        };
        body.insert("tool_choice".into(), choice);
    }
    match &request.format {
        Some(Format::JsonObject) => {
            body.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(Format::JsonSchema { name, schema, strict }) => {
            let mut spec = json!({"name": name, "schema": schema});
            if let Some(strict) = strict {
                crate::json::set(&mut spec, &["strict"], json!(strict));
            }
            body.insert("response_format".into(), json!({"type": "json_schema", "json_schema": spec}));
        }
        None => {}
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
    if request.tools.is_empty() {
        return shield_core::json_write::map_to_vec(&body);
    }
    shield_core::json_write::map_to_vec_with(&body, &[("tools", &tools(&request.tools))])
}

/// `tools` as JSON text, each schema as the caller sent it (not read as a tree and written
/// again: [`exchange::Schema`]).
fn tools(tools: &[exchange::Tool]) -> Vec<u8> {
    use shield_core::json_write::{array_to_vec, push_str};
    let size = tools.iter().map(|tool| tool.schema.text().len() + tool.description.len() + 96).sum();
    array_to_vec(tools, size, |out, tool| {
        out.extend_from_slice(br#"{"type":"function","function":{"name":"#);
        push_str(out, &tool.name);
        out.extend_from_slice(br#","description":"#);
        push_str(out, &tool.description);
        out.extend_from_slice(br#","parameters":"#);
        out.extend_from_slice(tool.schema.text().as_bytes());
        out.extend_from_slice(b"}}");
    })
}

fn texts(content: &[Part], separator: &str) -> String {
    content
        .iter()
        .filter_map(|p| if let Part::Text(text) = p { Some(text.as_str()) } else { None })
        .collect::<Vec<_>>()
        .join(separator)
}

fn system_message(message: &Message) -> Value {
    json!({"role": "system", "content": texts(&message.content, "\n")})
}

/// A user turn: its tool results as `tool` messages, then any held system messages, then the
/// rest of the turn.
fn render_user(message: &Message, out: &mut Vec<Value>, held: &mut Vec<Value>) {
    let mut rest = Vec::new();
    render_message(message, &mut rest);
    let (results, turn): (Vec<Value>, Vec<Value>) = rest.into_iter().partition(|m| m["role"] == "tool");
    out.extend(results);
    out.append(held);
    out.extend(turn);
}

fn render_message(message: &Message, out: &mut Vec<Value>) {
    match message.role {
        Role::System => out.push(system_message(message)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use shield_core::exchange::Request;

    #[test]
    fn a_system_message_between_tool_calls_and_their_results_follows_the_results() {
        let request = Request {
            messages: vec![
                Message { role: Role::User, content: vec![Part::Text("read it".into())] },
                Message {
                    role: Role::Assistant,
                    content: vec![Part::ToolUse { id: "t1".into(), name: "Read".into(), input: "{}".into() }],
                },
                Message { role: Role::System, content: vec![Part::Text("reminder".into())] },
                Message {
                    role: Role::User,
                    content: vec![
                        Part::ToolResult { id: "t1".into(), content: "42".into(), is_error: false },
                        Part::Text("and?".into()),
                    ],
                },
            ],
            max_tokens: Some(10),
            ..Request::default()
        };
        let target = Rendering { model: "m", ask_usage: false, reasoning: false, added: &[], extra: None };
        let body: Value = serde_json::from_slice(&render(&request, target)).unwrap();
        let roles: Vec<&str> =
            body["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "system", "user"]);
        assert_eq!(body["max_tokens"], 10);
    }
}
