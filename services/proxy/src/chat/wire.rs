//! A committed stream in OpenAI's Chat Completions shape: `data: {chunk}` events and
//! `data: [DONE]`. An OpenAI-flavour target's chunks go out as it sent them (only `model`
//! set); any other target's typed deltas become `chat.completion.chunk`s. Thinking has no
//! place in a chat completion chunk: it is not sent, and an event that carried only thinking
//! sends nothing.

use bytes::Bytes;
use serde_json::{Map, Value, json};
use shield_core::exchange::{Delta, Stop};
use shield_core::usage::TokenUsage;

use crate::client_wire::{ClientWire, StreamHead};
use crate::provider::Chunk;

pub struct OpenAiWire {
    /// The client asked for `stream_options.include_usage` itself.
    pub client_wants_usage: bool,
    /// A chunk went out (the first carries `role`).
    started: bool,
}

impl OpenAiWire {
    pub fn new(client_wants_usage: bool) -> OpenAiWire {
        OpenAiWire { client_wants_usage, started: false }
    }
}

const DONE: &[u8] = b"data: [DONE]\n\n";

fn event(value: &Value) -> Vec<u8> {
    format!("data: {value}\n\n").into_bytes()
}

fn then_done(value: &Value) -> Bytes {
    let mut bytes = event(value);
    bytes.extend_from_slice(DONE);
    Bytes::from(bytes)
}

/// `finish_reason` of a typed stop.
pub fn finish_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn => "stop",
        Stop::MaxTokens => "length",
        Stop::ToolUse => "tool_calls",
        Stop::Refusal => "content_filter",
    }
}

/// OpenAI's `usage` object.
pub fn usage_json(usage: &TokenUsage) -> Value {
    json!({"prompt_tokens": usage.input, "completion_tokens": usage.output, "total_tokens": usage.input + usage.output,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning}})
}

impl OpenAiWire {
    /// A chunk from typed deltas: text, tool-call openings and argument pieces, the finish.
    fn typed(&mut self, deltas: &[Delta], head: &StreamHead<'_>) -> Option<Value> {
        let mut delta = Map::new();
        let mut calls = Vec::new();
        let mut finish = Value::Null;
        let mut text = String::new();
        for piece in deltas {
            match piece {
                Delta::Text(more) => text.push_str(more),
                Delta::ToolCall { index, id, name } => calls.push(
                    json!({"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}),
                ),
                Delta::ToolArguments { index, json } => {
                    calls.push(json!({"index": index, "function": {"arguments": json}}))
                }
                Delta::Stop(stop) => finish = json!(finish_reason(*stop)),
                // No place for thinking in this shape.
                Delta::ThinkingStart | Delta::Thinking(_) | Delta::Signature(_) | Delta::RedactedThinking(_) => {}
            }
        }
        if !text.is_empty() {
            delta.insert("content".into(), Value::String(text));
        }
        if !calls.is_empty() {
            delta.insert("tool_calls".into(), Value::Array(calls));
        }
        if delta.is_empty() && finish.is_null() {
            return None;
        }
        if !std::mem::replace(&mut self.started, true) {
            delta.insert("role".into(), json!("assistant"));
        }
        Some(json!({"id": head.id, "object": "chat.completion.chunk", "created": unix_now(), "model": head.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}))
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl ClientWire for OpenAiWire {
    fn chunk(&mut self, chunk: Chunk, head: &StreamHead<'_>, usage: TokenUsage) -> Option<Bytes> {
        if let Some(native) = chunk.openai {
            self.started = true;
            return Some(Bytes::from(native.event(head.model)));
        }
        let mut out = Vec::new();
        if let Some(typed) = self.typed(&chunk.deltas, head) {
            out.extend(event(&typed));
        }
        if chunk.usage && self.client_wants_usage && chunk.deltas.iter().any(|d| matches!(d, Delta::Stop(_))) {
            out.extend(event(&json!({"id": head.id, "object": "chat.completion.chunk", "created": unix_now(),
                "model": head.model, "choices": [], "usage": usage_json(&usage)})));
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    fn done(&mut self, _usage: TokenUsage) -> Bytes {
        Bytes::from_static(DONE)
    }

    /// An `upstream_error` chunk (`code: stream_broken`), then `[DONE]`.
    fn broken(&mut self, message: &str) -> Bytes {
        then_done(
            &json!({"error": {"message": message, "type": "upstream_error", "code": "stream_broken", "param": null}}),
        )
    }

    /// A `content_filter` chunk carrying the reason, then `[DONE]`.
    fn blocked(&mut self, reason: &str, model: &str, guardrails: Value, _usage: TokenUsage) -> Bytes {
        then_done(&json!({"id": "chatcmpl-shield", "object": "chat.completion.chunk", "model": model,
            "choices": [{"index": 0, "delta": {"content": reason}, "finish_reason": "content_filter"}],
            "x_shield": {"guardrail_results": guardrails}}))
    }

    fn wants_usage_chunk(&self) -> bool {
        self.client_wants_usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(bytes: &[u8]) -> Vec<Value> {
        String::from_utf8_lossy(bytes)
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn typed_deltas_become_chunks_and_thinking_is_not_sent() {
        let mut wire = OpenAiWire::new(true);
        let head = StreamHead { id: "msg_1", model: "claude-x" };
        let usage = TokenUsage { input: 5, output: 2, ..TokenUsage::default() };
        assert!(
            wire.chunk(Chunk::of(vec![Delta::ThinkingStart, Delta::Thinking("hm".into())]), &head, usage).is_none()
        );
        let first = data(&wire.chunk(Chunk::of(vec![Delta::Text("Hi".into())]), &head, usage).unwrap());
        assert_eq!(first[0]["choices"][0]["delta"], json!({"role": "assistant", "content": "Hi"}));
        assert_eq!((first[0]["id"].as_str(), first[0]["model"].as_str()), (Some("msg_1"), Some("claude-x")));
        let call = Chunk::of(vec![
            Delta::ToolCall { index: 0, id: "toolu_1".into(), name: "f".into() },
            Delta::ToolArguments { index: 0, json: "{}".into() },
        ]);
        let calls = data(&wire.chunk(call, &head, usage).unwrap());
        assert_eq!(calls[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(calls[0]["choices"][0]["delta"]["tool_calls"][1]["function"]["arguments"], "{}");
        let end = Chunk { deltas: vec![Delta::Stop(Stop::ToolUse)], usage: true, openai: None };
        let end = data(&wire.chunk(end, &head, usage).unwrap());
        assert_eq!(end[0]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(end[1]["usage"]["completion_tokens"], 2, "the usage chunk the client asked for");
    }

    #[test]
    fn an_openai_targets_chunk_goes_out_as_sent_with_the_model_set() {
        let mut wire = OpenAiWire::new(false);
        let native = json!({"id": "c", "model": "up", "choices": [{"index": 0, "delta": {"content": "x"}, "logprobs": {"content": []}}]});
        let chunk = Chunk {
            deltas: vec![Delta::Text("x".into())],
            usage: false,
            openai: Some(crate::provider::NativeChunk::Tree(native)),
        };
        let out = data(&wire.chunk(chunk, &StreamHead { id: "c", model: "gpt-x" }, TokenUsage::default()).unwrap());
        assert_eq!(out[0]["model"], "gpt-x");
        assert_eq!(out[0]["choices"][0]["logprobs"], json!({"content": []}), "fields the typed model lacks are kept");
    }
}
