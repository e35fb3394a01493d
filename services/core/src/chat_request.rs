//! A caller's chat request, parsed once and re-serialised for each target without copying
//! (the target's `model` and `extra_body` are written on the fly). Pure: the proxy reads the
//! body under its size limit and hands the bytes here; the fuzz target `request_body` drives it.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

/// OpenAI's own limit on `messages`; a longer conversation is refused before any routing.
pub const MAX_MESSAGES: usize = 2048;

/// Where the Anthropic ingress keeps the caller's original Messages fields (for Anthropic
/// targets) and what they require. Set only by Shield: a caller's own is removed on parse.
pub const ANTHROPIC_KEY: &str = "x_anthropic";

/// Fields only Shield reads; never sent upstream (ROUTING.md "body hygiene").
const SHIELD_ONLY: [&str; 5] = ["x_shield", "prompt", "system", "run_id", ANTHROPIC_KEY];

/// Why a request body is refused (answered 400 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// A chat request: a JSON object with a string `model`.
#[derive(Clone)]
pub struct ChatRequest {
    pub fields: Map<String, Value>,
    pub model: String,
}

impl ChatRequest {
    pub fn parse(body: &[u8]) -> Result<ChatRequest, BadRequest> {
        let value: Value = serde_json::from_slice(body).map_err(|e| BadRequest(format!("malformed JSON body: {e}")))?;
        let Value::Object(mut fields) = value else {
            return Err(BadRequest("the body must be a JSON object".into()));
        };
        fields.remove(ANTHROPIC_KEY);
        let model = match fields.get("model") {
            Some(Value::String(model)) if !model.is_empty() => model.clone(),
            Some(_) => {
                return Err(BadRequest("`model` must be a non-empty string".into()));
            }
            None => {
                return Err(BadRequest("missing required field `model`".into()));
            }
        };
        Ok(ChatRequest { fields, model })
    }

    /// The caller's original Anthropic Messages fields, when the request came in that shape.
    pub fn anthropic_original(&self) -> Option<&Map<String, Value>> {
        self.fields.get(ANTHROPIC_KEY)?.get("original")?.as_object()
    }

    /// The allowed `anthropic-beta` flags the caller sent (Anthropic ingress).
    pub fn anthropic_beta(&self) -> Option<&str> {
        self.fields.get(ANTHROPIC_KEY)?.get("beta")?.as_str()
    }

    /// Whether only an Anthropic target can honour the request (it carries `thinking`,
    /// documents or server tools).
    pub fn requires_anthropic(&self) -> bool {
        self.fields.get(ANTHROPIC_KEY).and_then(|n| n.get("requires")).and_then(Value::as_bool).unwrap_or(false)
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
    pub fn upstream_body(&self, model: &str, extra: Option<&Map<String, Value>>, ask_usage: bool) -> Vec<u8> {
        let stream_options = ask_usage.then(|| {
            let mut options = self.fields.get("stream_options").and_then(Value::as_object).cloned().unwrap_or_default();
            options.insert("include_usage".into(), Value::Bool(true));
            Value::Object(options)
        });
        let body = UpstreamBody { fields: &self.fields, model, extra, stream_options: stream_options.as_ref() };
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
        if let Some(extra) = self.fields.get(ANTHROPIC_KEY).and_then(|n| n.get("guard_text")).and_then(Value::as_str) {
            text.push_str(extra);
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
}

impl Serialize for UpstreamBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let overridden = |key: &str| {
            key == "model"
                || SHIELD_ONLY.contains(&key)
                || (key == "stream_options" && self.stream_options.is_some())
                || self.extra.is_some_and(|e| e.contains_key(key))
        };
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in self.fields.iter().filter(|(k, _)| !overridden(k)) {
            map.serialize_entry(key, value)?;
        }
        map.serialize_entry("model", self.model)?;
        if let Some(options) = self.stream_options {
            map.serialize_entry("stream_options", options)?;
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
        let body: Value = serde_json::from_slice(&request.upstream_body("gpt-4o", extra.as_ref(), false)).unwrap();
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
        let body: Value = serde_json::from_slice(&request.upstream_body("t", None, true)).unwrap();
        assert_eq!(body["stream_options"], json!({"x": 1, "include_usage": true}));
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
