//! A committed stream in Anthropic's event sequence, whichever flavor answered:
//! `message_start` (with the real input usage when the upstream reported it by then, else the
//! router's estimate), `content_block_start` / `content_block_delta` / `content_block_stop`
//! for each text or tool-use block, `message_delta` with the stop reason and the final usage,
//! `message_stop`. A break after the commit point is an `error` event.

use actix_web::web::Bytes;
use serde_json::{Value, json};
use shield_core::exchange::{Delta, Stop};
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

fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

impl AnthropicWire {
    pub fn new(model: &str) -> AnthropicWire {
        AnthropicWire { model: model.to_string(), started: false, open: None, next_index: 0, stop: None }
    }

    fn start(&mut self, head: Option<&StreamHead<'_>>, usage: &TokenUsage, out: &mut String) {
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
        out.push_str(&event(
            "message_start",
            &json!({"type": "message_start", "message": {"id": id, "type": "message",
            "role": "assistant", "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage}}),
        ));
    }

    fn close(&mut self, out: &mut String) {
        if let Some((index, _)) = self.open.take() {
            out.push_str(&event("content_block_stop", &json!({"type": "content_block_stop", "index": index})));
        }
    }

    fn open(&mut self, block: Block, content_block: Value, out: &mut String) -> u64 {
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, block));
        out.push_str(&event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": content_block}),
        ));
        index
    }

    fn text(&mut self, text: &str, out: &mut String) {
        let index = match self.open {
            Some((index, Block::Text)) => index,
            _ => self.open(Block::Text, json!({"type": "text", "text": ""}), out),
        };
        out.push_str(&event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "text_delta", "text": text}}),
        ));
    }

    /// Thinking, block by block as it came: a delta goes on the open thinking block (one is
    /// opened if none is).
    fn thinking(&mut self, delta: Value, out: &mut String) {
        let index = match self.open {
            Some((index, Block::Thinking)) => index,
            _ => self.open(Block::Thinking, json!({"type": "thinking", "thinking": ""}), out),
        };
        out.push_str(&event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }

    fn tool_call(&mut self, tool: u32, id: &str, name: &str, out: &mut String) {
        // Some servers repeat the call's id on every delta: the open block of the same call
        // index goes on.
        if self.open.is_some_and(|(_, block)| block == Block::Tool(tool)) {
            return;
        }
        let id = if id.is_empty() { "toolu_shield" } else { id };
        self.open(Block::Tool(tool), json!({"type": "tool_use", "id": id, "name": name, "input": {}}), out);
    }

    fn tool_arguments(&mut self, tool: u32, partial: &str, out: &mut String) {
        let index = match self.open {
            Some((index, Block::Tool(open))) if open == tool => index,
            _ => self.open(
                Block::Tool(tool),
                json!({"type": "tool_use", "id": "toolu_shield", "name": "", "input": {}}),
                out,
            ),
        };
        if !partial.is_empty() {
            out.push_str(&event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": partial}}),
            ));
        }
    }

    fn end(&mut self, stop_reason: &str, usage: &TokenUsage, out: &mut String) {
        self.close(out);
        out.push_str(&event(
            "message_delta",
            &json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": usage_json(usage)}),
        ));
        out.push_str(&event("message_stop", &json!({"type": "message_stop"})));
    }
}

impl ClientWire for AnthropicWire {
    fn chunk(&mut self, chunk: Chunk, head: &StreamHead<'_>, usage: TokenUsage) -> Option<Bytes> {
        let mut out = String::new();
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
                Delta::Thinking(text) => self.thinking(json!({"type": "thinking_delta", "thinking": text}), &mut out),
                Delta::Signature(signature) => {
                    self.thinking(json!({"type": "signature_delta", "signature": signature}), &mut out)
                }
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
        let mut out = String::new();
        self.start(None, &usage, &mut out);
        let reason = stop_reason(self.stop.unwrap_or(Stop::EndTurn));
        self.end(reason, &usage, &mut out);
        Bytes::from(out)
    }

    fn broken(&mut self, message: &str) -> Bytes {
        Bytes::from(event("error", &json!({"type": "error", "error": {"type": "api_error", "message": message}})))
    }

    /// What was sent stands; the reason follows as text, and the message ends as a refusal.
    fn blocked(&mut self, reason: &str, _model: &str, _guardrails: Value, usage: TokenUsage) -> Bytes {
        let mut out = String::new();
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
