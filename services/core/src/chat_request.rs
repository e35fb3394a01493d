//! A caller's chat request, parsed once: the typed request every part of the pipeline reads
//! ([`exchange::Request`]) and the caller's body as sent ([`Origin`]), which an adapter of the
//! caller's own shape sends on (re-serialised for each target without copying: the target's
//! `model` and `extra_body` are written on the fly). This module is also the OpenAI Chat
//! Completions shape's parse (the `/v1/chat/completions` and Shield-native endpoints); the
//! Anthropic Messages shape's is the proxy's `messages::request`. Pure: the proxy reads the
//! body under its size limit and hands the bytes here; the fuzz target `request_body` drives
//! it.

use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

pub use crate::verbatim::Verbatim;
pub use direct::Shape;

mod direct;

use crate::exchange::{self, Effort, Image, Message, Part, Reasoning, Role, Schema, Tool, ToolChoice};
use crate::spliced::Spliced;

/// OpenAI's own limit on `messages`; a longer conversation is refused before any routing.
pub const MAX_MESSAGES: usize = 2048;

/// Fields only Shield reads; never sent upstream (ROUTING.md "body hygiene").
const SHIELD_ONLY: [&str; 4] = ["x_shield", "prompt", "system", "run_id"];

/// The key serde_json uses internally for raw values: no API's field, and a body whose first
/// key it is reads back as something else in serde_json-based servers (found by the
/// `request_body` fuzz target). Never sent upstream.
pub const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// Why a request body is refused (answered 400 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// A chat request.
#[derive(Clone)]
pub struct ChatRequest {
    /// The route (or the default upstream's model) the caller named.
    pub model: String,
    /// The request, typed.
    pub exchange: Arc<exchange::Request>,
    /// The caller's body as sent, by its shape.
    pub origin: Origin,
}

/// The caller's body as sent.
#[derive(Clone)]
pub enum Origin {
    /// OpenAI's Chat Completions: the body's fields.
    OpenAi(Arc<OpenAiBody>),
    /// Anthropic's Messages.
    Anthropic(Arc<AnthropicOrigin>),
    /// OpenAI's Responses: no provider speaks it yet, every target gets the typed request.
    Responses(Arc<Map<String, Value>>),
}

/// A Chat Completions body as the caller sent it.
#[derive(Debug, Clone)]
pub struct OpenAiBody {
    /// The top-level fields; while `verbatim` holds the body's text, all but `messages` and
    /// `tools`, which only the typed request and the text hold.
    fields: Map<String, Value>,
    /// A large body's top-level fields as the JSON text they were sent as, while unchanged: the
    /// same-shape upstream body is written from these without serialising parsed values again
    /// (issue 33: re-escaping every string of a 150 KB agent history was 42 % of the
    /// request's instructions), and `messages` and `tools` are never parsed into values
    /// ([`direct`]). Dropped by [`OpenAiBody::fields_mut`].
    verbatim: Option<Verbatim>,
    /// What `messages` was, as sent.
    shape: Shape,
}

impl OpenAiBody {
    /// The top-level fields but `messages` and `tools` (read those from the typed request).
    pub fn fields(&self) -> &Map<String, Value> {
        &self.fields
    }

    /// Every top-level field, to change: what was sent no longer stands for them.
    pub fn fields_mut(&mut self) -> &mut Map<String, Value> {
        if let Some(verbatim) = self.verbatim.take() {
            for key in direct::TYPED_ONLY {
                if let Some(value) = verbatim.value(key) {
                    self.fields.insert(key.to_string(), value);
                }
            }
        }
        &mut self.fields
    }
}

/// A request that arrived in Anthropic's Messages shape (`POST /v1/messages`): the caller's
/// body as sent, which an Anthropic target gets back (its `model` set) so that nothing the
/// caller asked for is lost on the same-shape path, and what other flavors cannot take.
#[derive(Debug, Clone, Default)]
pub struct AnthropicOrigin {
    /// The Messages body as the caller sent it; a large body read directly (the proxy's
    /// `messages::direct`) holds all but [`AnthropicOrigin::TYPED_ONLY`] here, which the typed
    /// request and `verbatim` hold. [`AnthropicOrigin::full`] reads every field,
    /// [`AnthropicOrigin::original_mut`] changes them.
    pub original: Map<String, Value>,
    /// `anthropic-beta` as the caller sent it (forwarded verbatim to Anthropic targets, less
    /// the flags a target strips).
    pub beta: Option<String>,
    /// `anthropic-version` as the caller sent it.
    pub version: Option<String>,
    /// What only an Anthropic target can serve, each named by its field (e.g.
    /// `messages.0.content.1 (document)`); empty when any flavor can serve the request.
    pub requires: Vec<String>,
    /// Fields that shape the answer but that other flavors have no place for (e.g.
    /// `context_management`, `top_k`, a server tool): dropped for them, and named to the
    /// caller.
    pub unmapped: Vec<String>,
    /// Whether `messages` holds `role: "system"` messages (Claude Code's reminders).
    pub system_messages: bool,
    /// Each top-level field's JSON text as sent, while `original` is unchanged (see
    /// [`OpenAiBody`]); whoever changes `original` sets this to `None`.
    pub verbatim: Option<Verbatim>,
}

impl AnthropicOrigin {
    /// The fields a directly read Messages body keeps only typed and as sent (issue 33: a
    /// 150 KB agent history never becomes a tree).
    pub const TYPED_ONLY: [&'static str; 3] = ["messages", "system", "tools"];

    /// Every field of the body as sent: `original`, with what only its text holds parsed back.
    pub fn full(&self) -> std::borrow::Cow<'_, Map<String, Value>> {
        let missing = |key: &&str| !self.original.contains_key(*key);
        let Some(verbatim) = self.verbatim.as_ref().filter(|_| Self::TYPED_ONLY.iter().any(missing)) else {
            return std::borrow::Cow::Borrowed(&self.original);
        };
        let mut full = self.original.clone();
        Self::restore(&mut full, verbatim);
        std::borrow::Cow::Owned(full)
    }

    /// Every field, to change: what was sent no longer stands for them.
    pub fn original_mut(&mut self) -> &mut Map<String, Value> {
        if let Some(verbatim) = self.verbatim.take() {
            Self::restore(&mut self.original, &verbatim);
        }
        &mut self.original
    }

    /// The typed-only fields `fields` lacks, parsed from the text.
    fn restore(fields: &mut Map<String, Value>, verbatim: &Verbatim) {
        for key in Self::TYPED_ONLY {
            if !fields.contains_key(key)
                && let Some(value) = verbatim.value(key)
            {
                fields.insert(key.to_string(), value);
            }
        }
    }
}

impl ChatRequest {
    /// [`Self::parse_shared`] of a body not already in shared memory (tests, fuzzing): copied
    /// once.
    pub fn parse(body: &[u8]) -> Result<ChatRequest, BadRequest> {
        Self::parse_shared(&bytes::Bytes::copy_from_slice(body))
    }

    /// A Chat Completions body: a JSON object with a string `model`. What the pipeline reads
    /// is typed from it leniently; [`Self::check_routable`] checks what a routed call needs.
    ///
    /// A large body whose top-level keys are plain and distinct is read directly (its history
    /// never becomes a tree, see [`direct`]); any other body is parsed into values and typed
    /// from them. The two readings agree (the property test `reads_as_the_tree_does`).
    pub fn parse_shared(body: &bytes::Bytes) -> Result<ChatRequest, BadRequest> {
        Self::parse_remembering(body, None)
    }

    /// [`Self::parse_shared`], with what the tenant's earlier requests told (its memo): a tool
    /// schema that passed the check a tree reading makes is not walked again
    /// ([`crate::json_read::CheckedSchemas`]), and a message whose bytes it sent before is not
    /// read at all until something asks for it (`direct::read_known`).
    pub fn parse_remembering(
        body: &bytes::Bytes,
        memo: Option<&crate::verdicts::Memo>,
    ) -> Result<ChatRequest, BadRequest> {
        let malformed = |e: serde_json::Error| BadRequest(format!("malformed JSON body: {e}"));
        if body.len() >= crate::verbatim::WORTH_IT {
            let known = memo.and_then(|memo| direct::read_known(body, memo));
            let read = match known {
                Some(read) => Ok(read),
                None => direct::read(body, memo.map(crate::verdicts::Memo::schemas)),
            };
            match read {
                // Relayed from its text, so its keys must be plain and distinct: a body with a key
                // written with escapes, or twice, is read as a tree.
                Ok(read) => {
                    if let Some(verbatim) = Verbatim::of_keys(body, read.keys) {
                        let model = model_of(&read.fields)?;
                        let exchange = Arc::new(typed(&read.fields, read.messages, read.tools));
                        let body = OpenAiBody { fields: read.fields, verbatim: Some(verbatim), shape: read.shape };
                        return Ok(ChatRequest { model, exchange, origin: Origin::OpenAi(Arc::new(body)) });
                    }
                }
                Err(direct::Unread::Malformed(e)) => return Err(malformed(e)),
                Err(direct::Unread::TreeOnly) => {}
            }
        }
        let value: Value = serde_json::from_slice(body).map_err(malformed)?;
        let Value::Object(fields) = value else {
            return Err(BadRequest("the body must be a JSON object".into()));
        };
        let model = model_of(&fields)?;
        let exchange = Arc::new(typed_of_openai(&fields));
        let shape = Shape::of(fields.get("messages"));
        Ok(ChatRequest {
            model,
            exchange,
            origin: Origin::OpenAi(Arc::new(OpenAiBody { fields, verbatim: None, shape })),
        })
    }

    /// The caller's Chat Completions fields, when it spoke that shape.
    pub fn openai_fields(&self) -> Option<&Map<String, Value>> {
        match &self.origin {
            Origin::OpenAi(body) => Some(body.fields()),
            Origin::Anthropic(_) | Origin::Responses(_) => None,
        }
    }

    /// What the caller sent in Anthropic's shape, when it spoke that shape.
    pub fn anthropic(&self) -> Option<&AnthropicOrigin> {
        match &self.origin {
            Origin::Anthropic(origin) => Some(origin),
            Origin::OpenAi(_) | Origin::Responses(_) => None,
        }
    }

    /// What only an Anthropic target can serve in this request (documents, search results,
    /// server-tool history), each named by its field; empty when any flavor can.
    pub fn requires_anthropic(&self) -> &[String] {
        self.anthropic().map_or(&[], |origin| origin.requires.as_slice())
    }

    /// Whether the caller asked the model to think first (its first event may come late).
    pub fn reasons(&self) -> bool {
        self.exchange.reasoning.is_some() || !self.requires_anthropic().is_empty()
    }

    pub fn stream(&self) -> bool {
        self.exchange.stream
    }

    /// Checks what a routed call needs beyond `model` (a Messages body was checked on parse).
    pub fn check_routable(&self) -> Result<(), BadRequest> {
        let Origin::OpenAi(body) = &self.origin else { return Ok(()) };
        match body.shape {
            Shape::Array(entries) if entries > MAX_MESSAGES => {
                Err(BadRequest(format!("`messages` has {entries} entries; at most {MAX_MESSAGES} are accepted")))
            }
            Shape::Array(entries) if entries > 0 => Ok(()),
            Shape::Array(_) | Shape::Other => Err(BadRequest("`messages` must be a non-empty array".into())),
            Shape::Absent => Err(BadRequest("missing required field `messages`".into())),
        }
    }

    /// `max_completion_tokens` or `max_tokens`, when the request sets one.
    pub fn max_output_tokens(&self) -> Option<u64> {
        self.exchange.max_tokens
    }

    /// Whether the client itself asked for the final usage chunk (Chat Completions only).
    pub fn wants_usage(&self) -> bool {
        let options = self.openai_fields().and_then(|f| f.get("stream_options"));
        options.and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false)
    }

    /// The prompt's text, for the input guardrails.
    pub fn prompt_text(&self) -> String {
        self.exchange.text()
    }

    /// Characters of the prompt's text: the basis of token estimates at 4 characters a token.
    pub fn prompt_chars(&self) -> usize {
        self.exchange.prompt_chars()
    }

    /// Whether the request offers the model tools.
    pub fn uses_tools(&self) -> bool {
        !self.exchange.tools.is_empty()
    }

    /// The Chat Completions body for one target, from a caller who spoke that shape: its
    /// fields minus Shield-only ones, `model` set to the target's, `added` (fields the
    /// target's adapter sets, e.g. `reasoning_effort`) over the caller's, `extra_body` over the
    /// rest. With `ask_usage`, `stream_options.include_usage` is set (the client's other
    /// stream options kept). `None` for a caller of another shape.
    pub fn upstream_body(
        &self,
        model: &str,
        extra: Option<&Map<String, Value>>,
        ask_usage: bool,
        added: &[(&str, Value)],
    ) -> Option<Spliced> {
        let Origin::OpenAi(sent) = &self.origin else { return None };
        let fields = sent.fields();
        let stream_options = ask_usage.then(|| {
            let mut options = fields.get("stream_options").and_then(Value::as_object).cloned().unwrap_or_default();
            options.insert("include_usage".into(), Value::Bool(true));
            Value::Object(options)
        });
        if let Some(verbatim) = &sent.verbatim {
            // Written in the order the parsed path gives precedence: the adapter's fields, then
            // `extra_body` over them (the last write of a key wins).
            let model = Value::String(model.to_string());
            let mut set: Vec<(&str, &Value)> = vec![("model", &model)];
            set.extend(stream_options.as_ref().map(|options| ("stream_options", options)));
            set.extend(added.iter().map(|(key, value)| (*key, value)));
            set.extend(extra.into_iter().flatten().map(|(key, value)| (key.as_str(), value)));
            return Some(verbatim.relay(|key| key == RAW_VALUE_TOKEN || SHIELD_ONLY.contains(&key), &set));
        }
        let body = UpstreamBody { fields, model, extra, stream_options: stream_options.as_ref(), added };
        Some(serde_json::to_vec(&body).unwrap_or_default().into())
    }
}

/// `model`: a non-empty string.
fn model_of(fields: &Map<String, Value>) -> Result<String, BadRequest> {
    match fields.get("model") {
        Some(Value::String(model)) if !model.is_empty() => Ok(model.clone()),
        Some(_) => Err(BadRequest("`model` must be a non-empty string".into())),
        None => Err(BadRequest("missing required field `model`".into())),
    }
}

/// A Chat Completions body, typed. Lenient: what it cannot read is left out (the body as sent
/// still goes to OpenAI-flavour targets); system and developer messages stay where they stand.
fn typed_of_openai(fields: &Map<String, Value>) -> exchange::Request {
    let text = |v: &Value| v.as_str().map(str::to_string);
    let messages = fields.get("messages").and_then(Value::as_array);
    let mut typed_messages: Vec<Message> = Vec::with_capacity(messages.map_or(0, Vec::len));
    for message in messages.into_iter().flatten() {
        let content = message.get("content");
        match message.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => {
                typed_messages.push(Message { role: Role::System, content: parts_of(content) });
            }
            Some("assistant") => {
                let mut parts = parts_of(content);
                for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                    let function = call.get("function");
                    parts.push(Part::ToolUse {
                        id: call.get("id").and_then(text).unwrap_or_default(),
                        name: function.and_then(|f| f.get("name")).and_then(text).unwrap_or_default(),
                        input: function.and_then(|f| f.get("arguments")).and_then(text).unwrap_or_else(|| "{}".into()),
                    });
                }
                typed_messages.push(Message { role: Role::Assistant, content: parts });
            }
            Some("tool") => {
                let content = tool_result_text(parts_of(content));
                let id = message.get("tool_call_id").and_then(text).unwrap_or_default();
                typed_messages.push(Message {
                    role: Role::User,
                    content: vec![Part::ToolResult { id, content, is_error: false }],
                });
            }
            _ => typed_messages.push(Message { role: Role::User, content: parts_of(content) }),
        }
    }
    let tools = fields.get("tools").and_then(Value::as_array).into_iter().flatten();
    let tools = tools
        .filter_map(|tool| {
            let function = tool.get("function")?;
            Some(Tool {
                name: function.get("name").and_then(text)?,
                description: function.get("description").and_then(text).unwrap_or_default().into(),
                schema: Schema::of_value(function.get("parameters").unwrap_or(&empty_schema())),
            })
        })
        .collect::<Vec<Tool>>();
    typed(fields, typed_messages.into(), tools.into())
}

/// A tool's schema when it gives none.
fn empty_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// A `tool` message's result: its text parts, one per line ([`exchange::lines`]); one part's
/// text as it was read (as sent, [`exchange::Text`]).
fn tool_result_text(content: Vec<Part>) -> exchange::Text {
    let mut texts = content.into_iter().filter_map(|p| if let Part::Text(t) = p { Some(t) } else { None });
    match (texts.next(), texts.next()) {
        (None, _) => exchange::Text::default(),
        (Some(one), None) => one,
        (Some(first), Some(second)) => {
            exchange::lines([first, second].into_iter().chain(texts).map(exchange::Text::into_string)).into()
        }
    }
}

/// The typed request: `messages` and `tools` as read, the rest from `fields`.
fn typed(fields: &Map<String, Value>, messages: exchange::History, tools: exchange::ToolList) -> exchange::Request {
    let text = |v: &Value| v.as_str().map(str::to_string);
    let tool_choice = match fields.get("tool_choice") {
        Some(Value::String(choice)) if choice == "auto" => Some(ToolChoice::Auto),
        Some(Value::String(choice)) if choice == "none" => Some(ToolChoice::None),
        Some(Value::String(choice)) if choice == "required" => Some(ToolChoice::Any),
        Some(choice @ Value::Object(_)) => choice.pointer("/function/name").and_then(text).map(ToolChoice::Tool),
        _ => None,
    };
    let stop = match fields.get("stop") {
        Some(Value::String(stop)) => vec![stop.clone()],
        Some(Value::Array(stops)) => stops.iter().filter_map(text).collect(),
        _ => Vec::new(),
    };
    let reasoning = match fields.get("reasoning_effort").and_then(Value::as_str) {
        Some("minimal" | "low") => Some(Effort::Low),
        Some("medium") => Some(Effort::Medium),
        Some("high" | "xhigh") => Some(Effort::High),
        _ => None,
    }
    .map(|effort| Reasoning { effort: Some(effort), fields: vec!["reasoning_effort"] });
    exchange::Request {
        system: Default::default(),
        messages,
        tools,
        tool_choice,
        parallel_tool_calls: fields.get("parallel_tool_calls").and_then(Value::as_bool),
        max_tokens: ["max_completion_tokens", "max_tokens"].iter().find_map(|k| fields.get(*k).and_then(Value::as_u64)),
        temperature: fields.get("temperature").and_then(Value::as_f64),
        top_p: fields.get("top_p").and_then(Value::as_f64),
        stop,
        reasoning,
        format: fields.get("response_format").and_then(exchange::Format::of_openai),
        stream: fields.get("stream").and_then(Value::as_bool).unwrap_or(false),
        user: fields.get("user").and_then(text),
    }
}

/// Chat Completions content (a string, or parts) as typed parts.
fn parts_of(content: Option<&Value>) -> Vec<Part> {
    match content {
        Some(Value::String(text)) => vec![Part::Text(text.as_str().into())],
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| {
                let text = part.get("text").and_then(Value::as_str).map(str::to_string);
                match part.get("type").and_then(Value::as_str) {
                    Some("text") | None => text.map(|text| Part::Text(text.into())),
                    Some("image_url") => part.pointer("/image_url/url").and_then(Value::as_str).and_then(image_of),
                    // Parts other shapes cannot carry (audio, files, a server's own kinds): their
                    // text still reaches the guardrails.
                    Some(kind) => Some(Part::Opaque { kind: kind.to_string(), text: text.unwrap_or_default() }),
                }
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// `data:image/png;base64,…` → base64 data; an http(s) URL → a URL.
pub fn image_of(url: &str) -> Option<Part> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (media_type, data) = rest.split_once(";base64,").filter(|(media_type, _)| !media_type.is_empty())?;
        return Some(Part::Image(Image::Base64 { media_type: media_type.to_string(), data: data.to_string() }));
    }
    (url.starts_with("https://") || url.starts_with("http://")).then(|| Part::Image(Image::Url(url.to_string())))
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
                || key == RAW_VALUE_TOKEN
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

    /// A tool message's text parts, one per line, whichever reading (tree for a small body, the
    /// direct one for a large one); other parts left out.
    #[test]
    fn a_tool_results_texts_are_joined_one_per_line() {
        for pad in [0, crate::verbatim::WORTH_IT] {
            let body = json!({"model": "m", "pad": "p".repeat(pad), "messages": [
                {"role": "tool", "tool_call_id": "c", "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/y.png"}},
                    {"type": "text", "text": "b"}]},
                {"role": "tool", "tool_call_id": "d", "content": "one"},
                {"role": "tool", "tool_call_id": "e", "content": []}]});
            let request = ChatRequest::parse(body.to_string().as_bytes()).unwrap();
            let results: Vec<&str> = request
                .exchange
                .messages
                .iter()
                .map(|m| match m.content.as_slice() {
                    [Part::ToolResult { content, .. }] => content.as_str(),
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(results, ["a\nb", "one", ""], "pad {pad}");
        }
    }

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
        let body: Value =
            serde_json::from_slice(&request.upstream_body("gpt-4o", extra.as_ref(), false, &[]).unwrap().to_vec())
                .unwrap();
        assert_eq!(
            body,
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2, "provider": {"order": ["openai"]}})
        );
    }

    /// The body with its verbatim text dropped: what `upstream_body` writes from parsed values.
    fn reparsed(request: &ChatRequest) -> ChatRequest {
        let mut request = request.clone();
        if let Origin::OpenAi(body) = &mut request.origin {
            Arc::make_mut(body).fields_mut();
        }
        request
    }

    #[test]
    fn unchanged_fields_are_relayed_as_sent() {
        let sent = format!(
            r#"{{"model":"m", "temperature": 1e0, "messages":[{{"role":"user","content":"line\nnext \u00e9"}}],
            "x_shield": {{"a": 1}}, "n": 12345678901234567890123, "pad": "{}"}}"#,
            "x".repeat(crate::verbatim::WORTH_IT)
        );
        let request = ChatRequest::parse(sent.as_bytes()).unwrap();
        assert!(matches!(&request.origin, Origin::OpenAi(body) if body.verbatim.is_some()));
        let body = String::from_utf8(request.upstream_body("t", None, false, &[]).unwrap().to_vec()).unwrap();
        assert!(body.contains(r#""content":"line\nnext \u00e9""#), "the text as sent: {body}");
        assert!(body.contains("1e0") && body.contains("12345678901234567890123"), "numbers as sent: {body}");
        assert!(!body.contains("x_shield") && body.contains(r#""model":"t""#), "{body}");
        let changed = reparsed(&request);
        let again = String::from_utf8(changed.upstream_body("t", None, false, &[]).unwrap().to_vec()).unwrap();
        assert!(again.contains(r#""content":"line\nnext é""#), "a changed body is written from its values: {again}");
    }

    proptest::proptest! {
        /// Whatever the body, the verbatim upstream body reads as the one written from values.
        #[test]
        fn verbatim_and_parsed_bodies_agree(
            fields in proptest::collection::btree_map("[a-z_]{1,8}", proptest::prelude::any::<(i32, String, bool)>(), 0..6),
            extra in proptest::option::of(proptest::collection::btree_map("[a-z]{1,4}", proptest::prelude::any::<i16>(), 0..3)),
            usage in proptest::prelude::any::<bool>(),
        ) {
            let pad = "p".repeat(crate::verbatim::WORTH_IT);
            let mut body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "pad": pad});
            for (key, (n, text, flag)) in &fields {
                body[key] = serde_json::json!({"n": n, "text": text, "list": [flag, text]});
            }
            let request = ChatRequest::parse(body.to_string().as_bytes()).unwrap();
            let extra: Option<Map<String, Value>> = extra.map(|e| e.into_iter().map(|(k, v)| (k, Value::from(v))).collect());
            let added = [("reasoning_effort", Value::from("low"))];
            let verbatim = request.upstream_body("t", extra.as_ref(), usage, &added).unwrap().to_vec();
            let parsed = reparsed(&request).upstream_body("t", extra.as_ref(), usage, &added).unwrap().to_vec();
            proptest::prop_assert_eq!(
                serde_json::from_slice::<Value>(&verbatim).unwrap(),
                serde_json::from_slice::<Value>(&parsed).unwrap()
            );
        }
    }

    #[test]
    fn streams_ask_for_usage_keeping_the_clients_options() {
        let request =
            ChatRequest::parse(br#"{"model": "m", "stream": true, "stream_options": {"x": 1}, "messages": []}"#)
                .unwrap();
        assert!(!request.wants_usage());
        let body: Value = serde_json::from_slice(
            &request.upstream_body("t", None, true, &[("reasoning_effort", json!("low"))]).unwrap().to_vec(),
        )
        .unwrap();
        assert_eq!(body["stream_options"], json!({"x": 1, "include_usage": true}));
        assert_eq!(body["reasoning_effort"], "low", "an adapter's own field is written");
    }

    #[test]
    fn a_chat_completions_body_is_typed_with_its_system_messages_in_place() {
        let request = ChatRequest::parse(
            json!({"model": "m", "max_completion_tokens": 9, "stop": "END", "reasoning_effort": "minimal", "messages": [
                {"role": "user", "content": "hi"},
                {"role": "developer", "content": "be brief"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
                {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}]},
            ], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": "required"})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let typed = &request.exchange;
        let roles: Vec<Role> = typed.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::System, Role::Assistant, Role::User, Role::User]);
        assert_eq!(
            typed.messages[2].content,
            [Part::ToolUse { id: "c1".into(), name: "f".into(), input: "{}".into() }]
        );
        assert_eq!(
            typed.messages[3].content,
            [Part::ToolResult { id: "c1".into(), content: "42".into(), is_error: false }]
        );
        assert_eq!(
            typed.messages[4].content[1],
            Part::Image(Image::Base64 { media_type: "image/png".into(), data: "iVBOR".into() })
        );
        assert_eq!((typed.max_tokens, typed.stop.clone()), (Some(9), vec!["END".to_string()]));
        assert_eq!(typed.tool_choice, Some(ToolChoice::Any));
        assert_eq!(typed.reasoning.as_ref().and_then(|r| r.effort), Some(Effort::Low));
        assert_eq!(request.prompt_text(), "hi\nbe brief\n\n42\nsee\n");
        assert_eq!(request.prompt_chars(), "hibe brief42see".len());
    }

    #[test]
    fn every_parts_text_reaches_the_guardrails() {
        let request = ChatRequest::parse(
            br#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "input_text", "text": "AKIAABCDEFGHIJKLMNOP"}, {"text": "untyped"}]}]}"#,
        )
        .unwrap();
        assert!(request.prompt_text().contains("AKIAABCDEFGHIJKLMNOP") && request.prompt_text().contains("untyped"));
    }

    /// Found by the `request_body` fuzz target: serde_json's raw-value key first in the body
    /// made the upstream body read back as something else.
    #[test]
    fn serde_jsons_raw_value_key_never_goes_upstream() {
        let request =
            ChatRequest::parse(br#"{"model":"smart","ms":[{"":"h1i"}],"$serde_json::private::RawValue":0}"#).unwrap();
        let upstream = request.upstream_body("target-model", None, false, &[]).unwrap().to_vec();
        let value: Value = serde_json::from_slice(&upstream).unwrap();
        assert_eq!(value, json!({"model": "target-model", "ms": [{"": "h1i"}]}));
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
