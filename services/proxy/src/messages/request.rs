//! An Anthropic Messages request, typed ([`exchange::Request`]), with what only Anthropic's
//! shape has kept beside it ([`AnthropicOrigin`]): the caller's body as sent (an Anthropic
//! target gets it back, so thinking, documents, `cache_control` and server tools are never
//! lost), its `anthropic-beta` and `anthropic-version`, and what other flavors cannot take.
//!
//! The rules for other flavors (README "Callers in Anthropic's shape"):
//! * `role: "system"` messages inside `messages` stay where they stand (a typed system
//!   message; OpenAI's shape takes them anywhere).
//! * `thinking` and `output_config.effort` become the typed reasoning effort: the target's
//!   reasoning control when its capabilities say it has one (`reasoning_effort`), else they
//!   are dropped and named.
//! * `output_config.format` (a JSON schema) becomes the typed structured-output format:
//!   `response_format` for an OpenAI-flavour target.
//! * `context_management`, `top_k`, server tools and MCP servers are dropped and named (`X-Shield-Dropped-Fields`); hints (`cache_control`, `service_tier`)
//!   are simply absent.
//! * Content only Anthropic can read (documents, search results, server-tool history, images
//!   by file id) makes the request need an Anthropic target; a route with none answers 400.

use std::sync::Arc;

use serde_json::{Map, Value};
use shield_core::chat_request::{AnthropicOrigin, BadRequest, ChatRequest, MAX_MESSAGES, Origin};
use shield_core::exchange::{
    self, Effort, History, Image, Message, Part, Reasoning, Role, Schema, SystemPrompt, Tool, ToolChoice, ToolList,
};
use shield_core::verbatim::Verbatim;
use shield_core::verdicts::Memo;

/// The caller's Anthropic headers, forwarded as sent to Anthropic targets.
#[derive(Default)]
pub struct Headers {
    pub beta: Option<String>,
    pub version: Option<String>,
}

impl Headers {
    pub fn of(headers: &http::header::HeaderMap) -> Headers {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        Headers { beta: text("anthropic-beta").filter(|b| !b.trim().is_empty()), version: text("anthropic-version") }
    }
}

fn bad(message: impl Into<String>) -> BadRequest {
    BadRequest(message.into())
}

/// What the parse found that other flavors lack.
#[derive(Default)]
struct Found {
    requires: Vec<String>,
    unmapped: Vec<String>,
}

/// Checks a Messages body the way Anthropic's API does and types it. `count_only` is the
/// token-counting endpoint's body, which has no `max_tokens`.
///
/// A large body whose top-level keys are plain and distinct is read directly (its history never
/// becomes a tree, see [`super::direct`]) when it is well formed and holds nothing only a tree
/// reading types; any other body is parsed into values and typed from them, and every error is
/// that reading's.
pub fn normalise(body: &bytes::Bytes, headers: Headers, count_only: bool) -> Result<ChatRequest, BadRequest> {
    normalise_remembering(body, headers, count_only, None)
}

/// [`normalise`], with the tool schemas the tenant sent before and that passed the check a tree
/// reading makes: a resent schema is not walked again (`CheckedSchemas`).
pub fn normalise_remembering(
    body: &bytes::Bytes,
    headers: Headers,
    count_only: bool,
    memo: Option<&Memo>,
) -> Result<ChatRequest, BadRequest> {
    let direct = (body.len() >= shield_core::verbatim::WORTH_IT).then(|| Sent::read(body, count_only, memo)).flatten();
    let (sent, verbatim) = match direct {
        Some((sent, verbatim)) => (sent, Some(verbatim)),
        None => {
            let sent = Sent::parse(body, count_only)?;
            let verbatim = Verbatim::of_large(body, &sent.original);
            (sent, verbatim)
        }
    };
    sent.typed(verbatim, headers)
}

/// [`normalise`] read as a tree whatever its size: what the direct reading is held to.
#[cfg(test)]
pub(super) fn normalise_as_a_tree(
    body: &bytes::Bytes,
    headers: Headers,
    count_only: bool,
) -> Result<ChatRequest, BadRequest> {
    let sent = Sent::parse(body, count_only)?;
    let verbatim = Verbatim::of_large(body, &sent.original);
    sent.typed(verbatim, headers)
}

/// A Messages body, its history typed.
struct Sent {
    /// Every field as sent; read directly, all but [`AnthropicOrigin::TYPED_ONLY`].
    original: Map<String, Value>,
    model: String,
    system: SystemPrompt,
    messages: History,
    system_messages: bool,
    tools: ToolList,
    found: Found,
}

/// `model` and `max_tokens`, checked.
fn model_of(original: &Map<String, Value>, count_only: bool) -> Result<String, BadRequest> {
    let model = match original.get("model") {
        Some(Value::String(model)) if !model.is_empty() => model.clone(),
        Some(_) => return Err(bad("model: must be a non-empty string")),
        None => return Err(bad("model: Field required")),
    };
    let max_tokens = original.get("max_tokens");
    if !count_only && max_tokens.and_then(Value::as_u64).is_none_or(|n| n < 1) {
        return Err(bad("max_tokens: Field required (a positive integer)"));
    }
    Ok(model)
}

impl Sent {
    /// Read directly ([`super::direct`]), with its fields' text for the relay; `None`: read it
    /// as a tree (so too a body whose keys are written with escapes, or twice).
    fn read(body: &bytes::Bytes, count_only: bool, memo: Option<&Memo>) -> Option<(Sent, Verbatim)> {
        let known = memo.and_then(|memo| super::direct::read_known(body, memo));
        let read = known.or_else(|| super::direct::read(body, memo.map(Memo::schemas)))?;
        let model = model_of(&read.fields, count_only).ok()?;
        let verbatim = Verbatim::of_keys(body, read.keys)?;
        let sent = Sent {
            original: read.fields,
            model,
            system: read.system,
            messages: read.messages,
            system_messages: read.system_messages,
            tools: read.tools,
            found: Found { requires: Vec::new(), unmapped: read.server_tools },
        };
        Some((sent, verbatim))
    }

    /// Parsed into values, and typed from them.
    fn parse(body: &[u8], count_only: bool) -> Result<Sent, BadRequest> {
        let value: Value = serde_json::from_slice(body).map_err(|e| bad(format!("malformed JSON body: {e}")))?;
        let Value::Object(original) = value else { return Err(bad("the body must be a JSON object")) };
        let model = model_of(&original, count_only)?;
        let messages = match original.get("messages") {
            Some(Value::Array(messages)) if messages.is_empty() => {
                return Err(bad("messages: at least one message is required"));
            }
            Some(Value::Array(messages)) if messages.len() > MAX_MESSAGES => {
                return Err(bad(format!("messages: at most {MAX_MESSAGES} messages are accepted")));
            }
            Some(Value::Array(messages)) => messages,
            _ => return Err(bad("messages: Field required (an array of messages)")),
        };
        let mut found = Found::default();
        let system = match original.get("system") {
            None | Some(Value::Null) => Vec::new(),
            Some(system) => {
                texts_of(system).ok_or_else(|| bad("system: must be a string or an array of text blocks"))?
            }
        };
        let system =
            system.into_iter().filter(|part| !part.is_empty()).map(exchange::Text::from).collect::<Vec<_>>().into();
        let mut typed = Vec::with_capacity(messages.len());
        let mut system_messages = false;
        for (i, message) in messages.iter().enumerate() {
            let content = message.get("content").ok_or_else(|| bad(format!("messages.{i}.content: Field required")))?;
            let blocks = blocks_of(content)
                .ok_or_else(|| bad(format!("messages.{i}.content: must be a string or an array of content blocks")))?;
            let role = match message.get("role").and_then(Value::as_str) {
                Some("user") => Role::User,
                Some("assistant") => Role::Assistant,
                // Mid-conversation system messages (Claude Code's reminders): kept where they stand.
                Some("system") => {
                    let texts = texts_of(content)
                        .ok_or_else(|| bad(format!("messages.{i}.content: must be a string or text blocks")))?;
                    system_messages = true;
                    typed.push(Message {
                        role: Role::System,
                        content: texts.into_iter().map(|text| Part::Text(text.into())).collect(),
                    });
                    continue;
                }
                _ => return Err(bad(format!("messages.{i}.role: must be \"user\", \"assistant\" or \"system\""))),
            };
            let content = blocks.iter().enumerate().filter_map(|(j, block)| part_of(i, j, block, &mut found)).collect();
            typed.push(Message { role, content });
        }
        let mut tools = Vec::new();
        for tool in original.get("tools").and_then(Value::as_array).into_iter().flatten() {
            match tool.get("type").and_then(Value::as_str) {
                None | Some("custom") => tools.push(Tool {
                    name: string(tool, "name"),
                    description: string(tool, "description").into(),
                    schema: Schema::of_value(
                        tool.get("input_schema").unwrap_or(&serde_json::json!({"type": "object"})),
                    ),
                }),
                // Server tools (web search, code execution, …) run at Anthropic: other flavors
                // answer without them.
                Some(kind) => found.unmapped.push(format!("tools ({kind})")),
            }
        }
        Ok(Sent { original, model, system, messages: typed.into(), system_messages, tools: tools.into(), found })
    }

    /// The rest of the body typed beside the history, and the request.
    fn typed(self, verbatim: Option<Verbatim>, headers: Headers) -> Result<ChatRequest, BadRequest> {
        let Sent { original, model, system, messages: typed, system_messages, tools, mut found } = self;
        let (tool_choice, parallel_tool_calls) = match original.get("tool_choice") {
            None | Some(Value::Null) => (None, None),
            Some(choice) => {
                let typed = match choice.get("type").and_then(Value::as_str) {
                    Some("auto") => ToolChoice::Auto,
                    Some("any") => ToolChoice::Any,
                    Some("none") => ToolChoice::None,
                    Some("tool") => ToolChoice::Tool(string(choice, "name")),
                    _ => return Err(bad("tool_choice.type: must be auto, any, tool or none")),
                };
                let serial = choice.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true);
                (Some(typed), serial.then_some(false))
            }
        };
        if original.get("mcp_servers").is_some_and(|m| m.as_array().is_some_and(|m| !m.is_empty())) {
            found.unmapped.push("mcp_servers".into());
        }
        for key in ["context_management", "top_k"] {
            if original.get(key).is_some_and(|v| !v.is_null()) {
                found.unmapped.push(key.into());
            }
        }
        // `output_config.format`: `{type: "json_schema", schema}`, the one kind Anthropic has.
        let format = original.get("output_config").and_then(|c| c.get("format")).filter(|f| !f.is_null()).map(|f| {
            exchange::Format::JsonSchema {
                name: "output".into(),
                schema: f.get("schema").cloned().unwrap_or_else(|| serde_json::json!({"type": "object"})),
                // Not `strict`: OpenAI's strict mode wants every property required, which a schema
                // valid for Anthropic need not say.
                strict: None,
            }
        });
        let exchange = exchange::Request {
            system,
            messages: typed,
            tools,
            tool_choice,
            parallel_tool_calls,
            max_tokens: original.get("max_tokens").and_then(Value::as_u64),
            temperature: original.get("temperature").and_then(Value::as_f64),
            top_p: original.get("top_p").and_then(Value::as_f64),
            stop: original
                .get("stop_sequences")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect(),
            reasoning: reasoning(&original)?,
            format,
            stream: original.get("stream").and_then(Value::as_bool) == Some(true),
            user: original.get("metadata").and_then(|m| m.get("user_id")).and_then(Value::as_str).map(str::to_string),
        };
        let origin = AnthropicOrigin {
            verbatim,
            original,
            beta: headers.beta,
            version: headers.version,
            requires: found.requires,
            unmapped: found.unmapped,
            system_messages,
        };
        Ok(ChatRequest { model, exchange: Arc::new(exchange), origin: Origin::Anthropic(Arc::new(origin)) })
    }
}

fn string(value: &Value, key: &str) -> String {
    value.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// One content block, typed. Blocks only Anthropic reads are opaque parts (their text kept for
/// the guardrails) and make the request need an Anthropic target.
fn part_of(turn: usize, index: usize, block: &Value, found: &mut Found) -> Option<Part> {
    let kind = block.get("type").and_then(Value::as_str)?;
    let part = match kind {
        "text" => Part::Text(string(block, "text").into()),
        "image" => match image_of(block.get("source").unwrap_or(&Value::Null)) {
            Some(image) => Part::Image(image),
            None => return Some(opaque(turn, index, "image by file id or without a media type", block, found)),
        },
        "tool_use" => Part::ToolUse {
            id: string(block, "id"),
            name: string(block, "name"),
            input: block.get("input").map_or_else(|| "{}".to_string(), Value::to_string),
        },
        "tool_result" => Part::ToolResult {
            id: string(block, "tool_use_id"),
            content: block.get("content").and_then(texts_of).unwrap_or_default().join("\n").into(),
            is_error: block.get("is_error").and_then(Value::as_bool).unwrap_or(false),
        },
        "thinking" => Part::Thinking { thinking: string(block, "thinking"), signature: string(block, "signature") },
        "redacted_thinking" => Part::RedactedThinking(string(block, "data")),
        // Documents (PDFs, citations), search results, server-tool history: only there.
        kind => return Some(opaque(turn, index, kind, block, found)),
    };
    Some(part)
}

fn opaque(turn: usize, index: usize, kind: &str, block: &Value, found: &mut Found) -> Part {
    found.requires.push(format!("messages.{turn}.content.{index} ({kind})"));
    let mut text = String::new();
    collect_text(block, &mut text);
    Part::Opaque { kind: kind.to_string(), text }
}

/// `thinking` and `output_config.effort` as the effort every reasoning control shares.
fn reasoning(original: &Map<String, Value>) -> Result<Option<Reasoning>, BadRequest> {
    let mut fields = Vec::new();
    let mut effort = None;
    if let Some(thinking) = original.get("thinking").filter(|t| !t.is_null()) {
        match thinking.get("type").and_then(Value::as_str) {
            Some("enabled") => {
                let budget = thinking.get("budget_tokens").and_then(Value::as_u64).ok_or_else(|| {
                    bad("thinking.budget_tokens: Field required (a positive integer) when thinking is enabled")
                })?;
                effort = Some(Effort::of_budget(budget));
                fields.push("thinking");
            }
            Some("adaptive") => fields.push("thinking"),
            Some("disabled") => {}
            _ => return Err(bad("thinking.type: must be enabled, adaptive or disabled")),
        }
    }
    if let Some(level) = original.get("output_config").and_then(|c| c.get("effort")).filter(|e| !e.is_null()) {
        effort = Some(match level.as_str() {
            Some("low") => Effort::Low,
            Some("medium") => Effort::Medium,
            Some("high" | "xhigh" | "max") => Effort::High,
            _ => return Err(bad("output_config.effort: must be low, medium, high, xhigh or max")),
        });
        fields.push("output_config.effort");
    }
    Ok((!fields.is_empty()).then_some(Reasoning { effort, fields }))
}

/// Every text a block carries, however nested: `text`, `thinking`, string `content`, and the
/// `data` of a plain-text source.
fn collect_text(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let plain = map.get("media_type").and_then(Value::as_str).is_some_and(|m| m.starts_with("text/"));
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("text" | "thinking" | "content" | "title" | "context", Value::String(text)) => {
                        out.push_str(text);
                        out.push('\n');
                    }
                    ("data", Value::String(text)) if plain => {
                        out.push_str(text);
                        out.push('\n');
                    }
                    (_, nested @ (Value::Object(_) | Value::Array(_))) => collect_text(nested, out),
                    _ => {}
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_text(item, out)),
        _ => {}
    }
}

/// A string, or the texts of text blocks.
fn texts_of(value: &Value) -> Option<Vec<String>> {
    match value {
        Value::String(text) => Some(vec![text.clone()]),
        Value::Array(blocks) => {
            Some(blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).map(str::to_string).collect())
        }
        _ => None,
    }
}

/// Content as blocks (a string is one text block).
fn blocks_of(content: &Value) -> Option<Vec<Value>> {
    match content {
        Value::String(text) => Some(vec![serde_json::json!({"type": "text", "text": text})]),
        Value::Array(blocks) if blocks.iter().all(|b| b.get("type").and_then(Value::as_str).is_some()) => {
            Some(blocks.clone())
        }
        _ => None,
    }
}

/// An image source, typed (`None` for a file id, which only Anthropic resolves).
pub(super) fn image_of(source: &Value) -> Option<Image> {
    match source.get("type").and_then(Value::as_str)? {
        "base64" => {
            let media_type = source.get("media_type").and_then(Value::as_str).filter(|m| !m.is_empty())?;
            Some(Image::Base64 { media_type: media_type.to_string(), data: string(source, "data") })
        }
        "url" => source.get("url").and_then(Value::as_str).map(|url| Image::Url(url.to_string())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn normalised(body: Value) -> ChatRequest {
        normalise(&body.to_string().into(), Headers::default(), false).unwrap()
    }

    #[test]
    fn a_messages_request_becomes_a_chat_request() {
        let request = normalised(
            json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5, "metadata": {"user_id": "u1"},
            "tools": [{"name": "search", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "find x"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "Looking."}, {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "x"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]},
                    {"type": "text", "text": "and y?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}]},
            ]}),
        );
        let typed = &request.exchange;
        assert_eq!(request.model, "claude-sonnet-4-5");
        assert_eq!(*typed.system, ["Be brief."]);
        assert_eq!(typed.messages[0], Message { role: Role::User, content: vec![Part::Text("find x".into())] });
        assert_eq!(
            typed.messages[1].content,
            [
                Part::Thinking { thinking: "hm".into(), signature: "s".into() },
                Part::Text("Looking.".into()),
                Part::ToolUse { id: "toolu_1".into(), name: "search".into(), input: "{\"q\":\"x\"}".into() }
            ]
        );
        assert_eq!(
            typed.messages[2].content,
            [
                Part::ToolResult { id: "toolu_1".into(), content: "42".into(), is_error: false },
                Part::Text("and y?".into()),
                Part::Image(Image::Base64 { media_type: "image/png".into(), data: "iVBOR".into() })
            ]
        );
        assert_eq!(
            (typed.max_tokens, typed.stop.clone(), typed.user.clone()),
            (Some(100), vec!["END".to_string()], Some("u1".to_string()))
        );
        assert_eq!(typed.tools[0].schema.value(), json!({"type": "object"}));
        assert_eq!((typed.tool_choice.clone(), typed.parallel_tool_calls), (Some(ToolChoice::Any), Some(false)));
        let origin = request.anthropic().unwrap();
        assert!(origin.requires.is_empty());
        assert_eq!(origin.original["top_k"], 5, "an Anthropic target gets the original back");
        assert_eq!(origin.unmapped, ["top_k"], "and another flavor's caller is told it was dropped");
    }

    fn origin_with(key: &str, value: Value) -> AnthropicOrigin {
        let mut body = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        body[key] = value;
        normalised(body).anthropic().unwrap().clone()
    }

    #[test]
    fn only_content_other_flavors_cannot_read_needs_an_anthropic_target() {
        let document = json!([{"role": "user", "content": [{"type": "text", "text": "see"},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}}]}]);
        assert_eq!(origin_with("messages", document).requires, ["messages.0.content.1 (document)"]);
        // Controls and tools other flavors lack are dropped for them (and named), not refused.
        let server_tool = origin_with("tools", json!([{"type": "web_search_20250305", "name": "web_search"}]));
        assert!(server_tool.requires.is_empty());
        assert_eq!(server_tool.unmapped, ["tools (web_search_20250305)"]);
        assert!(origin_with("thinking", json!({"type": "enabled", "budget_tokens": 2048})).requires.is_empty());
        assert!(origin_with("tools", json!([{"name": "f", "input_schema": {"type": "object"}}])).unmapped.is_empty());
        assert_eq!(origin_with("context_management", json!({"edits": []})).unmapped, ["context_management"]);
        assert_eq!(
            origin_with("mcp_servers", json!([{"type": "url", "url": "https://m.example"}])).unmapped,
            ["mcp_servers"]
        );
    }

    #[test]
    fn thinking_and_effort_become_one_effort() {
        let reasoning = |key: &str, value: Value| {
            let mut body = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
            body[key] = value;
            normalised(body).exchange.reasoning.clone()
        };
        assert_eq!(
            reasoning("thinking", json!({"type": "enabled", "budget_tokens": 2048})),
            Some(Reasoning { effort: Some(Effort::Low), fields: vec!["thinking"] })
        );
        assert_eq!(
            reasoning("thinking", json!({"type": "enabled", "budget_tokens": 32000})).unwrap().effort,
            Some(Effort::High)
        );
        assert_eq!(
            reasoning("thinking", json!({"type": "adaptive"})),
            Some(Reasoning { effort: None, fields: vec!["thinking"] }),
            "adaptive thinking leaves the effort to the model"
        );
        assert_eq!(reasoning("thinking", json!({"type": "disabled"})), None);
        let both = normalised(json!({"model": "m", "max_tokens": 10, "thinking": {"type": "adaptive"},
            "output_config": {"effort": "xhigh"}, "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(
            both.exchange.reasoning,
            Some(Reasoning { effort: Some(Effort::High), fields: vec!["thinking", "output_config.effort"] })
        );
        let refused = |body: Value| normalise(&body.to_string().into(), Headers::default(), false).err().unwrap().0;
        let base = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        let mut body = base.clone();
        body["thinking"] = json!({"type": "sometimes"});
        assert!(refused(body).starts_with("thinking.type"));
        let mut body = base;
        body["output_config"] = json!({"effort": "extreme"});
        assert!(refused(body).starts_with("output_config.effort"));
    }

    #[test]
    fn system_messages_inside_messages_stay_where_they_stand() {
        let request = normalised(json!({"model": "team-coder", "max_tokens": 10, "system": "You are a coder.",
            "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": [{"type": "text", "text": "reminder"}]},
                {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]}));
        let roles: Vec<Role> = request.exchange.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::System, Role::Assistant, Role::User]);
        assert_eq!(*request.exchange.system, ["You are a coder."]);
        assert_eq!(request.exchange.messages[1].content, [Part::Text("reminder".into())]);
        assert!(request.anthropic().unwrap().system_messages);
    }

    #[test]
    fn requests_anthropic_would_refuse_are_refused_by_name() {
        let refused = |body: Value| normalise(&body.to_string().into(), Headers::default(), false).err().unwrap().0;
        assert!(
            refused(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]})).starts_with("max_tokens")
        );
        assert!(refused(json!({"model": "m", "max_tokens": 5, "messages": []})).starts_with("messages"));
        assert!(
            refused(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}))
                .starts_with("messages.0.role")
        );
        assert!(refused(json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})).starts_with("model"));
        assert!(normalise(&"{nope".into(), Headers::default(), false).err().unwrap().0.starts_with("malformed JSON"));
        assert!(
            normalise(&r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#.into(), Headers::default(), true)
                .is_ok(),
            "count_tokens needs no max_tokens"
        );
    }

    #[test]
    fn text_only_anthropic_blocks_carry_still_reaches_the_guardrails() {
        let request = normalised(json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "AKIA-secret-in-a-document"}},
        ]}]}));
        assert!(request.prompt_text().contains("AKIA-secret-in-a-document"));
        assert_eq!(request.requires_anthropic(), ["messages.0.content.0 (document)"]);
        assert_eq!(request.exchange.messages.len(), 1, "a document-only turn is a turn");
        assert!(request.check_routable().is_ok());
    }
}
