//! A committed stream in Anthropic's event sequence, whichever flavor answered:
//! `message_start` (with the real input usage when the upstream reported it by then, else the
//! router's estimate), `content_block_start` / `content_block_delta` / `content_block_stop`
//! for each text or tool-use block, `message_delta` with the stop reason and the final usage,
//! `message_stop`. A break after the commit point is an `error` event.

use bytes::Bytes;
use serde_json::{Value, json};
use shield_core::exchange::{Delta, Stop};
use shield_core::json_write::push_str;
use shield_core::usage::TokenUsage;

use super::response::{stop_reason, usage_json};
use crate::client_wire::{ClientWire, StreamHead};
use crate::provider::Chunk;

#[derive(Clone, Copy, PartialEq)]
enum Block {
    Text,
    Thinking,
    /// A tool call by the answer's call index.
    Tool(u32),
}

pub struct AnthropicWire {
    /// The route name the caller sent, until the first chunk names the answering model.
    model: String,
    started: bool,
    /// The open content block and its index.
    open: Option<(u64, Block)>,
    next_index: u64,
    stop: Option<Stop>,
}

fn event(out: &mut Vec<u8>, name: &str, data: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    // A `Value` always serialises, and a `Vec` always takes the bytes.
    let _ = serde_json::to_writer(&mut *out, data);
    out.extend_from_slice(b"\n\n");
}

/// A `content_block_delta` event: a piece of block `index`'s `field` (of delta type `kind`),
/// written straight into `out`. One is sent for every piece an upstream streams, and building
/// a `json!` tree and formatting it was most of the relay's work per event; the bytes are the
/// tree's (its keys in serde_json's order, the text escaped as serde_json escapes it), which a
/// property test holds them to.
fn delta(out: &mut Vec<u8>, index: u64, kind: &str, field: &str, text: &str) {
    out.extend_from_slice(b"event: content_block_delta\ndata: {\"delta\":{\"");
    out.extend_from_slice(field.as_bytes());
    out.extend_from_slice(b"\":");
    push_str(out, text);
    out.extend_from_slice(b",\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\"},\"index\":");
    out.extend_from_slice(itoa::Buffer::new().format(index).as_bytes());
    out.extend_from_slice(b",\"type\":\"content_block_delta\"}\n\n");
}

impl AnthropicWire {
    pub fn new(model: &str) -> AnthropicWire {
        AnthropicWire { model: model.to_string(), started: false, open: None, next_index: 0, stop: None }
    }

    fn start(&mut self, head: Option<&StreamHead<'_>>, usage: &TokenUsage, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        if let Some(head) = head {
            self.model = head.model.to_string();
        }
        let id = match head.map(|h| h.id) {
            Some(id) if id.starts_with("msg_") => id.to_string(),
            Some(id) if !id.is_empty() => format!("msg_{id}"),
            _ => "msg_shield".into(),
        };
        let mut usage = usage_json(usage);
        crate::json::set(&mut usage, &["output_tokens"], json!(1));
        event(
            out,
            "message_start",
            &json!({"type": "message_start", "message": {"id": id, "type": "message",
            "role": "assistant", "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage}}),
        );
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if let Some((index, _)) = self.open.take() {
            event(out, "content_block_stop", &json!({"type": "content_block_stop", "index": index}));
        }
    }

    fn open(&mut self, block: Block, content_block: Value, out: &mut Vec<u8>) -> u64 {
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, block));
        event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": content_block}),
        );
        index
    }

    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        let index = match self.open {
            Some((index, Block::Text)) => index,
            _ => self.open(Block::Text, json!({"type": "text", "text": ""}), out),
        };
        delta(out, index, "text_delta", "text", text);
    }

    /// Thinking, block by block as it came: a delta (`kind`, its `field`) goes on the open
    /// thinking block (one is opened if none is).
    fn thinking(&mut self, kind: &str, field: &str, text: &str, out: &mut Vec<u8>) {
        let index = match self.open {
            Some((index, Block::Thinking)) => index,
            _ => self.open(Block::Thinking, json!({"type": "thinking", "thinking": ""}), out),
        };
        delta(out, index, kind, field, text);
    }

    fn tool_call(&mut self, tool: u32, id: &str, name: &str, out: &mut Vec<u8>) {
        // Some servers repeat the call's id on every delta: the open block of the same call
        // index goes on.
        if self.open.is_some_and(|(_, block)| block == Block::Tool(tool)) {
            return;
        }
        let id = if id.is_empty() { "toolu_shield" } else { id };
        self.open(Block::Tool(tool), json!({"type": "tool_use", "id": id, "name": name, "input": {}}), out);
    }

    fn tool_arguments(&mut self, tool: u32, partial: &str, out: &mut Vec<u8>) {
        let index = match self.open {
            Some((index, Block::Tool(open))) if open == tool => index,
            _ => self.open(
                Block::Tool(tool),
                json!({"type": "tool_use", "id": "toolu_shield", "name": "", "input": {}}),
                out,
            ),
        };
        if !partial.is_empty() {
            delta(out, index, "input_json_delta", "partial_json", partial);
        }
    }

    fn end(&mut self, stop_reason: &str, usage: &TokenUsage, out: &mut Vec<u8>) {
        self.close(out);
        event(
            out,
            "message_delta",
            &json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": usage_json(usage)}),
        );
        event(out, "message_stop", &json!({"type": "message_stop"}));
    }
}

impl ClientWire for AnthropicWire {
    fn chunk(&mut self, chunk: Chunk, head: &StreamHead<'_>, usage: TokenUsage) -> Option<Bytes> {
        let mut out = Vec::new();
        let has_content = chunk.deltas.iter().any(|d| match d {
            Delta::Stop(_) => false,
            Delta::Text(text) => !text.is_empty(),
            _ => true,
        });
        if has_content || self.started {
            self.start(Some(head), &usage, &mut out);
        }
        for delta in chunk.deltas {
            match delta {
                Delta::Text(text) if !text.is_empty() => self.text(&text, &mut out),
                Delta::Text(_) => {}
                Delta::ThinkingStart => {
                    self.open(Block::Thinking, json!({"type": "thinking", "thinking": ""}), &mut out);
                }
                Delta::Thinking(text) => self.thinking("thinking_delta", "thinking", &text, &mut out),
                Delta::Signature(signature) => self.thinking("signature_delta", "signature", &signature, &mut out),
                Delta::RedactedThinking(data) => {
                    self.open(Block::Thinking, json!({"type": "redacted_thinking", "data": data}), &mut out);
                    self.close(&mut out);
                }
                Delta::ToolCall { index, id, name } => self.tool_call(index, &id, &name, &mut out),
                Delta::ToolArguments { index, json } => self.tool_arguments(index, &json, &mut out),
                Delta::Stop(stop) => self.stop = Some(stop),
            }
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    fn done(&mut self, usage: TokenUsage) -> Bytes {
        let mut out = Vec::new();
        self.start(None, &usage, &mut out);
        let reason = stop_reason(self.stop.unwrap_or(Stop::EndTurn));
        self.end(reason, &usage, &mut out);
        Bytes::from(out)
    }

    fn broken(&mut self, message: &str) -> Bytes {
        let mut out = Vec::new();
        event(&mut out, "error", &json!({"type": "error", "error": {"type": "api_error", "message": message}}));
        Bytes::from(out)
    }

    /// What was sent stands; the reason follows as text, and the message ends as a refusal.
    fn blocked(&mut self, reason: &str, _model: &str, _guardrails: Value, usage: TokenUsage) -> Bytes {
        let mut out = Vec::new();
        self.start(None, &usage, &mut out);
        self.close(&mut out);
        self.text(reason, &mut out);
        self.end("refusal", &usage, &mut out);
        Bytes::from(out)
    }

    /// The usage chunk carries nothing to send but its figures, which arrive through `usage`.
    fn wants_usage_chunk(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(bytes: &[u8]) -> Vec<(String, Value)> {
        String::from_utf8_lossy(bytes)
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                (
                    name.trim_start_matches("event: ").to_string(),
                    serde_json::from_str(data.trim_start_matches("data: ")).unwrap(),
                )
            })
            .collect()
    }

    const HEAD: StreamHead<'static> = StreamHead { id: "chatcmpl-1", model: "gpt-x" };

    fn send(wire: &mut AnthropicWire, deltas: Vec<Delta>, usage: TokenUsage) -> Option<Bytes> {
        wire.chunk(Chunk::of(deltas), &HEAD, usage)
    }

    #[test]
    fn chunks_become_the_event_sequence() {
        let mut wire = AnthropicWire::new("smart");
        let usage = TokenUsage { input: 12, ..TokenUsage::default() };
        let mut all = Vec::new();
        all.extend(events(&send(&mut wire, vec![Delta::Text("Hel".into())], usage).unwrap()));
        all.extend(events(&send(&mut wire, vec![Delta::Text("lo".into())], usage).unwrap()));
        let call = Delta::ToolCall { index: 0, id: "call_1".into(), name: "search".into() };
        all.extend(events(&send(&mut wire, vec![call], usage).unwrap()));
        let more = Delta::ToolArguments { index: 0, json: "{\"q\":1}".into() };
        all.extend(events(&send(&mut wire, vec![more], usage).unwrap()));
        assert!(send(&mut wire, vec![Delta::Stop(Stop::ToolUse)], usage).is_none());
        all.extend(events(&wire.done(TokenUsage { input: 12, output: 7, ..TokenUsage::default() })));
        let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(all[0].1["message"]["usage"]["input_tokens"], 12, "real input usage in message_start");
        assert_eq!(all[0].1["message"]["model"], "gpt-x");
        assert_eq!(
            all[5].1["content_block"],
            json!({"type": "tool_use", "id": "call_1", "name": "search", "input": {}})
        );
        assert_eq!(all[6].1["delta"], json!({"type": "input_json_delta", "partial_json": "{\"q\":1}"}));
        assert_eq!(all[8].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(all[8].1["usage"]["output_tokens"], 7);
    }

    #[test]
    fn thinking_is_relayed_as_its_own_block_before_the_text() {
        let mut wire = AnthropicWire::new("smart");
        let usage = TokenUsage::default();
        let mut all = Vec::new();
        for delta in [
            Delta::ThinkingStart,
            Delta::Thinking("Let me see.".into()),
            Delta::Signature("sig==".into()),
            Delta::Text("42".into()),
        ] {
            all.extend(events(&send(&mut wire, vec![delta], usage).unwrap()));
        }
        let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta"
            ]
        );
        assert_eq!(all[1].1["content_block"]["type"], "thinking");
        assert_eq!(all[2].1["delta"], json!({"type": "thinking_delta", "thinking": "Let me see."}));
        assert_eq!(all[3].1["delta"], json!({"type": "signature_delta", "signature": "sig=="}));
        assert_eq!((all[5].1["index"].clone(), all[5].1["content_block"]["type"].clone()), (json!(1), json!("text")));
    }

    #[test]
    fn a_repeated_call_id_stays_one_block() {
        let mut wire = AnthropicWire::new("smart");
        let usage = TokenUsage::default();
        let mut all = Vec::new();
        for args in ["{\"a\":", "1}"] {
            let deltas = vec![
                Delta::ToolCall { index: 0, id: "call_1".into(), name: "f".into() },
                Delta::ToolArguments { index: 0, json: args.into() },
            ];
            all.extend(events(&send(&mut wire, deltas, usage).unwrap()));
        }
        let starts = all.iter().filter(|(n, _)| n == "content_block_start").count();
        assert_eq!(starts, 1, "{all:?}");
    }

    proptest::proptest! {
        /// A delta written straight into the stream is, byte for byte, the `json!` tree's
        /// rendering it replaced, whatever the text (quotes, backslashes, control characters,
        /// any Unicode) and the block's index.
        #[test]
        fn a_delta_is_written_as_its_tree_would_be(text in "\\PC*|[\"\\\\\u{0}-\u{1f}\u{7f}-\u{a0}\u{2028}\u{2029}é😀a]{0,40}", index in proptest::prelude::any::<u64>()) {
            for (kind, field) in [("text_delta", "text"), ("input_json_delta", "partial_json"), ("thinking_delta", "thinking"), ("signature_delta", "signature")] {
                let mut written = Vec::new();
                delta(&mut written, index, kind, field, &text);
                let tree = json!({"type": "content_block_delta", "index": index, "delta": {"type": kind, field: text}});
                let expected = format!("event: content_block_delta\ndata: {tree}\n\n");
                proptest::prop_assert_eq!(String::from_utf8(written).unwrap(), expected);
            }
        }
    }

    #[test]
    fn breaks_and_blocks() {
        let mut wire = AnthropicWire::new("smart");
        let broken = events(&wire.broken("the stream from target `a` broke"));
        assert_eq!(broken[0].0, "error");
        assert_eq!(broken[0].1["error"]["type"], "api_error");
        let blocked = events(&wire.blocked("blocked by secrets_detection", "m", Value::Null, TokenUsage::default()));
        let names: Vec<&str> = blocked.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(blocked[4].1["delta"]["stop_reason"], "refusal");
    }
}
