//! A typed request of another shape (an Anthropic caller's, say) as a Chat Completions body.
//! System messages stay where they stand (the top-level system prompt first); a user turn's
//! tool results become `tool` messages before the rest of it, as OpenAI wants them right after
//! the assistant's calls; thinking and parts only their own shape carries have no place here
//! and are left out.

use std::borrow::Cow;

use serde_json::{Map, Value, json};
use shield_core::exchange::{self, Format, Image, Message, Part, Role, Text, ToolChoice};
use shield_core::json_write::{push_array, push_str};

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
    let (model, ask_usage, added, extra) = (target.model, target.ask_usage, target.added, target.extra);
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
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
    // A target's `extra_body` may name `messages` or `tools`: its value stands, as it did when
    // they were entries of the map. Both are written straight into the body.
    let tools_size = request.tools.iter().map(tool_size).sum::<usize>();
    let mut object =
        shield_core::json_write::Object::new(&body, crate::provider::history_size(request) + tools_size + 32);
    object.field("messages", |out| messages(request, out));
    if !request.tools.is_empty() {
        object.field("tools", |out| tools(&request.tools, out));
    }
    object.finish()
}

/// About the length of a tool written.
fn tool_size(tool: &exchange::Tool) -> usize {
    tool.schema.text().len() + tool.description.len() + 96
}

/// `tools` as JSON text, each schema as the caller sent it (not read as a tree and written
/// again: [`exchange::Schema`]).
fn tools(tools: &[exchange::Tool], out: &mut Vec<u8>) {
    push_array(out, tools, |out, tool| {
        out.extend_from_slice(br#"{"type":"function","function":{"name":"#);
        push_str(out, &tool.name);
        out.extend_from_slice(br#","description":"#);
        tool.description.push_json(out);
        out.extend_from_slice(br#","parameters":"#);
        out.extend_from_slice(tool.schema.text().as_bytes());
        out.extend_from_slice(b"}}");
    });
}

/// The request's messages as a JSON array onto `out`, each written straight from the typed
/// request: a converted agent history is ~150 KB, most of it tool output, which a tree of
/// `Value`s copied once more, in thousands of allocations, and then freed (issue 33). The order
/// is the tree's: the top-level system prompt first, a user turn's tool results before the rest
/// of it, and a system message between an assistant's tool calls and their results after the
/// results (OpenAI wants `tool` messages right after the calls): such a message is the one
/// written aside and moved.
fn messages(request: &exchange::Request, out: &mut Vec<u8>) {
    out.push(b'[');
    let mut written = Written { out, any: false, held: Vec::new() };
    let system = request.system.iter().filter(|part| !part.is_empty());
    if request.system.iter().any(|part| !part.is_empty()) {
        written.push(|out| system_message(out, system, "\n"));
    }
    let mut awaiting_results = false;
    for message in &request.messages {
        match message.role {
            Role::System => {
                let write = |out: &mut Vec<u8>| system_message(out, texts(&message.content), "\n");
                if awaiting_results { written.hold(write) } else { written.push(write) }
            }
            Role::User => {
                written.user(message);
                awaiting_results = false;
            }
            Role::Assistant => {
                written.push(|out| assistant(out, message));
                awaiting_results = message_calls_tools(message);
            }
        }
    }
    written.release();
    out.push(b']');
}

fn message_calls_tools(message: &Message) -> bool {
    message.content.iter().any(|p| matches!(p, Part::ToolUse { .. }))
}

/// The text parts of `content` (each written as it came when it was read from the body as
/// sent, [`Text`]).
fn texts(content: &[Part]) -> impl Iterator<Item = &Text> + Clone {
    content.iter().filter_map(|p| if let Part::Text(text) = p { Some(text) } else { None })
}

/// Messages written one after another into the array, and the system messages held back
/// until the tool results they came between are written.
struct Written<'o> {
    out: &'o mut Vec<u8>,
    /// A message was written (the next one follows a comma).
    any: bool,
    /// Messages held, each after a comma.
    held: Vec<u8>,
}

impl Written<'_> {
    /// Writes one message with `write`.
    fn push(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        if std::mem::replace(&mut self.any, true) {
            self.out.push(b',');
        }
        write(self.out);
    }

    /// Writes one message aside, to go in at the next [`Written::release`].
    fn hold(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        self.held.push(b',');
        write(&mut self.held);
    }

    /// The messages held, where they go now.
    fn release(&mut self) {
        let mut held = std::mem::take(&mut self.held);
        if let Some(messages) = held.get(1..) {
            self.push(|out| out.extend_from_slice(messages));
        }
        held.clear();
        self.held = held;
    }

    /// A user turn: its tool results as `tool` messages, then the held system messages, then
    /// the rest of the turn (none when the turn was only tool results).
    fn user(&mut self, message: &Message) {
        for part in &message.content {
            if let Part::ToolResult { id, content, .. } = part {
                self.push(|out| {
                    out.extend_from_slice(br#"{"role":"tool","tool_call_id":"#);
                    push_str(out, id);
                    out.extend_from_slice(br#","content":"#);
                    content.push_json(out);
                    out.push(b'}');
                });
            }
        }
        self.release();
        let only_tool_results = message.content.iter().all(|p| matches!(p, Part::ToolResult { .. }));
        if only_tool_results && !message.content.is_empty() {
            return;
        }
        let images = message.content.iter().any(|p| matches!(p, Part::Image(_)));
        self.push(|out| {
            out.extend_from_slice(br#"{"role":"user","content":"#);
            if images {
                user_parts(out, &message.content);
            } else {
                Text::push_joined(out, texts(&message.content), "\n");
            }
            out.push(b'}');
        });
    }
}

/// A system message of `parts` joined by `separator`.
fn system_message<'t>(out: &mut Vec<u8>, parts: impl IntoIterator<Item = &'t Text>, separator: &str) {
    out.extend_from_slice(br#"{"role":"system","content":"#);
    Text::push_joined(out, parts, separator);
    out.push(b'}');
}

/// An assistant turn: its text (`null` when it only calls tools), then its tool calls.
fn assistant(out: &mut Vec<u8>, message: &Message) {
    let calls_tools = message_calls_tools(message);
    out.extend_from_slice(br#"{"role":"assistant","content":"#);
    if calls_tools && texts(&message.content).all(|text| text.is_empty()) {
        out.extend_from_slice(b"null");
    } else {
        Text::push_joined(out, texts(&message.content), "");
    }
    if calls_tools {
        out.extend_from_slice(br#","tool_calls":["#);
        let calls = message.content.iter().filter_map(|part| match part {
            Part::ToolUse { id, name, input } => Some((id, name, input)),
            _ => None,
        });
        for (i, (id, name, input)) in calls.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(br#"{"id":"#);
            push_str(out, id);
            out.extend_from_slice(br#","type":"function","function":{"name":"#);
            push_str(out, name);
            out.extend_from_slice(br#","arguments":"#);
            push_str(out, input);
            out.extend_from_slice(b"}}");
        }
        out.push(b']');
    }
    out.push(b'}');
}

/// A user turn with images: its text and image parts, in order.
fn user_parts(out: &mut Vec<u8>, content: &[Part]) {
    out.push(b'[');
    let mut first = true;
    for part in content {
        let (head, text): (&[u8], Cow<'_, str>) = match part {
            Part::Text(text) => {
                if !std::mem::take(&mut first) {
                    out.push(b',');
                }
                out.extend_from_slice(br#"{"type":"text","text":"#);
                text.push_json(out);
                out.push(b'}');
                continue;
            }
            Part::Image(Image::Url(url)) => (br#"{"type":"image_url","image_url":{"url":"#, Cow::Borrowed(url)),
            Part::Image(Image::Base64 { media_type, data }) => {
                (br#"{"type":"image_url","image_url":{"url":"#, Cow::Owned(format!("data:{media_type};base64,{data}")))
            }
            _ => continue,
        };
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        out.extend_from_slice(head);
        push_str(out, &text);
        out.extend_from_slice(if matches!(part, Part::Image(_)) { b"}}" } else { b"}" });
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::texts_strategy::{either_form, text};
    use proptest::prelude::*;
    use shield_core::exchange::Request;

    /// The messages as a tree of values, as they were rendered before they were written
    /// directly: the oracle the writer is held to.
    mod tree {
        use serde_json::{Value, json};
        use shield_core::exchange::{self, Image, Message, Part, Role};

        fn texts(content: &[Part], separator: &str) -> String {
            let texts =
                content.iter().filter_map(|p| if let Part::Text(text) = p { Some(text.as_str()) } else { None });
            texts.collect::<Vec<_>>().join(separator)
        }

        pub fn messages(request: &exchange::Request) -> Value {
            let mut messages = Vec::new();
            let system = request.system.iter().filter(|part| !part.is_empty()).cloned().collect::<Vec<_>>();
            if !system.is_empty() {
                messages.push(json!({"role": "system", "content": system.join("\n")}));
            }
            let mut awaiting_results = false;
            let mut held: Vec<Value> = Vec::new();
            for message in &request.messages {
                match message.role {
                    Role::System if awaiting_results => held.push(system_message(message)),
                    Role::User => {
                        let mut rest = Vec::new();
                        render_message(message, &mut rest);
                        let (results, turn): (Vec<Value>, Vec<Value>) =
                            rest.into_iter().partition(|m| m["role"] == "tool");
                        messages.extend(results);
                        messages.append(&mut held);
                        messages.extend(turn);
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
            Value::Array(messages)
        }

        fn system_message(message: &Message) -> Value {
            json!({"role": "system", "content": texts(&message.content, "\n")})
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
                            Part::ToolUse { id, name, input } => Some(
                                json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}),
                            ),
                            _ => None,
                        })
                        .collect();
                    let content = if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) };
                    let mut rendered = json!({"role": "assistant", "content": content});
                    if !calls.is_empty() {
                        rendered["tool_calls"] = Value::Array(calls);
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
    }

    fn part() -> impl Strategy<Value = Part> {
        prop_oneof![
            3 => either_form().prop_map(Part::Text),
            1 => text().prop_map(|url| Part::Image(Image::Url(url))),
            1 => (text(), text()).prop_map(|(media_type, data)| Part::Image(Image::Base64 { media_type, data })),
            2 => (text(), text(), text()).prop_map(|(id, name, input)| Part::ToolUse { id, name, input }),
            2 => (text(), either_form()).prop_map(|(id, content)| Part::ToolResult { id, content, is_error: false }),
            1 => text().prop_map(|thinking| Part::Thinking { thinking, signature: String::new() }),
            1 => (text(), text()).prop_map(|(kind, text)| Part::Opaque { kind, text }),
        ]
    }

    fn history() -> impl Strategy<Value = Request> {
        let role = prop_oneof![Just(Role::System), Just(Role::User), Just(Role::Assistant)];
        let message = (role, prop::collection::vec(part(), 0..4)).prop_map(|(role, content)| Message { role, content });
        (prop::collection::vec(either_form(), 0..3), prop::collection::vec(message, 0..8)).prop_map(
            |(system, messages)| Request { system: system.into(), messages: messages.into(), ..Request::default() },
        )
    }

    proptest! {
        /// Written directly, the messages are the tree's: the same values in the same order.
        #[test]
        fn messages_written_as_the_tree_renders_them(request in history()) {
            let mut written = Vec::new();
            messages(&request, &mut written);
            let written: Value = serde_json::from_slice(&written).expect("a JSON array");
            prop_assert_eq!(written, tree::messages(&request));
            let target = Rendering { model: "m", ask_usage: false, reasoning: false, added: &[], extra: None };
            let body: Value = serde_json::from_slice(&render(&request, target)).expect("a JSON object");
            prop_assert_eq!(&body["messages"], &tree::messages(&request));
            prop_assert_eq!(&body["model"], "m");
        }
    }

    /// An agent's history converted is written into the buffer sized for it, not one regrown
    /// (and copied) as it fills: tool output with a newline every ~60 bytes, and tool calls
    /// whose arguments are whole files, a quote escaped every few bytes.
    #[test]
    fn a_converted_history_fits_the_buffer_sized_for_it() {
        let line = "    let value = config.get(\"path\").unwrap_or_default(); // x\n";
        let file = serde_json::to_string(&json!({"file_path": "src/main.rs", "content": line.repeat(40)})).unwrap();
        let mut messages = Vec::new();
        for turn in 0..50 {
            let id = format!("toolu_{turn}");
            messages.push(Message { role: Role::User, content: vec![Part::Text(line.repeat(3).into())] });
            let call = Part::ToolUse { id: id.clone(), name: "Write".into(), input: file.clone() };
            messages.push(Message { role: Role::Assistant, content: vec![Part::Text("writing".into()), call] });
            let result = Part::ToolResult { id, content: line.repeat(20).into(), is_error: false };
            messages.push(Message { role: Role::User, content: vec![result] });
        }
        let request = Request {
            system: vec![Text::from(line.repeat(50))].into(),
            messages: messages.into(),
            ..Request::default()
        };
        let target = Rendering { model: "m", ask_usage: false, reasoning: false, added: &[], extra: None };
        let body = render(&request, target);
        let sized = crate::provider::history_size(&request) + 32;
        assert!(body.len() <= sized, "{} written, {sized} sized for", body.len());
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["messages"], tree::messages(&request));
    }

    #[test]
    fn tools_follow_the_messages_each_schema_as_sent() {
        let raw = r#"{"type":"object","properties":{"path":{"type":"string"}}}"#;
        let schema = exchange::Schema::of_raw(serde_json::value::RawValue::from_string(raw.into()).unwrap());
        let request = Request {
            messages: vec![Message { role: Role::User, content: vec![Part::Text("hi".into())] }].into(),
            tools: vec![
                exchange::Tool { name: "Read".into(), description: "Reads \"a\" file\n".into(), schema },
                exchange::Tool { name: "Bash".into(), description: "".into(), schema: json!({}).into() },
            ]
            .into(),
            ..Request::default()
        };
        let target = Rendering { model: "m", ask_usage: false, reasoning: false, added: &[], extra: None };
        let body = render(&request, target);
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.ends_with(r#"}],"tools":[{"type":"function","function":{"name":"Read","description":"Reads \"a\" file\n","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}},{"type":"function","function":{"name":"Bash","description":"","parameters":{}}}]}"#), "{text}");
        let Value::Object(extra) = json!({"tools": []}) else { panic!() };
        let target = Rendering { model: "m", ask_usage: false, reasoning: false, added: &[], extra: Some(&extra) };
        let body: Value = serde_json::from_slice(&render(&request, target)).unwrap();
        assert_eq!(body["tools"], json!([]), "the target's extra_body stands");
        assert_eq!(body["messages"], json!([{"role": "user", "content": "hi"}]));
    }

    #[test]
    fn a_targets_extra_body_still_stands_over_the_messages() {
        let request = Request {
            messages: vec![Message { role: Role::User, content: vec![Part::Text("hi".into())] }].into(),
            ..Request::default()
        };
        let Value::Object(extra) = json!({"messages": [{"role": "user", "content": "fixed"}], "seed": 7}) else {
            panic!()
        };
        let target = Rendering { model: "m", ask_usage: false, reasoning: false, added: &[], extra: Some(&extra) };
        let body: Value = serde_json::from_slice(&render(&request, target)).unwrap();
        assert_eq!(body["messages"], json!([{"role": "user", "content": "fixed"}]));
        assert_eq!(body["seed"], 7);
    }

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
            ]
            .into(),
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
