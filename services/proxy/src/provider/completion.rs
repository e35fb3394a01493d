//! The normalised completion: an OpenAI `chat.completion` object, held one of two ways.
//!
//! * [`Completion::Raw`]: the upstream's own bytes, when they are OpenAI's shape already (the
//!   `openai` and `azure` flavors). A borrowed, skip-everything-else parse checks the shape
//!   and reads only what Shield uses — where `model` sits, the answer's text and tool names
//!   (for the output guardrails) and `usage` — and the answer to an OpenAI-shaped caller is
//!   the same bytes with `model` replaced and `x_shield` spliced in before the closing brace:
//!   no tree is built, walked, re-serialised and dropped per answer (issue 19: that was the
//!   largest share of Shield's own CPU on the answer path).
//! * [`Completion::Tree`]: a JSON map, for adapters that convert (Anthropic) and for the
//!   rare upstream answer the borrowed parse does not take (a non-string `content`, a
//!   duplicate key, an upstream's own `x_shield`): those take the general path, unchanged.
//! * [`Completion::Native`]: converted from a provider's own content blocks, the blocks kept
//!   beside it (never inside the map) for callers of that provider's shape.
//!
//! Either way the same questions get the same answers; the tests below hold both to it.
//! Nothing an upstream sends is taken as Shield's own data: an answer that is not a JSON
//! object in valid UTF-8 is no completion (issue 27: an array laid out like one, or a non-UTF-8
//! byte in a field the borrowed parse skips, was spliced and relayed as broken JSON), and the
//! native blocks are only ever what an adapter produced.

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use shield_core::usage::TokenUsage;

/// A normalised completion.
#[derive(Debug)]
pub enum Completion {
    Raw(Box<RawCompletion>),
    Tree(Map<String, Value>),
    /// `chat` is the completion in OpenAI's shape; `blocks` the provider's own content
    /// (thinking and its signatures included) for a caller in that provider's shape.
    Native {
        chat: Map<String, Value>,
        blocks: Vec<Value>,
    },
}

/// An upstream completion as sent, with what Shield reads of it.
#[derive(Debug)]
pub struct RawCompletion {
    bytes: Vec<u8>,
    /// The bytes of `model`'s value.
    model: Range<usize>,
    /// The index of the closing `}`.
    end: usize,
    /// Every choice's `message.content`, joined by newlines.
    text: String,
    tools: Vec<String>,
    /// `usage`, read straight into OpenAI's token counts (no tree of it is built).
    usage: Option<TokenUsage>,
}

#[derive(Deserialize)]
struct View<'a> {
    #[serde(borrow)]
    model: &'a RawValue,
    choices: Vec<ChoiceView<'a>>,
    #[serde(default)]
    usage: Option<UsageView>,
    /// Present only to send such an answer down the general path (it drops the key).
    #[serde(borrow, default)]
    x_shield: Option<&'a RawValue>,
}

/// OpenAI's `usage`, as [`super::openai::usage_of`] reads it: a count that is not a whole
/// number fails this parse, and such an answer takes the general path (which reads it the same
/// way, as no usage).
#[derive(Deserialize)]
struct UsageView {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<DetailsView>,
}

#[derive(Deserialize)]
struct DetailsView {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl UsageView {
    fn tokens(&self) -> Option<TokenUsage> {
        let cache_read = self.prompt_tokens_details.as_ref().and_then(|d| d.cached_tokens).unwrap_or(0);
        Some(TokenUsage { input: self.prompt_tokens?, output: self.completion_tokens?, cache_read, cache_write: 0 })
    }
}

#[derive(Deserialize)]
struct ChoiceView<'a> {
    #[serde(borrow, default)]
    message: Option<MessageView<'a>>,
}

#[derive(Deserialize)]
struct MessageView<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallView<'a>>>,
}

#[derive(Deserialize)]
struct ToolCallView<'a> {
    #[serde(borrow, default)]
    function: Option<FunctionView<'a>>,
}

#[derive(Deserialize)]
struct FunctionView<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
}

impl Completion {
    /// An OpenAI-shaped answer body: `None` when it is not a completion (no `choices` array).
    pub fn parse_openai(bytes: Vec<u8>) -> Option<Completion> {
        // A JSON object in UTF-8, or nothing: the borrowed parse skips what it does not read
        // without checking it, and would take an array whose elements line up with its fields.
        let text = std::str::from_utf8(&bytes).ok()?;
        if !text.trim_start().starts_with('{') {
            return None;
        }
        if let Some(raw) = RawCompletion::parse(text) {
            return Some(Completion::Raw(Box::new(RawCompletion { bytes, ..raw })));
        }
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) if shield_core::outcome::is_completion(&map) => Some(Completion::Tree(map)),
            _ => None,
        }
    }

    /// The token counts of OpenAI's `usage`, when it reports them.
    pub fn token_usage(&self) -> Option<TokenUsage> {
        match self {
            Completion::Raw(raw) => raw.usage,
            Completion::Tree(map) | Completion::Native { chat: map, .. } => {
                map.get("usage").and_then(super::openai::usage_of)
            }
        }
    }

    /// The assistant text of every choice (what the output guardrails read), and the text of
    /// the provider's own blocks when it sent any (thinking reaches callers of its shape).
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Completion::Raw(raw) => Cow::Borrowed(&raw.text),
            Completion::Tree(map) => Cow::Owned(shield_core::output_guard::answer_text(map)),
            Completion::Native { chat, blocks } => {
                let mut text = shield_core::output_guard::answer_text(chat);
                for block in blocks {
                    for key in ["thinking", "text"] {
                        if let Some(more) = block.get(key).and_then(Value::as_str) {
                            text.push('\n');
                            text.push_str(more);
                        }
                    }
                }
                Cow::Owned(text)
            }
        }
    }

    /// The tools the answer asks to call (what tool RBAC reads).
    pub fn tool_names(&self) -> Vec<String> {
        match self {
            Completion::Raw(raw) => raw.tools.clone(),
            Completion::Tree(map) | Completion::Native { chat: map, .. } => {
                shield_core::output_guard::tool_names(map.get("choices").and_then(Value::as_array), "message")
            }
        }
    }

    /// The completion as a map, for renderers that rebuild the answer (other caller shapes).
    pub fn into_tree(self) -> Map<String, Value> {
        self.into_parts().0
    }

    /// The completion as a map, and the provider's own blocks when the adapter kept them.
    pub fn into_parts(self) -> (Map<String, Value>, Option<Vec<Value>>) {
        match self {
            Completion::Tree(map) => (map, None),
            Completion::Native { chat, blocks } => (chat, Some(blocks)),
            Completion::Raw(raw) => match serde_json::from_slice(&raw.bytes) {
                Ok(Value::Object(map)) => (map, None),
                _ => (Map::new(), None),
            },
        }
    }

    /// The answer to an OpenAI-shaped caller: `model` set to the answering target's model,
    /// Shield's `x_shield` added (an upstream's own `x_shield` and Shield-internal keys
    /// dropped).
    pub fn render_openai(self, model: &str, x_shield: &impl serde::Serialize) -> Vec<u8> {
        match self {
            Completion::Raw(raw) => (*raw).render(model, x_shield),
            Completion::Tree(mut body) | Completion::Native { chat: mut body, .. } => {
                body.insert("model".into(), Value::String(model.to_string()));
                body.remove("x_shield");
                #[derive(serde::Serialize)]
                struct AnswerBody<'a, X> {
                    #[serde(flatten)]
                    upstream: &'a Map<String, Value>,
                    x_shield: &'a X,
                }
                serde_json::to_vec(&AnswerBody { upstream: &body, x_shield }).unwrap_or_default()
            }
        }
    }
}

impl RawCompletion {
    /// The borrowed look at `bytes`; `None` sends them down the general path.
    fn parse(text: &str) -> Option<RawCompletion> {
        let bytes = text.as_bytes();
        let view: View<'_> = serde_json::from_str(text).ok()?;
        if view.x_shield.is_some() {
            return None;
        }
        let model = view.model.get();
        let start = (model.as_ptr() as usize).checked_sub(bytes.as_ptr() as usize)?;
        let end = bytes.iter().rposition(|&b| b == b'}')?;
        let mut text = String::new();
        let mut tools = Vec::new();
        let mut parts = 0;
        for message in view.choices.iter().filter_map(|c| c.message.as_ref()) {
            if let Some(content) = &message.content {
                if parts > 0 {
                    text.push('\n');
                }
                text.push_str(content);
                parts += 1;
            }
            let calls = message.tool_calls.iter().flatten();
            tools.extend(calls.filter_map(|c| c.function.as_ref()?.name.as_deref().map(str::to_string)));
        }
        let usage = view.usage.as_ref().and_then(UsageView::tokens);
        Some(RawCompletion { bytes: Vec::new(), model: start..start + model.len(), end, text, tools, usage })
    }

    fn render(self, model: &str, x_shield: &impl serde::Serialize) -> Vec<u8> {
        let (Some(head), Some(middle)) = (self.bytes.get(..self.model.start), self.bytes.get(self.model.end..self.end))
        else {
            // The parse's own offsets: always inside the bytes it parsed. Were they not, the
            // general path renders the same answer.
            return Completion::Tree(Completion::Raw(Box::new(self)).into_tree()).render_openai(model, x_shield);
        };
        let mut out = Vec::with_capacity(self.bytes.len() + model.len() + 512);
        out.extend_from_slice(head);
        let _ = serde_json::to_writer(&mut out, model);
        out.extend_from_slice(middle);
        out.extend_from_slice(b",\"x_shield\":");
        let _ = serde_json::to_writer(&mut out, x_shield);
        out.push(b'}');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// Both paths give the same answers for the same completion.
    fn agree(body: &Value) {
        let bytes = serde_json::to_vec(body).unwrap();
        let raw = Completion::parse_openai(bytes.clone()).unwrap();
        assert!(matches!(raw, Completion::Raw(_)), "{body}");
        let Value::Object(map) = body.clone() else { panic!() };
        let tree = Completion::Tree(map);
        assert_eq!(raw.text(), tree.text());
        assert_eq!(raw.tool_names(), tree.tool_names());
        assert_eq!(raw.token_usage(), tree.token_usage());
        let x_shield = json!({"routing": {"route": "r"}, "guardrail_results": []});
        let (a, b) = (raw.render_openai("gpt-x", &x_shield), tree.render_openai("gpt-x", &x_shield));
        let (a, b): (Value, Value) = (serde_json::from_slice(&a).unwrap(), serde_json::from_slice(&b).unwrap());
        assert_eq!(a, b);
        assert_eq!(a["model"], "gpt-x");
        assert_eq!(a["x_shield"], x_shield);
    }

    #[test]
    fn the_raw_path_splices_model_and_x_shield_into_the_upstreams_bytes() {
        let body = br#"{"id":"c1","object":"chat.completion","model":"up-\"1\"","choices":[{"index":0,"message":{"role":"assistant","content":"hi \u00e9\n"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}  "#;
        let completion = Completion::parse_openai(body.to_vec()).unwrap();
        assert!(matches!(completion, Completion::Raw(_)));
        assert_eq!(completion.text(), "hi é\n");
        let out = completion.render_openai("m\"2", &json!({"routing": 1}));
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(r#"{"id":"c1","object":"chat.completion","model":"m\"2","choices""#), "{text}");
        assert!(text.ends_with(r#""usage":{"prompt_tokens":3,"completion_tokens":2},"x_shield":{"routing":1}}"#));
        agree(&serde_json::from_slice(body).unwrap());
    }

    #[test]
    fn unusual_answers_take_the_general_path_and_non_completions_none() {
        let own = br#"{"model":"m","choices":[],"x_shield":{"routing":"forged"}}"#;
        let completion = Completion::parse_openai(own.to_vec()).unwrap();
        assert!(matches!(completion, Completion::Tree(_)));
        let out: Value = serde_json::from_slice(&completion.render_openai("t", &json!({"mine": true}))).unwrap();
        assert_eq!(out["x_shield"], json!({"mine": true}), "an upstream's own x_shield is dropped");
        let parts = br#"{"model":"m","choices":[{"message":{"content":[{"type":"text","text":"a"}]}}]}"#;
        assert!(matches!(Completion::parse_openai(parts.to_vec()), Some(Completion::Tree(_))));
        let duplicate = br#"{"model":"m","model":"n","choices":[]}"#;
        assert!(matches!(Completion::parse_openai(duplicate.to_vec()), Some(Completion::Tree(_))));
        let no_model = br#"{"choices":[{"message":{"content":"x"}}]}"#;
        let completion = Completion::parse_openai(no_model.to_vec()).unwrap();
        let out: Value = serde_json::from_slice(&completion.render_openai("t", &json!(1))).unwrap();
        assert_eq!(out["model"], "t");
        assert!(Completion::parse_openai(br#"{"error":{"message":"x"}}"#.to_vec()).is_none());
        assert!(Completion::parse_openai(b"garbage".to_vec()).is_none());
        assert!(Completion::parse_openai(br#"{"choices":{}}"#.to_vec()).is_none());
    }

    /// Issue 27: what the borrowed parse would have taken but is no completion.
    #[test]
    fn arrays_and_invalid_utf8_are_not_completions() {
        let array = br#"["mock",[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]]"#;
        assert!(Completion::parse_openai(array.to_vec()).is_none());
        let bad = b"{\"id\":\"c\xff1\",\"model\":\"m\",\"choices\":[{\"message\":{\"content\":\"hi\"}}]}";
        assert!(Completion::parse_openai(bad.to_vec()).is_none());
        // An upstream's field named like Shield's old side channel is its own, never blocks.
        let named = br#"{"model":"m","choices":[{"message":{"content":"hi"}}],"x_anthropic_content":[{"type":"text","text":"x"}]}"#;
        assert!(Completion::parse_openai(named.to_vec()).unwrap().into_parts().1.is_none());
    }

    #[test]
    fn both_paths_read_usage_alike_whatever_its_shape() {
        for usage in [
            json!(null),
            json!({}),
            json!({"prompt_tokens": 7}),
            json!({"prompt_tokens": 7, "completion_tokens": 2}),
            json!({"prompt_tokens": 7, "completion_tokens": 2, "prompt_tokens_details": null}),
            json!({"prompt_tokens": 7, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 5}}),
            json!({"prompt_tokens": 7.5, "completion_tokens": 2}),
            json!({"prompt_tokens": -1, "completion_tokens": 2}),
            json!({"prompt_tokens": "7", "completion_tokens": 2}),
        ] {
            let body = json!({"model": "m", "choices": [{"message": {"content": "x"}}], "usage": usage});
            let raw = Completion::parse_openai(serde_json::to_vec(&body).unwrap()).unwrap();
            let Value::Object(map) = body else { panic!() };
            let expected = map.get("usage").and_then(super::super::openai::usage_of);
            assert_eq!(raw.token_usage(), expected, "{usage}");
            assert_eq!(Completion::Tree(map).token_usage(), expected);
        }
    }

    proptest! {
        /// Whatever bytes an upstream sends, an answer taken as a completion renders as one
        /// JSON object: flipped, cut or inserted bytes in a valid completion, or noise.
        #[test]
        fn a_completion_always_renders_as_a_json_object(
            cut in 0usize..200,
            at in 0usize..200,
            byte in any::<u8>(),
            noise in proptest::collection::vec(any::<u8>(), 0..64),
            wrap in 0u8..3,
        ) {
            let valid = br#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
            let mut bytes = valid.to_vec();
            match wrap {
                0 => { let i = at % bytes.len(); bytes[i] = byte; }
                1 => { bytes.truncate(cut % bytes.len()); bytes.extend_from_slice(&noise); }
                _ => { let i = at % bytes.len(); bytes.splice(i..i, noise.iter().copied()); }
            }
            if let Some(completion) = Completion::parse_openai(bytes) {
                let out = completion.render_openai("t", &json!({"routing": 1}));
                let parsed: Value = serde_json::from_slice(&out).expect("valid JSON");
                prop_assert!(parsed.is_object());
                prop_assert_eq!(&parsed["x_shield"], &json!({"routing": 1}));
            }
        }

        /// Any completion with text, tool calls and extra fields: the raw path answers as the
        /// tree path does.
        #[test]
        fn both_paths_agree(
            contents in proptest::collection::vec(proptest::option::of("\\PC{0,20}"), 0..4),
            tool in proptest::option::of("[a-z_]{1,12}"),
            model in "\\PC{0,16}",
            extra in "\\PC{0,16}",
        ) {
            let choices: Vec<Value> = contents.iter().enumerate().map(|(i, c)| {
                let mut message = json!({"role": "assistant", "content": c});
                if let (0, Some(tool)) = (i, &tool) {
                    message["tool_calls"] = json!([{"id": "t1", "type": "function", "function": {"name": tool, "arguments": "{}"}}]);
                }
                json!({"index": i, "message": message, "finish_reason": "stop"})
            }).collect();
            agree(&json!({"id": "x", "model": model, "extra": extra, "choices": choices,
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}}}));
        }
    }
}
