//! An Anthropic target's `message`, read into the typed answer and kept as sent for callers
//! of the same shape (Messages' callers, Claude Code).
//!
//! * [`Kept::Raw`]: the upstream's own bytes ([`AsSent`]). A borrowed view checks the shape
//!   and reads only what the typed answer needs (the id, each block's text, thinking, tool use
//!   and redacted thinking, the stop reason, `usage`); the answer to a Messages caller is the
//!   same bytes with `model` replaced and `x_shield` spliced in. Before, each answer became a
//!   tree that was walked, written with Shield's `x_shield` tree and dropped: a tenth of a
//!   relayed 148 KB Messages request's instructions (issue 33).
//! * [`Kept::Tree`]: a JSON map, for the answer the view does not take (a field of another
//!   type than the view reads, a duplicate key it reads, an upstream's own `x_shield`, a
//!   surrogate escape, no `model`).
//!
//! Either way the typed answer is the same; the tests hold both to it.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use shield_core::exchange::{self, Block};
use shield_core::usage::TokenUsage;

use super::{stop_of, usage_of};
use crate::provider::as_sent::{AsSent, Kept, Obj, Place, has_surrogate_escape, place};

/// An Anthropic `message` as the upstream sent it.
#[derive(Debug)]
pub struct AnthropicAnswer(Kept);

/// What a read yields: the answer as sent, typed, and the usage it reported.
pub type Read = (AnthropicAnswer, exchange::Answer, Option<TokenUsage>);

#[derive(Deserialize)]
struct View<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    model: &'a RawValue,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    content: Vec<Obj<BlockView<'a>>>,
    #[serde(borrow, default)]
    stop_reason: Option<Cow<'a, str>>,
    /// Read as the tree reads it ([`usage_of`]), from its own small tree.
    #[serde(borrow, default, deserialize_with = "present")]
    usage: Option<&'a RawValue>,
    /// Present only to send such an answer down the general path (it drops the key).
    #[serde(borrow, default)]
    x_shield: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct BlockView<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    signature: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    data: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    /// Written as the tree writes it (compact), `null` included.
    #[serde(borrow, default, deserialize_with = "present")]
    input: Option<&'a RawValue>,
}

/// A field that is there, whatever its value (`null` too, which `Option` would read as absent).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(deserializer).map(Some)
}

fn owned(value: &Option<Cow<'_, str>>) -> String {
    value.as_deref().unwrap_or_default().to_string()
}

impl AnthropicAnswer {
    /// A Messages answer body: `None` when it is not a `message` (no `content` array).
    pub fn read(bytes: Vec<u8>) -> Option<Read> {
        if let Some(text) = std::str::from_utf8(&bytes).ok().filter(|t| t.trim_start().starts_with('{'))
            && let Some((place, answer, usage)) = read(text)
        {
            return Some((AnthropicAnswer(Kept::Raw(Box::new(AsSent::new(bytes, place)))), answer, usage));
        }
        let message: Value = serde_json::from_slice(&bytes).ok()?;
        if message.get("type").and_then(Value::as_str) != Some("message") {
            return None;
        }
        let answer = typed_of(&message)?;
        let usage = message.get("usage").map(usage_of);
        let Value::Object(message) = message else { return None };
        Some((AnthropicAnswer(Kept::Tree(message)), answer, usage))
    }

    /// The answer to a Messages caller: `model` set to the answering target's model, Shield's
    /// `x_shield` added (an upstream's own dropped).
    pub fn render(self, model: &str, x_shield: &impl crate::x_shield::XShieldJson) -> Vec<u8> {
        self.0.render(model, x_shield)
    }
}

/// The borrowed look at `text`; `None` sends it down the general path.
fn read(text: &str) -> Option<(Place, exchange::Answer, Option<TokenUsage>)> {
    if has_surrogate_escape(text) {
        return None;
    }
    let view: View<'_> = serde_json::from_str(text).ok()?;
    if view.kind != "message" || view.x_shield.is_some() {
        return None;
    }
    let place = place(text, view.model)?;
    let mut blocks = Vec::with_capacity(view.content.len());
    for block in &view.content {
        blocks.extend(match block.kind.as_deref() {
            Some("text") => Some(Block::Text(owned(&block.text))),
            Some("thinking") => {
                Some(Block::Thinking { thinking: owned(&block.thinking), signature: owned(&block.signature) })
            }
            Some("redacted_thinking") => Some(Block::RedactedThinking(owned(&block.data))),
            Some("tool_use") => Some(Block::ToolUse {
                id: owned(&block.id),
                name: owned(&block.name),
                input: match block.input {
                    Some(input) => serde_json::from_str::<Value>(input.get()).ok()?.to_string(),
                    None => "{}".to_string(),
                },
            }),
            _ => None,
        });
    }
    let answer = exchange::Answer { id: owned(&view.id), blocks, stop: view.stop_reason.as_deref().map(stop_of) };
    let usage = match view.usage {
        Some(usage) => Some(usage_of(&serde_json::from_str(usage.get()).ok()?)),
        None => None,
    };
    Some((place, answer, usage))
}

/// The typed answer of a message held as a tree (`None`: no `content` array).
fn typed_of(message: &Value) -> Option<exchange::Answer> {
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
    Some(exchange::Answer {
        id: text(message, "id"),
        blocks,
        stop: message.get("stop_reason").and_then(Value::as_str).map(stop_of),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::as_sent::render_tree;
    use proptest::prelude::*;
    use serde_json::json;

    fn is_raw(answer: &AnthropicAnswer) -> bool {
        matches!(answer.0, Kept::Raw(_))
    }

    /// What the tree reading makes of `body`: the answer, its usage and its rendering.
    fn as_a_tree(body: &Value) -> (exchange::Answer, Option<TokenUsage>, Value) {
        let Value::Object(map) = body.clone() else { panic!("{body}") };
        let answer = typed_of(body).unwrap();
        let usage = body.get("usage").map(usage_of);
        let rendered = render_tree(map, "m-routed", &json!({"routing": 1}));
        (answer, usage, serde_json::from_slice(&rendered).unwrap())
    }

    /// Read from `bytes`, the answer is the tree's, and so is its rendering.
    fn agrees(bytes: &[u8], body: &Value) -> bool {
        let (read, answer, usage) = AnthropicAnswer::read(bytes.to_vec()).unwrap();
        let raw = is_raw(&read);
        let rendered: Value = serde_json::from_slice(&read.render("m-routed", &json!({"routing": 1}))).unwrap();
        let (tree_answer, tree_usage, tree_rendered) = as_a_tree(body);
        assert_eq!(answer, tree_answer, "{body}");
        assert_eq!(usage, tree_usage, "{body}");
        assert_eq!(rendered, tree_rendered, "{body}");
        raw
    }

    fn message(content: Value) -> Value {
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": content,
               "stop_reason": "tool_use", "stop_sequence": null,
               "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 7}})
    }

    #[test]
    fn a_message_is_kept_as_sent_and_reads_as_its_tree() {
        let body = message(json!([
            {"type": "thinking", "thinking": "let me see", "signature": "sig=="},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Looking \"there\"\n", "citations": [{"type": "char_location"}]},
            {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {"q": "x"}},
            {"type": "tool_use", "id": "tu_1", "name": "Read", "input": {"path": "/a", "limit": 10}},
            {"type": "tool_use", "id": "tu_2", "name": "Ping", "input": null},
            {"type": "tool_use", "id": "tu_3", "name": "Noop"}
        ]));
        // Written with spaces and keys in an order of the upstream's own: kept as sent.
        let bytes = serde_json::to_string_pretty(&body).unwrap();
        assert!(agrees(bytes.as_bytes(), &body), "read by the view");
        let (read, answer, _) = AnthropicAnswer::read(bytes.clone().into_bytes()).unwrap();
        assert_eq!(answer.blocks.len(), 6, "the server tool's block has no place in the typed answer");
        let rendered = String::from_utf8(read.render("m-routed", &json!({"routing": 1}))).unwrap();
        let (head, _) = bytes.split_at(bytes.rfind('}').unwrap());
        assert!(
            rendered.starts_with(&head.replace("\"claude-x\"", "\"m-routed\"")),
            "the upstream's bytes, only `model` replaced: {rendered}"
        );
        assert!(rendered.ends_with(",\"x_shield\":{\"routing\":1}}"), "{rendered}");
    }

    #[test]
    fn what_the_view_does_not_take_is_read_as_a_tree_alike() {
        let base = message(json!([{"type": "text", "text": "hi"}]));
        let with = |key: &str, value: Value| {
            let mut body = base.clone();
            body[key] = value;
            body
        };
        for body in [
            with("x_shield", json!({"routing": "the upstream's own"})),
            with("id", json!(7)),
            with("stop_reason", json!(["end_turn"])),
            with("usage", Value::Null),
            message(json!([{"type": "text", "text": "\u{1F600} as a pair: \\ud83d\\ude00"}])),
            message(json!([{"type": "text", "text": 5}, "not a block"])),
            message(json!([{"type": 5}])),
        ] {
            let bytes = serde_json::to_vec(&body).unwrap();
            agrees(&bytes, &body);
        }
        // A surrogate escape, and `model` missing or twice: the tree's way, the same answer.
        let escaped = br#"{"type":"message","model":"m","id":"a","content":[{"type":"text","text":"\ud83d\ude00"}]}"#;
        assert!(!agrees(escaped, &serde_json::from_slice(escaped).unwrap()));
        let twice = br#"{"type":"message","model":"a","model":"b","content":[]}"#;
        assert!(!agrees(twice, &serde_json::from_slice(twice).unwrap()));
        let none = br#"{"type":"message","content":[{"type":"text","text":"x"}]}"#;
        assert!(!agrees(none, &serde_json::from_slice(none).unwrap()));
        // Not a message: nothing, either way.
        for body in [&br#"{"type":"error","model":"m","content":[]}"#[..], b"[1]", b"{\"type\":\"message\"}", b"\xff"] {
            assert!(AnthropicAnswer::read(body.to_vec()).is_none(), "{:?}", String::from_utf8_lossy(body));
        }
    }

    fn block() -> impl Strategy<Value = Value> {
        let text = prop_oneof![Just(Value::Null), "[a-z \"\\\\\n]{0,12}".prop_map(Value::from), Just(json!(1))];
        let kind = prop_oneof![
            Just(json!("text")),
            Just(json!("thinking")),
            Just(json!("redacted_thinking")),
            Just(json!("tool_use")),
            Just(json!("web_search_tool_result")),
            Just(Value::Null),
        ];
        let input = prop_oneof![Just(None), Just(Some(Value::Null)), Just(Some(json!({"b": [1, 2.5], "a": "x"})))];
        (kind, text.clone(), text, input).prop_map(|(kind, first, second, input)| {
            let mut block = json!({"type": kind, "text": first.clone(), "thinking": first, "signature": second.clone(),
                                   "data": second.clone(), "id": second.clone(), "name": second});
            if let Some(input) = input {
                block["input"] = input;
            }
            block
        })
    }

    proptest! {
        /// Whatever a message holds, written compact or pretty, both readings give the same
        /// typed answer, usage and rendering.
        #[test]
        fn both_readings_agree_on_any_message(
            blocks in proptest::collection::vec(block(), 0..6),
            stop in prop_oneof![Just(Value::Null), Just(json!("end_turn")), Just(json!("max_tokens"))],
            usage in prop_oneof![Just(None), Just(Some(Value::Null)), (0u64..100, 0u64..100).prop_map(|(i, o)| Some(json!({"input_tokens": i, "output_tokens": o})))],
            pretty: bool,
        ) {
            let mut body = json!({"type": "message", "model": "claude-x", "id": "msg", "content": blocks, "stop_reason": stop});
            if let Some(usage) = usage {
                body["usage"] = usage;
            }
            let bytes = if pretty { serde_json::to_vec_pretty(&body).unwrap() } else { serde_json::to_vec(&body).unwrap() };
            agrees(&bytes, &body);
        }
    }
}
