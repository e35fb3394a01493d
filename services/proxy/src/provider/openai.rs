//! OpenAI's Chat Completions (flavors `openai` and `azure`). Requests from OpenAI-shaped
//! callers go out as sent (Shield-only fields removed, `model` and `extra_body` written on the
//! fly); answers and stream chunks are read into the typed answer and deltas, and kept as sent
//! for OpenAI-shaped callers ([`completion`]).

mod chunk;
mod completion;
mod request;

use http::header::HeaderMap;
use serde_json::Value;
use shield_core::outcome::{classify_error_event, classify_status};
use shield_core::spliced::Spliced;
use shield_core::target::{Flavor, Target};
use shield_core::usage::TokenUsage;
use url::Url;

pub use chunk::NativeChunk;
pub use completion::OpenAiAnswer;

use super::{Answer, Chunk, Completion, Decoded, Native, Provider, StreamDecoder, join, reset_hint};
use crate::body::ChatRequest;
use crate::egress::Failure;

pub struct OpenAi {
    flavor: Flavor,
}

pub static OPENAI: OpenAi = OpenAi { flavor: Flavor::Openai };
pub static AZURE: OpenAi = OpenAi { flavor: Flavor::Azure };

impl Provider for OpenAi {
    /// `{base}/chat/completions`, or Azure's deployment URL with its `api-version`.
    fn endpoint(&self, target: &Target) -> Result<Url, &'static str> {
        match (self.flavor, &target.azure) {
            (Flavor::Azure, Some(azure)) => {
                let mut url = join(target, &format!("/openai/deployments/{}/chat/completions", azure.deployment))
                    .map_err(|_| "invalid azure deployment")?;
                url.query_pairs_mut().append_pair("api-version", &azure.api_version);
                Ok(url)
            }
            (Flavor::Azure, None) => Err("azure target without deployment"),
            _ => join(target, "/chat/completions"),
        }
    }

    /// `openai`-flavour streams are asked for the final usage chunk (ROUTING.md streaming);
    /// `azure` ones are not (unchanged from before the seam: older Azure API versions refuse
    /// `stream_options`).
    fn body(&self, request: &ChatRequest, target: &Target, stream: bool) -> Spliced {
        let ask_usage = stream && self.flavor == Flavor::Openai;
        let effort = reasoning_effort(request, target).map(|effort| ("reasoning_effort", Value::from(effort)));
        let (model, extra) = (&target.model, target.extra_body.as_ref());
        request.upstream_body(model, extra, ask_usage, effort.as_slice()).unwrap_or_else(|| {
            let added = effort.as_slice();
            let target = request::Rendering { model, ask_usage, reasoning: has_reasoning(target), added, extra };
            request::render(&request.exchange, target).into()
        })
    }

    /// A caller in Anthropic's shape: what this shape has no place for, and its reasoning
    /// controls unless the target has `reasoning_effort` (adaptive thinking on such a target
    /// is the model's default reasoning: nothing is dropped).
    fn dropped(&self, request: &ChatRequest, target: &Target) -> Vec<String> {
        let Some(origin) = request.anthropic() else { return Vec::new() };
        let mut dropped = Vec::new();
        if let Some(reasoning) = request.exchange.reasoning.as_ref().filter(|_| !has_reasoning(target)) {
            dropped.extend(reasoning.fields.iter().map(|f| f.to_string()));
        }
        dropped.extend(origin.unmapped.iter().cloned());
        dropped
    }

    fn answer(&self, body: Vec<u8>) -> Option<Answer> {
        let (openai, answer, usage) = OpenAiAnswer::parse(body)?;
        Some(Answer { body: Completion { answer, native: Some(Native::OpenAi(openai)) }, usage })
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(Decoder::default())
    }

    fn failure(&self, status: u16, headers: &HeaderMap, body: Vec<u8>) -> Failure {
        let reset_hint_ms = matches!(status, 402 | 429).then(|| reset_hint(headers)).flatten();
        Failure { class: classify_status(status, &body), status: Some(status), body: Some(body), reset_hint_ms }
    }
}

/// Whether the target's capabilities say it takes `reasoning_effort`.
fn has_reasoning(target: &Target) -> bool {
    target.capabilities.as_ref().and_then(|c| c.reasoning).unwrap_or(false)
}

/// The `reasoning_effort` for another shape's thinking or effort, on a target that takes it
/// (a Chat Completions caller's own `reasoning_effort` goes as sent).
fn reasoning_effort(request: &ChatRequest, target: &Target) -> Option<&'static str> {
    request.anthropic()?;
    let reasoning = request.exchange.reasoning.as_ref()?;
    has_reasoning(target).then_some(reasoning.effort?.as_str())
}

use super::as_sent::{Obj, has_surrogate_escape};

/// OpenAI's `usage` object: `prompt_tokens` (cached ones included, counted again in
/// `prompt_tokens_details.cached_tokens`) and `completion_tokens`.
pub(super) fn usage_of(usage: &Value) -> Option<TokenUsage> {
    let input = usage.get("prompt_tokens")?.as_u64()?;
    let output = usage.get("completion_tokens")?.as_u64()?;
    let cache_read = usage.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0);
    let reasoning = usage.pointer("/completion_tokens_details/reasoning_tokens").and_then(Value::as_u64).unwrap_or(0);
    Some(TokenUsage { input, output, cache_read, cache_write: 0, reasoning })
}

/// Each chunk is read into typed deltas and kept as sent; `[DONE]` ends; an `error` object is
/// the provider's error.
#[derive(Default)]
struct Decoder {
    usage: Option<TokenUsage>,
    id: String,
}

impl StreamDecoder for Decoder {
    fn decode(&mut self, _event: &str, data: &str, out: &mut Vec<Chunk>) -> Decoded {
        if data.trim() == "[DONE]" {
            return Decoded::Done;
        }
        match chunk::read(data) {
            chunk::Read::Error => Decoded::Error(classify_error_event(data.as_bytes()), data.as_bytes().to_vec()),
            chunk::Read::Chunk(read) => {
                if read.reported.is_some() {
                    self.usage = read.reported;
                }
                if self.id.is_empty()
                    && let Some(id) = read.id
                {
                    self.id = id;
                }
                out.push(Chunk { deltas: read.deltas, usage: read.usage, openai: Some(read.native) });
                Decoded::Continue
            }
            chunk::Read::Malformed => Decoded::Malformed,
        }
    }

    fn message_id(&self) -> &str {
        &self.id
    }

    fn usage(&self) -> Option<TokenUsage> {
        self.usage
    }

    /// OpenAI reports usage once, in the last chunk.
    fn usage_final(&self) -> bool {
        self.usage.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shield_core::exchange::Delta;
    use shield_core::outcome::Class;

    /// A stream's error event, classified.
    fn first_error(data: &str) -> Option<Class> {
        match Decoder::default().decode("", data, &mut Vec::new()) {
            Decoded::Error(class, _) => Some(class),
            _ => None,
        }
    }

    #[test]
    fn answers_keep_the_upstreams_parse_and_read_usage() {
        let body = br#"{"id":"c","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}"#;
        let answer = OPENAI.answer(body.to_vec()).unwrap();
        assert_eq!(answer.body.answer.text(), "hi");
        assert_eq!(
            answer.usage,
            Some(TokenUsage { input: 10, output: 3, cache_read: 4, cache_write: 0, reasoning: 2 })
        );
        assert!(OPENAI.answer(br#"{"error":{"message":"x"}}"#.to_vec()).is_none(), "not a completion");
        assert!(OPENAI.answer(b"garbage".to_vec()).is_none());
    }

    #[test]
    fn stream_events() {
        let mut decoder = OPENAI.decoder();
        let mut out = Vec::new();
        assert_eq!(decoder.decode("", r#"{"choices":[{"delta":{"content":"a"}}]}"#, &mut out), Decoded::Continue);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].deltas, [Delta::Text("a".into())]);
        let call = r#"{"id":"c1","choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":"{\"a\""}}]},"finish_reason":null}]}"#;
        decoder.decode("", call, &mut out);
        assert_eq!(
            out[1].deltas,
            [
                Delta::ToolCall { index: 0, id: "call_1".into(), name: "f".into() },
                Delta::ToolArguments { index: 0, json: "{\"a\"".into() }
            ]
        );
        assert_eq!(decoder.message_id(), "c1");
        assert_eq!(decoder.decode("", "{nope", &mut out), Decoded::Malformed);
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
        assert_eq!(decoder.decode("", usage, &mut out), Decoded::Continue);
        assert_eq!(decoder.usage().map(|u| (u.input, u.output)), Some((5, 2)));
        assert!(out.last().unwrap().usage && out.last().unwrap().deltas.is_empty());
        // A usage report Shield cannot read is still a usage-only chunk (never relayed unasked).
        decoder.decode("", r#"{"choices":[],"usage":{"prompt_tokens":5}}"#, &mut out);
        assert!(out.last().unwrap().usage);
        assert_eq!(decoder.decode("", "[DONE]", &mut out), Decoded::Done);
        assert_eq!(first_error(r#"{"error":{"code":"rate_limit_exceeded"}}"#), Some(Class::RateLimited));
    }

    #[test]
    fn endpoints() {
        let target: Target =
            serde_json::from_value(serde_json::json!({"base_url": "https://x.example.com/v1/", "model": "m",
            "flavor": "azure", "azure": {"deployment": "d1", "api_version": "2024-06-01"}}))
            .unwrap();
        assert_eq!(
            AZURE.endpoint(&target).unwrap().as_str(),
            "https://x.example.com/v1/openai/deployments/d1/chat/completions?api-version=2024-06-01"
        );
        assert_eq!(OPENAI.endpoint(&target).unwrap().as_str(), "https://x.example.com/v1/chat/completions");
    }

    #[test]
    fn thinking_becomes_reasoning_effort_where_the_target_has_it_and_is_named_where_not() {
        use shield_core::chat_request::{AnthropicOrigin, Origin};
        use shield_core::exchange::{Effort, Reasoning};
        let mut request =
            ChatRequest::parse(br#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#).unwrap();
        std::sync::Arc::make_mut(&mut request.exchange).reasoning =
            Some(Reasoning { effort: Some(Effort::High), fields: vec!["thinking", "output_config.effort"] });
        request.origin = Origin::Anthropic(std::sync::Arc::new(AnthropicOrigin {
            unmapped: vec!["context_management".into()],
            ..Default::default()
        }));
        let target = |capabilities: serde_json::Value| -> Target {
            serde_json::from_value(serde_json::json!({"base_url": "https://x.example.com/v1", "model": "gpt-x",
                "capabilities": capabilities}))
            .unwrap()
        };
        let reasoning = target(serde_json::json!({"reasoning": true}));
        let body: serde_json::Value =
            serde_json::from_slice(&OPENAI.body(&request, &reasoning, false).to_vec()).unwrap();
        assert_eq!(body["reasoning_effort"], "high");
        assert_eq!(
            body["messages"],
            serde_json::json!([{"role": "user", "content": "x"}]),
            "rendered from the typed request"
        );
        assert_eq!(OPENAI.dropped(&request, &reasoning), ["context_management"]);
        let plain = target(serde_json::json!({}));
        let body: serde_json::Value = serde_json::from_slice(&OPENAI.body(&request, &plain, false).to_vec()).unwrap();
        assert!(body.get("reasoning_effort").is_none());
        assert_eq!(OPENAI.dropped(&request, &plain), ["thinking", "output_config.effort", "context_management"]);
    }
}
