use super::super::{MessagesBody, messages_request};
use super::*;
use crate::provider::texts_strategy::{either_form, text};
use proptest::prelude::*;
use serde_json::{Map, json};
use shield_core::exchange::Request;
use shield_core::target::Target;

/// The system prompt and messages as trees of values, as they were built before they were
/// written directly: the oracle the writer is held to.
mod tree {
    use serde_json::{Value, json};
    use shield_core::exchange::{self, Image, Part, Role};

    use super::super::super::anthropics_thinking;

    fn text_block(text: &str) -> Option<Value> {
        (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
    }

    /// `(system, messages)`: `system` is `None` when it has no block.
    pub fn request(request: &exchange::Request) -> (Option<Value>, Value) {
        let mut system: Vec<Value> = request.system.iter().filter_map(|t| text_block(t)).collect();
        let mut messages: Vec<(&str, Vec<Value>)> = Vec::new();
        for message in &request.messages {
            let role = match message.role {
                Role::System => {
                    system.extend(
                        message.content.iter().filter_map(|p| if let Part::Text(t) = p { text_block(t) } else { None }),
                    );
                    continue;
                }
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            let blocks = message.content.iter().filter_map(block_of).collect::<Vec<_>>();
            match messages.last_mut() {
                Some((last, merged)) if *last == role => merged.extend(blocks),
                _ => messages.push((role, blocks)),
            }
        }
        let messages = messages.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
        ((!system.is_empty()).then_some(Value::Array(system)), Value::Array(messages))
    }

    fn block_of(part: &Part) -> Option<Value> {
        match part {
            Part::Thinking { .. } if !anthropics_thinking(part) => None,
            Part::Text(text) => text_block(text),
            Part::Image(Image::Base64 { media_type, data }) => {
                Some(json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}))
            }
            Part::Image(Image::Url(url)) => Some(json!({"type": "image", "source": {"type": "url", "url": url}})),
            Part::ToolUse { id, name, input } => {
                let input =
                    serde_json::from_str::<Value>(input).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
                Some(json!({"type": "tool_use", "id": id, "name": name, "input": input}))
            }
            Part::ToolResult { id, content, is_error } => {
                let mut result = json!({"type": "tool_result", "tool_use_id": id,
                    "content": text_block(content).into_iter().collect::<Vec<_>>()});
                if *is_error {
                    result["is_error"] = Value::Bool(true);
                }
                Some(result)
            }
            Part::Thinking { thinking, signature } => {
                Some(json!({"type": "thinking", "thinking": thinking, "signature": signature}))
            }
            Part::RedactedThinking(data) => Some(json!({"type": "redacted_thinking", "data": data})),
            Part::Opaque { .. } => None,
        }
    }
}

fn input() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(r#"{"q": "x", "n": 1.50, "q": "y\/z"}"#.to_string()),
        Just(r#"{"path":"src/main.rs","content":"fn main() {\n}\n"}"#.to_string()),
        Just("[1, 2]".to_string()),
        text(),
    ]
}

fn signature() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), Just("EqQBCkYIBxgC".to_string()), Just("gemini:abc".to_string())]
}

fn part() -> impl Strategy<Value = Part> {
    prop_oneof![
        3 => either_form().prop_map(Part::Text),
        1 => text().prop_map(|url| Part::Image(Image::Url(url))),
        1 => (text(), text()).prop_map(|(media_type, data)| Part::Image(Image::Base64 { media_type, data })),
        2 => (text(), text(), input()).prop_map(|(id, name, input)| Part::ToolUse { id, name, input }),
        2 => (text(), either_form(), any::<bool>()).prop_map(|(id, content, is_error)| Part::ToolResult { id, content, is_error }),
        1 => (text(), signature()).prop_map(|(thinking, signature)| Part::Thinking { thinking, signature }),
        1 => text().prop_map(Part::RedactedThinking),
        1 => (text(), text()).prop_map(|(kind, text)| Part::Opaque { kind, text }),
    ]
}

fn history() -> impl Strategy<Value = Request> {
    let role = prop_oneof![Just(Role::System), Just(Role::User), Just(Role::Assistant)];
    let message = (role, prop::collection::vec(part(), 0..4)).prop_map(|(role, content)| Message { role, content });
    (prop::collection::vec(either_form(), 0..3), prop::collection::vec(message, 0..8)).prop_map(|(system, messages)| {
        Request { system: system.into(), messages: messages.into(), ..Request::default() }
    })
}

fn target() -> Target {
    serde_json::from_value(json!({"base_url": "https://api.anthropic.com/v1", "model": "claude-sonnet-4-5",
        "flavor": "anthropic"}))
    .unwrap()
}

/// The body written for `request` and what `fields` the target's settings add.
fn written(request: &Request, extra: Option<Map<String, Value>>) -> Value {
    let mut fields = messages_request(request, &target());
    fields.extend(extra.into_iter().flatten());
    let written = MessagesBody { fields, converted: Some(request) }.to_vec();
    serde_json::from_slice(&written).expect("a JSON object")
}

proptest! {
    /// Written directly, the system prompt and the messages are the tree's: the same values in
    /// the same order, no `system` when it has no block.
    #[test]
    fn a_converted_request_is_written_as_the_tree_built_it(request in history()) {
        let (system, messages) = tree::request(&request);
        let body = written(&request, None);
        prop_assert_eq!(body.get("system"), system.as_ref());
        prop_assert_eq!(&body["messages"], &messages);
        prop_assert_eq!(&body["model"], "claude-sonnet-4-5");
        prop_assert_eq!(&body["max_tokens"], 4096);
        let mut alone = Vec::new();
        super::messages(&request, &mut alone);
        prop_assert_eq!(serde_json::from_slice::<Value>(&alone).expect("a JSON array"), messages);
    }
}

/// An agent's history converted fits the buffer sized for it (not regrown and copied as it
/// fills), and its texts read as sent reach the body byte for byte.
#[test]
fn a_converted_history_fits_its_buffer_and_carries_its_texts_as_sent() {
    let line = "    let value = config.get(\"path\").unwrap_or_default(); // x\n";
    let file = serde_json::to_string(&json!({"file_path": "src/main.rs", "content": line.repeat(40)})).unwrap();
    let as_sent = r#""tool output \u00e9\/ with escapes\n""#;
    let mut messages = Vec::new();
    for turn in 0..50 {
        let id = format!("toolu_{turn}");
        messages.push(Message { role: Role::User, content: vec![Part::Text(line.repeat(3).into())] });
        let call = Part::ToolUse { id: id.clone(), name: "Write".into(), input: file.clone() };
        messages.push(Message { role: Role::Assistant, content: vec![Part::Text("writing".into()), call] });
        let content = Text::json(serde_json::from_str(as_sent).unwrap()).unwrap();
        let result = Part::ToolResult { id, content, is_error: false };
        messages.push(Message { role: Role::User, content: vec![result] });
    }
    let request = Request {
        system: vec![Text::from(line.repeat(50))].into(),
        messages: messages.into(),
        tools: vec![exchange::Tool { name: "Read".into(), description: "Reads\n".into(), schema: json!({}).into() }]
            .into(),
        ..Request::default()
    };
    let fields = messages_request(&request, &target());
    let body = MessagesBody { fields, converted: Some(&request) }.to_vec();
    let sized = crate::provider::history_size(&request) + tools_size(&request.tools) + 64;
    assert!(body.len() <= sized + 128, "{} written, {sized} sized for", body.len());
    let text = String::from_utf8(body).unwrap();
    assert_eq!(text.matches(as_sent).count(), 50, "each tool result as sent");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["messages"], tree::request(&request).1);
    assert_eq!(body["tools"], json!([{"name": "Read", "description": "Reads\n", "input_schema": {}}]));
}

/// A target's `extra_body` naming `system`, `messages` or `tools` stands over what the request
/// would write, as it did when they were entries of the map.
#[test]
fn a_targets_extra_body_stands_over_the_written_fields() {
    let request = Request {
        system: vec![Text::from("Be brief.")].into(),
        messages: vec![Message { role: Role::User, content: vec![Part::Text("hi".into())] }].into(),
        tools: vec![exchange::Tool { name: "Read".into(), description: "".into(), schema: json!({}).into() }].into(),
        ..Request::default()
    };
    let body = written(&request, None);
    assert_eq!(body["system"], json!([{"type": "text", "text": "Be brief."}]));
    assert_eq!(body["tools"], json!([{"name": "Read", "input_schema": {}}]), "no empty description");
    let Value::Object(extra) =
        json!({"system": "fixed", "messages": [{"role": "user", "content": "fixed"}], "tools": [], "top_k": 3})
    else {
        panic!()
    };
    let body = written(&request, Some(extra.clone()));
    for (key, value) in &extra {
        assert_eq!(&body[key], value, "{key}");
    }
}
