//! A caller's chat request, parsed once and re-serialised for each target without copying
//! (the target's `model` and `extra_body` are written on the fly). Pure: the proxy reads the
//! body under its size limit and hands the bytes here; the fuzz target `request_body` drives it.

use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

/// OpenAI's own limit on `messages`; a longer conversation is refused before any routing.
pub const MAX_MESSAGES: usize = 2048;

/// Fields only Shield reads; never sent upstream (ROUTING.md "body hygiene").
const SHIELD_ONLY: [&str; 4] = ["x_shield", "prompt", "system", "run_id"];

/// Why a request body is refused (answered 400 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// A chat request: a JSON object with a string `model`.
#[derive(Clone)]
pub struct ChatRequest {
    pub fields: Map<String, Value>,
    pub model: String,
    /// Set when the request arrived in Anthropic's Messages shape: what only that shape has.
    pub anthropic: Option<Arc<AnthropicOrigin>>,
}

/// A request that arrived in Anthropic's Messages shape (`POST /v1/messages`). The normalised
/// `fields` carry what every flavor understands; this carries, typed, what only Anthropic's
/// API has, and the caller's body as sent, which an Anthropic target gets back (its `model`
/// set) so that nothing the caller asked for is lost on the same-shape path.
#[derive(Debug, Clone, Default)]
pub struct AnthropicOrigin {
    /// The Messages body as the caller sent it.
    pub original: Map<String, Value>,
    /// `anthropic-beta` as the caller sent it (forwarded verbatim to Anthropic targets, less
    /// the flags a target strips).
    pub beta: Option<String>,
    /// `anthropic-version` as the caller sent it.
    pub version: Option<String>,
    /// What only an Anthropic target can serve, each named by its field (e.g. `mcp_servers`,
    /// `messages.0.content.1 (document)`); empty when any flavor can serve the request.
    pub requires: Vec<String>,
    /// The text of blocks other flavors have no place for (documents, search results), for
    /// the input guardrails: an Anthropic target still receives it.
    pub guard_text: String,
    /// The caller's reasoning controls (`thinking`, `output_config.effort`).
    pub reasoning: Option<Reasoning>,
    /// Fields that shape the answer but that other flavors have no place for (e.g.
    /// `context_management`, `top_k`, a server tool): dropped for them, and named to the
    /// caller.
    pub unmapped: Vec<String>,
    /// Whether `messages` holds `role: "system"` messages (Claude Code's reminders).
    pub system_messages: bool,
}

/// How hard the caller asked the model to think, on the scale every reasoning control shares
/// (OpenAI's `reasoning_effort`, Anthropic's `output_config.effort`; Anthropic's `xhigh` and
/// `max` are `High`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    Low,
    Medium,
    High,
}

impl Effort {
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
        }
    }

    /// A thinking budget's effort: up to 4,096 tokens is low, up to 16,384 medium, beyond high.
    pub fn of_budget(budget_tokens: u64) -> Effort {
        match budget_tokens {
            0..=4096 => Effort::Low,
            4097..=16384 => Effort::Medium,
            _ => Effort::High,
        }
    }
}

/// The caller asked the model to reason: with an effort, or leaving it to the model
/// (Anthropic's adaptive thinking).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reasoning {
    pub effort: Option<Effort>,
    /// The caller's fields that asked for it (`thinking`, `output_config.effort`): named as
    /// dropped when the answering target has no reasoning control.
    pub fields: Vec<&'static str>,
}

impl ChatRequest {
    pub fn parse(body: &[u8]) -> Result<ChatRequest, BadRequest> {
        let value: Value = serde_json::from_slice(body).map_err(|e| BadRequest(format!("malformed JSON body: {e}")))?;
        let Value::Object(fields) = value else {
            return Err(BadRequest("the body must be a JSON object".into()));
        };
        let model = match fields.get("model") {
            Some(Value::String(model)) if !model.is_empty() => model.clone(),
            Some(_) => {
                return Err(BadRequest("`model` must be a non-empty string".into()));
            }
            None => {
                return Err(BadRequest("missing required field `model`".into()));
            }
        };
        Ok(ChatRequest { fields, model, anthropic: None })
    }

    /// What only an Anthropic target can serve in this request (documents, server tools, MCP
    /// servers), each named by its field; empty when any flavor can.
    pub fn requires_anthropic(&self) -> &[String] {
        self.anthropic.as_deref().map_or(&[], |origin| origin.requires.as_slice())
    }

    /// Whether the caller asked the model to think first (its first event may come late).
    pub fn reasons(&self) -> bool {
        self.anthropic.as_deref().is_some_and(|origin| origin.reasoning.is_some() || !origin.requires.is_empty())
    }

    pub fn stream(&self) -> bool {
        self.fields.get("stream").and_then(Value::as_bool).unwrap_or(false)
    }

    /// Checks what a routed call needs beyond `model`.
    pub fn check_routable(&self) -> Result<(), BadRequest> {
        match self.fields.get("messages") {
            Some(Value::Array(messages)) if messages.len() > MAX_MESSAGES => Err(BadRequest(format!(
                "`messages` has {} entries; at most {MAX_MESSAGES} are accepted",
                messages.len()
            ))),
            Some(Value::Array(messages)) if !messages.is_empty() => Ok(()),
            Some(_) => Err(BadRequest("`messages` must be a non-empty array".into())),
            None => Err(BadRequest("missing required field `messages`".into())),
        }
    }

    /// The body for one target: the caller's fields minus Shield-only ones, `model` set to the
    /// target's, `extra_body` merged over the rest.
    /// With `ask_usage`, `stream_options.include_usage` is set (the client's other stream
    /// options kept).
    /// `added` are fields the target's adapter sets (e.g. `reasoning_effort`), written over the
    /// caller's and under `extra_body`.
    pub fn upstream_body(
        &self,
        model: &str,
        extra: Option<&Map<String, Value>>,
        ask_usage: bool,
        added: &[(&str, Value)],
    ) -> Vec<u8> {
        let stream_options = ask_usage.then(|| {
            let mut options = self.fields.get("stream_options").and_then(Value::as_object).cloned().unwrap_or_default();
            options.insert("include_usage".into(), Value::Bool(true));
            Value::Object(options)
        });
        let body = UpstreamBody { fields: &self.fields, model, extra, stream_options: stream_options.as_ref(), added };
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// `max_completion_tokens` or `max_tokens`, when the request sets one.
    pub fn max_output_tokens(&self) -> Option<u64> {
        ["max_completion_tokens", "max_tokens"].iter().find_map(|k| self.fields.get(*k).and_then(Value::as_u64))
    }

    /// Whether the client itself asked for the final usage chunk.
    pub fn wants_usage(&self) -> bool {
        self.fields.get("stream_options").and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false)
    }

    /// The prompt's text (message contents, text parts included, and the text of Anthropic
    /// blocks other APIs lack, e.g. documents), for the input guardrails.
    pub fn prompt_text(&self) -> String {
        let mut text = self.messages_text();
        if let Some(origin) = &self.anthropic {
            text.push_str(&origin.guard_text);
        }
        text
    }

    fn messages_text(&self) -> String {
        let messages = self.fields.get("messages").and_then(Value::as_array);
        let mut text = String::new();
        for content in messages.into_iter().flatten().filter_map(|m| m.get("content")) {
            match content {
                Value::String(s) => text.push_str(s),
                Value::Array(parts) => {
                    parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).for_each(|s| text.push_str(s))
                }
                _ => {}
            }
            text.push('\n');
        }
        text
    }

    /// Characters of the prompt's text (message contents, text parts included): the basis of
    /// token estimates at 4 characters a token.
    pub fn prompt_chars(&self) -> usize {
        let messages = self.fields.get("messages").and_then(Value::as_array);
        messages
            .into_iter()
            .flatten()
            .filter_map(|m| m.get("content"))
            .map(|content| match content {
                Value::String(text) => text.len(),
                Value::Array(parts) => {
                    parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).map(str::len).sum()
                }
                _ => 0,
            })
            .sum()
    }
}

struct UpstreamBody<'a> {
    fields: &'a Map<String, Value>,
    model: &'a str,
    extra: Option<&'a Map<String, Value>>,
    stream_options: Option<&'a Value>,
    added: &'a [(&'a str, Value)],
}

impl Serialize for UpstreamBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let extra_sets = |key: &str| self.extra.is_some_and(|e| e.contains_key(key));
        let overridden = |key: &str| {
            key == "model"
                || SHIELD_ONLY.contains(&key)
                || (key == "stream_options" && self.stream_options.is_some())
                || self.added.iter().any(|(k, _)| *k == key)
                || extra_sets(key)
        };
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in self.fields.iter().filter(|(k, _)| !overridden(k)) {
            map.serialize_entry(key, value)?;
        }
        map.serialize_entry("model", self.model)?;
        if let Some(options) = self.stream_options {
            map.serialize_entry("stream_options", options)?;
        }
        for (key, value) in self.added.iter().filter(|(k, _)| !extra_sets(k)) {
            map.serialize_entry(key, value)?;
        }
        for (key, value) in self.extra.into_iter().flatten() {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn upstream_body_hygiene() {
        let request = ChatRequest::parse(
            json!({"model": "smart", "messages": [{"role": "user", "content": "hi"}], "x_shield": {"a": 1}, "prompt": "p",
                "system": "s", "run_id": "r", "temperature": 0.2, "provider": {"order": ["x"]}})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let extra = json!({"provider": {"order": ["openai"]}}).as_object().cloned();
        let body: Value = serde_json::from_slice(&request.upstream_body("gpt-4o", extra.as_ref(), false, &[])).unwrap();
        assert_eq!(
            body,
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2, "provider": {"order": ["openai"]}})
        );
    }

    #[test]
    fn streams_ask_for_usage_keeping_the_clients_options() {
        let request =
            ChatRequest::parse(br#"{"model": "m", "stream": true, "stream_options": {"x": 1}, "messages": []}"#)
                .unwrap();
        assert!(!request.wants_usage());
        let body: Value =
            serde_json::from_slice(&request.upstream_body("t", None, true, &[("reasoning_effort", json!("low"))]))
                .unwrap();
        assert_eq!(body["stream_options"], json!({"x": 1, "include_usage": true}));
        assert_eq!(body["reasoning_effort"], "low", "an adapter's own field is written");
    }

    #[test]
    fn parse_errors_name_the_problem() {
        for (body, want) in [
            (&b"{nope"[..], "malformed JSON"),
            (b"[1]", "JSON object"),
            (b"{}", "missing required field `model`"),
            (br#"{"model": 3}"#, "non-empty string"),
        ] {
            let err = ChatRequest::parse(body).err().unwrap().to_string();
            assert!(err.contains(want), "{err}");
        }
        let no_messages = ChatRequest::parse(br#"{"model": "m"}"#).unwrap();
        assert!(no_messages.check_routable().unwrap_err().to_string().contains("messages"));
    }
}
