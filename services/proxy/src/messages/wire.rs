//! A committed stream in Anthropic's event sequence, whichever flavor answered:
//! `message_start` (with the real input usage when the upstream reported it by then, else the
//! router's estimate), `content_block_start` / `content_block_delta` / `content_block_stop`
//! for each text or tool-use block, `message_delta` with the stop reason and the final usage,
//! `message_stop`. A break after the commit point is an `error` event.

use actix_web::web::Bytes;
use serde_json::{Value, json};
use shield_core::usage::TokenUsage;

use super::response::{stop_reason, usage_json};
use crate::client_wire::ClientWire;

#[derive(Clone, Copy, PartialEq)]
enum Block {
    Text,
    Thinking,
    /// A tool call by its OpenAI `index`.
    Tool(u64),
}

pub struct AnthropicWire {
    /// The route name the caller sent, until the first chunk names the answering model.
    model: String,
    started: bool,
    /// The open content block and its index.
    open: Option<(u64, Block)>,
    next_index: u64,
    finish: Option<String>,
}

fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

impl AnthropicWire {
    pub fn new(model: &str) -> AnthropicWire {
        AnthropicWire { model: model.to_string(), started: false, open: None, next_index: 0, finish: None }
    }

    fn start(&mut self, chunk: &Value, usage: &TokenUsage, out: &mut String) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        if let Some(model) = chunk.get("model").and_then(Value::as_str) {
            self.model = model.to_string();
        }
        let id = match chunk.get("id").and_then(Value::as_str) {
            Some(id) if id.starts_with("msg_") => id.to_string(),
            Some(id) => format!("msg_{id}"),
            None => "msg_shield".into(),
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

    /// An Anthropic target's thinking, block by block as it came.
    fn thinking(&mut self, thinking: &Value, out: &mut String) {
        match thinking.get("start").and_then(Value::as_str) {
            Some("redacted_thinking") => {
                let block =
                    json!({"type": "redacted_thinking", "data": thinking.get("data").cloned().unwrap_or(json!(""))});
                self.open(Block::Thinking, block, out);
                self.close(out);
            }
            Some(_) => {
                self.open(Block::Thinking, json!({"type": "thinking", "thinking": ""}), out);
            }
            None => {
                let index = match self.open {
                    Some((index, Block::Thinking)) => index,
                    _ => self.open(Block::Thinking, json!({"type": "thinking", "thinking": ""}), out),
                };
                let delta = match (thinking.get("thinking"), thinking.get("signature")) {
                    (Some(text), _) => json!({"type": "thinking_delta", "thinking": text}),
                    (None, Some(signature)) => json!({"type": "signature_delta", "signature": signature}),
                    (None, None) => return,
                };
                out.push_str(&event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index, "delta": delta}),
                ));
            }
        }
    }

    fn tool(&mut self, call: &Value, out: &mut String) {
        let tool = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        // Some servers repeat the call's id on every delta: the open block of the same call
        // index goes on either way.
        let index = match (self.open, call.get("id").and_then(Value::as_str)) {
            (Some((index, Block::Tool(open))), _) if open == tool => index,
            (_, id) => {
                let name = call.pointer("/function/name").cloned().unwrap_or(json!(""));
                let block = json!({"type": "tool_use", "id": id.unwrap_or("toolu_shield"), "name": name, "input": {}});
                self.open(Block::Tool(tool), block, out)
            }
        };
        if let Some(partial) = call.pointer("/function/arguments").and_then(Value::as_str).filter(|a| !a.is_empty()) {
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
    fn chunk(&mut self, chunk: &Value, usage: TokenUsage) -> Option<Bytes> {
        let mut out = String::new();
        let delta = chunk.pointer("/choices/0/delta");
        let has_content = delta.is_some_and(|d| {
            d.get("content").and_then(Value::as_str).is_some_and(|t| !t.is_empty())
                || d.get("tool_calls").is_some()
                || d.get(crate::provider::THINKING).is_some()
        });
        if has_content || self.started {
            self.start(chunk, &usage, &mut out);
        }
        if let Some(thinking) = delta.and_then(|d| d.get(crate::provider::THINKING)) {
            self.thinking(thinking, &mut out);
        }
        if let Some(text) = delta.and_then(|d| d.get("content")).and_then(Value::as_str).filter(|t| !t.is_empty()) {
            self.text(text, &mut out);
        }
        for call in delta.and_then(|d| d.get("tool_calls")).and_then(Value::as_array).into_iter().flatten() {
            self.tool(call, &mut out);
        }
        if let Some(finish) = chunk.pointer("/choices/0/finish_reason").and_then(Value::as_str) {
            self.finish = Some(finish.to_string());
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    fn done(&mut self, usage: TokenUsage) -> Bytes {
        let mut out = String::new();
        self.start(&Value::Null, &usage, &mut out);
        let reason = stop_reason(self.finish.as_deref());
        self.end(reason, &usage, &mut out);
        Bytes::from(out)
    }

    fn broken(&mut self, message: &str) -> Bytes {
        Bytes::from(event("error", &json!({"type": "error", "error": {"type": "api_error", "message": message}})))
    }

    /// What was sent stands; the reason follows as text, and the message ends as a refusal.
    fn blocked(&mut self, reason: &str, _model: &str, _guardrails: Value, usage: TokenUsage) -> Bytes {
        let mut out = String::new();
        self.start(&Value::Null, &usage, &mut out);
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

    #[test]
    fn chunks_become_the_event_sequence() {
        let mut wire = AnthropicWire::new("smart");
        let usage = TokenUsage { input: 12, ..TokenUsage::default() };
        let chunk = |delta: Value, finish: Value| json!({"id": "chatcmpl-1", "model": "gpt-x", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        let mut all = Vec::new();
        all.extend(events(
            &wire.chunk(&chunk(json!({"role": "assistant", "content": "Hel"}), Value::Null), usage).unwrap(),
        ));
        all.extend(events(&wire.chunk(&chunk(json!({"content": "lo"}), Value::Null), usage).unwrap()));
        let call = json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "search", "arguments": ""}}]});
        all.extend(events(&wire.chunk(&chunk(call, Value::Null), usage).unwrap()));
        let more = json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\":1}"}}]});
        all.extend(events(&wire.chunk(&chunk(more, Value::Null), usage).unwrap()));
        assert!(wire.chunk(&chunk(json!({}), json!("tool_calls")), usage).is_none());
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
        let chunk = |delta: Value| json!({"choices": [{"index": 0, "delta": delta}]});
        let thinking = crate::provider::THINKING;
        let mut all = Vec::new();
        for delta in [
            json!({thinking: {"start": "thinking"}}),
            json!({thinking: {"thinking": "Let me see."}}),
            json!({thinking: {"signature": "sig=="}}),
            json!({"content": "42"}),
        ] {
            all.extend(events(&wire.chunk(&chunk(delta), usage).unwrap()));
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
        let mut openai = crate::client_wire::OpenAiWire { client_wants_usage: false };
        assert!(openai.chunk(&chunk(json!({thinking: {"thinking": "x"}})), usage).is_none(), "never to OpenAI callers");
    }

    #[test]
    fn a_repeated_call_id_stays_one_block() {
        let mut wire = AnthropicWire::new("smart");
        let usage = TokenUsage::default();
        let delta = |args: &str| {
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1",
            "function": {"name": "f", "arguments": args}}]}}]})
        };
        let mut all = Vec::new();
        for args in ["{\"a\":", "1}"] {
            all.extend(events(&wire.chunk(&delta(args), usage).unwrap()));
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
