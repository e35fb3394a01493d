//! How a committed stream reaches the client: the relay hands each normalised chunk (and the
//! stream's end, break or block) to the caller's endpoint's [`ClientWire`], which writes it
//! in the caller's own API shape. No endpoint reaches into another's renderer.

use actix_web::web::Bytes;
use serde_json::{Value, json};
use shield_core::usage::TokenUsage;

/// A caller's stream format.
pub trait ClientWire: Send {
    /// One normalised chunk (its `model` already the target's); `usage` is what the upstream
    /// reported so far (or an estimate). `None`: nothing to send for it.
    fn chunk(&mut self, chunk: &Value, usage: TokenUsage) -> Option<Bytes>;
    /// The answer is complete.
    fn done(&mut self, usage: TokenUsage) -> Bytes;
    /// The upstream failed after the commit point; `message` says how (names the target).
    fn broken(&mut self, message: &str) -> Bytes;
    /// Shield refused the rest of the answer (output guardrail, tool RBAC).
    fn blocked(&mut self, reason: &str, model: &str, guardrails: Value, usage: TokenUsage) -> Bytes;
    /// Whether the usage-only chunk Shield asked the upstream for reaches [`Self::chunk`].
    fn wants_usage_chunk(&self) -> bool;
}

/// OpenAI's Chat Completions stream: `data: {chunk}` events and `data: [DONE]`.
pub struct OpenAiWire {
    /// The client asked for `stream_options.include_usage` itself.
    pub client_wants_usage: bool,
}

const DONE: &[u8] = b"data: [DONE]\n\n";

fn event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

fn then_done(value: &Value) -> Bytes {
    let mut bytes = format!("data: {value}\n\n").into_bytes();
    bytes.extend_from_slice(DONE);
    Bytes::from(bytes)
}

impl ClientWire for OpenAiWire {
    /// Thinking has no place in a chat completion chunk: it is taken out, and a chunk left
    /// with nothing to say (no role, content or tool call) is not sent.
    fn chunk(&mut self, chunk: &Value, _usage: TokenUsage) -> Option<Bytes> {
        let thinking = chunk.pointer("/choices/0/delta").and_then(|d| d.get(crate::provider::THINKING)).is_some();
        if !thinking {
            return Some(event(chunk));
        }
        let mut chunk = chunk.clone();
        let delta = chunk.pointer_mut("/choices/0/delta").and_then(Value::as_object_mut)?;
        delta.remove(crate::provider::THINKING);
        (!delta.is_empty()).then(|| event(&chunk))
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
