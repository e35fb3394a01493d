//! An OpenAI-flavour target's `chat.completion`, read into the typed answer and kept as sent
//! for callers of the same shape.
//!
//! * [`Kept::Raw`]: the upstream's own bytes. A borrowed, skip-everything-else parse checks the
//!   shape and reads only what the typed answer needs (the id, each choice's text, tool calls
//!   and finish reason, `usage`), and the answer to an OpenAI-shaped caller is the same bytes
//!   with `model` replaced and `x_shield` spliced in before the closing brace: no tree is
//!   built, walked, re-serialised and dropped per answer (issue 19: that was the largest share
//!   of Shield's own CPU on the answer path).
//! * [`Kept::Tree`]: a JSON map, for the rare answer the borrowed parse does not take (a
//!   non-string `content`, a duplicate key, an upstream's own `x_shield`).
//!
//! Either way the typed answer is the same; the tests below hold both to it. Nothing an
//! upstream sends is taken as Shield's own data: an answer that is not a JSON object in valid
//! UTF-8 is no completion (issue 27).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use shield_core::exchange::{self, Block, Stop};
use shield_core::usage::TokenUsage;

use super::Obj;
use crate::provider::as_sent::{AsSent, Kept, Place, place};

/// An OpenAI-shaped answer as the upstream sent it.
#[derive(Debug)]
pub struct OpenAiAnswer(Kept);

/// What a parse yields: the answer as sent, typed, and the usage it reported.
pub type Parsed = (OpenAiAnswer, exchange::Answer, Option<TokenUsage>);

#[derive(Deserialize)]
struct View<'a> {
    #[serde(borrow)]
    model: &'a RawValue,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    choices: Vec<Obj<ChoiceView<'a>>>,
    #[serde(default)]
    usage: Option<Obj<UsageView>>,
    /// Present only to send such an answer down the general path (it drops the key).
    #[serde(borrow, default)]
    x_shield: Option<&'a RawValue>,
}

/// OpenAI's `usage`, as [`super::usage_of`] reads it: a count that is not a whole number fails
/// this parse, and such an answer takes the general path (which reads it the same way, as no
/// usage).
#[derive(Deserialize)]
pub(super) struct UsageView {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<Obj<DetailsView>>,
    #[serde(default)]
    completion_tokens_details: Option<Obj<DetailsView>>,
}

#[derive(Deserialize)]
struct DetailsView {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl UsageView {
    pub(super) fn tokens(&self) -> Option<TokenUsage> {
        let cache_read = self.prompt_tokens_details.as_ref().and_then(|d| d.cached_tokens).unwrap_or(0);
        let reasoning = self.completion_tokens_details.as_ref().and_then(|d| d.reasoning_tokens).unwrap_or(0);
        Some(TokenUsage {
            input: self.prompt_tokens?,
            output: self.completion_tokens?,
            cache_read,
            cache_write: 0,
            reasoning,
        })
    }
}

#[derive(Deserialize)]
struct ChoiceView<'a> {
    #[serde(borrow, default)]
    message: Option<Obj<MessageView<'a>>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

/// A choice's `message`, or a stream chunk's `delta` ([`super::chunk`]): the same fields.
#[derive(Deserialize)]
pub(super) struct MessageView<'a> {
    #[serde(borrow, default)]
    pub content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub tool_calls: Option<Vec<Obj<ToolCallView<'a>>>>,
}

#[derive(Deserialize)]
pub(super) struct ToolCallView<'a> {
    /// Which call a chunk's piece belongs to (a whole answer's calls are in order).
    #[serde(default)]
    pub index: Option<u64>,
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub function: Option<Obj<FunctionView<'a>>>,
}

#[derive(Deserialize)]
pub(super) struct FunctionView<'a> {
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub arguments: Option<Cow<'a, str>>,
}

/// `finish_reason` as the typed stop.
pub(super) fn stop_of(finish: &str) -> Stop {
    match finish {
        "length" => Stop::MaxTokens,
        "tool_calls" | "function_call" => Stop::ToolUse,
        "content_filter" => Stop::Refusal,
        _ => Stop::EndTurn,
    }
}

/// The typed answer of a completion's choices: each choice's text, then its tool calls, in
/// order (an answer with several choices is all of them: the guardrails read every one).
struct Typed {
    answer: exchange::Answer,
}

impl Typed {
    fn new(id: Option<&str>) -> Typed {
        Typed { answer: exchange::Answer { id: id.unwrap_or_default().to_string(), ..Default::default() } }
    }

    fn text(&mut self, text: &str) {
        self.answer.blocks.push(Block::Text(text.to_string()));
    }

    fn call(&mut self, id: Option<&str>, name: Option<&str>, arguments: Option<&str>) {
        self.answer.blocks.push(Block::ToolUse {
            id: id.unwrap_or_default().to_string(),
            name: name.unwrap_or_default().to_string(),
            input: arguments.filter(|a| !a.is_empty()).unwrap_or("{}").to_string(),
        });
    }

    fn stop(&mut self, finish: Option<&str>) {
        if self.answer.stop.is_none() {
            self.answer.stop = finish.map(stop_of);
        }
    }
}

impl OpenAiAnswer {
    /// An OpenAI-shaped answer body: `None` when it is not a completion (no `choices` array).
    pub fn parse(bytes: Vec<u8>) -> Option<Parsed> {
        // A JSON object in UTF-8, or nothing: the borrowed parse skips what it does not read
        // without checking it, and would take an array whose elements line up with its fields.
        let text = std::str::from_utf8(&bytes).ok()?;
        if !text.trim_start().starts_with('{') {
            return None;
        }
        if let Some((place, answer, usage)) = read(text) {
            return Some((OpenAiAnswer(Kept::Raw(Box::new(AsSent::new(bytes, place)))), answer, usage));
        }
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) if map.get("choices").is_some_and(Value::is_array) => {
                let answer = typed_of(&map);
                let usage = map.get("usage").and_then(super::usage_of);
                Some((OpenAiAnswer(Kept::Tree(map)), answer, usage))
            }
            _ => None,
        }
    }

    /// The answer to an OpenAI-shaped caller: `model` set to the answering target's model,
    /// Shield's `x_shield` added (an upstream's own `x_shield` dropped).
    pub fn render(self, model: &str, x_shield: &impl crate::x_shield::XShieldJson) -> Vec<u8> {
        self.0.render(model, x_shield)
    }
}

/// The typed answer of a completion held as a map.
fn typed_of(map: &Map<String, Value>) -> exchange::Answer {
    let mut typed = Typed::new(map.get("id").and_then(Value::as_str));
    for choice in map.get("choices").and_then(Value::as_array).into_iter().flatten() {
        let message = choice.get("message");
        if let Some(text) = message.and_then(|m| m.get("content")).and_then(Value::as_str) {
            typed.text(text);
        }
        for call in message.and_then(|m| m.get("tool_calls")).and_then(Value::as_array).into_iter().flatten() {
            let function = call.get("function");
            typed.call(
                call.get("id").and_then(Value::as_str),
                function.and_then(|f| f.get("name")).and_then(Value::as_str),
                function.and_then(|f| f.get("arguments")).and_then(Value::as_str),
            );
        }
        typed.stop(choice.get("finish_reason").and_then(Value::as_str));
    }
    typed.answer
}

/// The borrowed look at `text`; `None` sends it down the general path.
fn read(text: &str) -> Option<(Place, exchange::Answer, Option<TokenUsage>)> {
    if super::has_surrogate_escape(text) {
        return None;
    }
    let view: View<'_> = serde_json::from_str(text).ok()?;
    if view.x_shield.is_some() {
        return None;
    }
    let place = place(text, view.model)?;
    let mut typed = Typed::new(view.id.as_deref());
    for choice in &view.choices {
        if let Some(message) = &choice.message {
            if let Some(content) = &message.content {
                typed.text(content);
            }
            for call in message.tool_calls.iter().flatten() {
                let function = call.function.as_ref();
                typed.call(
                    call.id.as_deref(),
                    function.and_then(|f| f.name.as_deref()),
                    function.and_then(|f| f.arguments.as_deref()),
                );
            }
        }
        typed.stop(choice.finish_reason.as_deref());
    }
    let usage = view.usage.as_ref().and_then(|usage| usage.tokens());
    Some((place, typed.answer, usage))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn parse(bytes: &[u8]) -> Option<Parsed> {
        OpenAiAnswer::parse(bytes.to_vec())
    }

    fn is_raw(answer: &OpenAiAnswer) -> bool {
        matches!(answer.0, Kept::Raw(_))
    }

    /// Both paths give the same answers for the same completion.
    fn agree(body: &Value) {
        let bytes = serde_json::to_vec(body).unwrap();
        let (raw, typed, usage) = parse(&bytes).unwrap();
        assert!(is_raw(&raw), "{body}");
        let Value::Object(map) = body.clone() else { panic!() };
        assert_eq!(typed, typed_of(&map));
        assert_eq!(usage, map.get("usage").and_then(super::super::usage_of));
        let tree = OpenAiAnswer(Kept::Tree(map));
        let x_shield = json!({"routing": {"route": "r"}, "guardrail_results": []});
        let (a, b) = (raw.render("gpt-x", &x_shield), tree.render("gpt-x", &x_shield));
        let (a, b): (Value, Value) = (serde_json::from_slice(&a).unwrap(), serde_json::from_slice(&b).unwrap());
        assert_eq!(a, b);
        assert_eq!(a["model"], "gpt-x");
        assert_eq!(a["x_shield"], x_shield);
    }

    #[test]
    fn the_raw_path_splices_model_and_x_shield_into_the_upstreams_bytes() {
        let body = br#"{"id":"c1","object":"chat.completion","model":"up-\"1\"","choices":[{"index":0,"message":{"role":"assistant","content":"hi \u00e9\n"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}  "#;
        let (completion, typed, _) = parse(body).unwrap();
        assert!(is_raw(&completion));
        assert_eq!(typed.text(), "hi é\n");
        assert_eq!(typed.stop, Some(Stop::EndTurn));
        assert_eq!(typed.id, "c1");
        let out = completion.render("m\"2", &json!({"routing": 1}));
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(r#"{"id":"c1","object":"chat.completion","model":"m\"2","choices""#), "{text}");
        assert!(text.ends_with(r#""usage":{"prompt_tokens":3,"completion_tokens":2},"x_shield":{"routing":1}}"#));
        agree(&serde_json::from_slice(body).unwrap());
    }

    #[test]
    fn unusual_answers_take_the_general_path_and_non_completions_none() {
        let own = br#"{"model":"m","choices":[],"x_shield":{"routing":"forged"}}"#;
        let (completion, ..) = parse(own).unwrap();
        assert!(!is_raw(&completion));
        let out: Value = serde_json::from_slice(&completion.render("t", &json!({"mine": true}))).unwrap();
        assert_eq!(out["x_shield"], json!({"mine": true}), "an upstream's own x_shield is dropped");
        let parts = br#"{"model":"m","choices":[{"message":{"content":[{"type":"text","text":"a"}]}}]}"#;
        assert!(parse(parts).is_some_and(|(c, ..)| !is_raw(&c)));
        // Arrays where a tree finds no object, and a lone surrogate a tree refuses: read as the
        // tree reads them.
        for odd in [
            &br#"{"model":"m","choices":[[{"content":"hi"},"stop"]]}"#[..],
            br#"{"model":"m","choices":[{"message":["hi"]}],"usage":[7,2]}"#,
            br#"{"model":"m","choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":1,"completion_tokens":2,"prompt_tokens_details":[5]}}"#,
        ] {
            let (completion, typed, usage) = parse(odd).unwrap();
            assert!(!is_raw(&completion));
            let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(odd) else { panic!() };
            assert_eq!((typed, usage), (typed_of(&map), map.get("usage").and_then(super::super::usage_of)));
        }
        assert!(parse(br#"{"model":"m","x":"\udc00","choices":[{"message":{"content":"x"}}]}"#).is_none());
        let duplicate = br#"{"model":"m","model":"n","choices":[]}"#;
        assert!(parse(duplicate).is_some_and(|(c, ..)| !is_raw(&c)));
        let no_model = br#"{"choices":[{"message":{"content":"x"}}]}"#;
        let (completion, ..) = parse(no_model).unwrap();
        let out: Value = serde_json::from_slice(&completion.render("t", &json!(1))).unwrap();
        assert_eq!(out["model"], "t");
        assert!(parse(br#"{"error":{"message":"x"}}"#).is_none());
        assert!(parse(b"garbage").is_none());
        assert!(parse(br#"{"choices":{}}"#).is_none());
    }

    /// Issue 27: what the borrowed parse would have taken but is no completion.
    #[test]
    fn arrays_and_invalid_utf8_are_not_completions() {
        let array = br#"["mock",[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]]"#;
        assert!(parse(array).is_none());
        let bad = b"{\"id\":\"c\xff1\",\"model\":\"m\",\"choices\":[{\"message\":{\"content\":\"hi\"}}]}";
        assert!(parse(bad).is_none());
        // An upstream's field named like Shield's old side channel is its own, never blocks.
        let named = br#"{"model":"m","choices":[{"message":{"content":"hi"}}],"x_anthropic_content":[{"type":"text","text":"x"}]}"#;
        assert_eq!(parse(named).unwrap().1.blocks, [Block::Text("hi".into())]);
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
            let (.., raw) = parse(&serde_json::to_vec(&body).unwrap()).unwrap();
            let Value::Object(map) = body else { panic!() };
            let expected = map.get("usage").and_then(super::super::usage_of);
            assert_eq!(raw, expected, "{usage}");
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
            if let Some((completion, ..)) = OpenAiAnswer::parse(bytes) {
                let out = completion.render("t", &json!({"routing": 1}));
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
