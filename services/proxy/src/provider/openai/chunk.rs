//! An OpenAI-flavour target's stream chunk (`chat.completion.chunk`), read into typed deltas
//! and kept as sent for callers of the same shape, as [`super::completion`] does for a whole
//! answer (issue 33).
//!
//! * [`NativeChunk::Raw`]: the event's own text and where `model`'s value sits in it. A
//!   borrowed parse reads only what the deltas need (the id, each choice's text, tool calls and
//!   finish reason, `usage`), and the event to an OpenAI-shaped caller is the same text with
//!   `model` replaced: no tree is built, re-serialised through `Display` and dropped per event.
//!   A stream of 300 events did that 300 times; it was most of the relay's own CPU per event.
//! * [`NativeChunk::Tree`]: a JSON value, for the rare chunk the borrowed parse does not take
//!   (a field of an unexpected type, a duplicate key, no `model`, or a line break in the data,
//!   which could not be written back as one `data:` line).
//!
//! Either way the deltas, usage and id are the same; the tests below hold both to it. Nested
//! objects are read as objects only ([`super::Obj`]), and a text with a surrogate escape goes
//! the tree's way ([`super::has_surrogate_escape`]). What the borrowed reading still takes that
//! the tree refuses is grammatical JSON in fields Shield does not read: a number beyond `f64`
//! (`"created":1e400`) or nesting past serde_json's 128 levels. Such a chunk is relayed as the
//! upstream wrote it, as a proxy that does not read it would, where the tree reading dropped it
//! as malformed.

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use shield_core::exchange::Delta;
use shield_core::usage::TokenUsage;

use super::Obj;
use super::completion::{MessageView, UsageView, stop_of};

/// A chunk as the upstream sent it, for a caller of its shape.
#[derive(Debug, Clone)]
pub enum NativeChunk {
    Raw { data: String, model: Range<usize> },
    Tree(Value),
}

impl NativeChunk {
    /// The chunk as one server-sent event, with `model` set to `model`.
    pub fn event(self, model: &str) -> Vec<u8> {
        match self {
            NativeChunk::Raw { data, model: at } => {
                let mut out = Vec::with_capacity(data.len() + model.len() + 16);
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(data.as_bytes().get(..at.start).unwrap_or_default());
                // A string serialises without failing; the fallback keeps the event valid JSON.
                serde_json::to_writer(&mut out, model).unwrap_or_else(|_| out.extend_from_slice(b"\"\""));
                out.extend_from_slice(data.as_bytes().get(at.end..).unwrap_or_default());
                out.extend_from_slice(b"\n\n");
                out
            }
            NativeChunk::Tree(mut chunk) => {
                if let Some(object) = chunk.as_object_mut() {
                    object.insert("model".into(), Value::String(model.to_string()));
                }
                let mut out = b"data: ".to_vec();
                serde_json::to_writer(&mut out, &chunk).unwrap_or_default();
                out.extend_from_slice(b"\n\n");
                out
            }
        }
    }
}

/// What a chunk says: its deltas, whether it reported usage (and what Shield could read of it),
/// its id, and the chunk as sent.
#[derive(Debug)]
pub struct ReadChunk {
    pub deltas: Vec<Delta>,
    /// A non-null `usage` (one Shield cannot read is still one: never relayed unasked).
    pub usage: bool,
    pub reported: Option<TokenUsage>,
    pub id: Option<String>,
    pub native: NativeChunk,
}

/// What an event's data is.
#[derive(Debug)]
pub enum Read {
    Chunk(ReadChunk),
    /// An object with an `error` key: the provider's error.
    Error,
    /// Not a JSON object.
    Malformed,
}

/// Reads one event's data.
pub fn read(data: &str) -> Read {
    if let Some(chunk) = read_raw(data) {
        return chunk;
    }
    read_tree(data)
}

/// The general reading: a tree of the chunk.
fn read_tree(data: &str) -> Read {
    match serde_json::from_str::<Value>(data) {
        Ok(chunk) if chunk.get("error").is_some() => Read::Error,
        Ok(chunk @ Value::Object(_)) => {
            let usage = chunk.get("usage").filter(|u| !u.is_null());
            Read::Chunk(ReadChunk {
                deltas: deltas_of(&chunk),
                usage: usage.is_some(),
                reported: usage.and_then(super::usage_of),
                id: chunk.get("id").and_then(Value::as_str).map(str::to_string),
                native: NativeChunk::Tree(chunk),
            })
        }
        _ => Read::Malformed,
    }
}

/// A chunk's typed deltas: every choice's text, tool-call openings and argument pieces, and
/// its finish reason.
fn deltas_of(chunk: &Value) -> Vec<Delta> {
    let mut deltas = Vec::new();
    for choice in chunk.get("choices").and_then(Value::as_array).into_iter().flatten() {
        let delta = choice.get("delta");
        let text = delta.and_then(|d| d.get("content")).and_then(Value::as_str);
        let calls =
            delta.and_then(|d| d.get("tool_calls")).and_then(Value::as_array).into_iter().flatten().map(|call| {
                let function = call.get("function");
                CallRead {
                    index: call.get("index").and_then(Value::as_u64),
                    id: call.get("id").and_then(Value::as_str),
                    name: function.and_then(|f| f.get("name")).and_then(Value::as_str),
                    arguments: function.and_then(|f| f.get("arguments")).and_then(Value::as_str),
                }
            });
        push_choice(&mut deltas, text, calls, choice.get("finish_reason").and_then(Value::as_str));
    }
    deltas
}

/// One tool call of a choice's delta, however it was read.
struct CallRead<'a> {
    index: Option<u64>,
    id: Option<&'a str>,
    name: Option<&'a str>,
    arguments: Option<&'a str>,
}

/// A choice's deltas, in the order both readings give them.
fn push_choice<'a>(
    deltas: &mut Vec<Delta>,
    text: Option<&str>,
    calls: impl Iterator<Item = CallRead<'a>>,
    finish: Option<&str>,
) {
    if let Some(text) = text.filter(|t| !t.is_empty()) {
        deltas.push(Delta::Text(text.to_string()));
    }
    for call in calls {
        let index = call.index.unwrap_or(0) as u32;
        if call.id.is_some() || call.name.is_some() {
            let (id, name) = (call.id.unwrap_or_default().to_string(), call.name.unwrap_or_default().to_string());
            deltas.push(Delta::ToolCall { index, id, name });
        }
        if let Some(json) = call.arguments.filter(|a| !a.is_empty()) {
            deltas.push(Delta::ToolArguments { index, json: json.to_string() });
        }
    }
    if let Some(finish) = finish {
        deltas.push(Delta::Stop(stop_of(finish)));
    }
}

#[derive(Deserialize)]
struct View<'a> {
    #[serde(borrow)]
    model: &'a RawValue,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Option<Vec<Obj<ChoiceView<'a>>>>,
    #[serde(default)]
    usage: Option<Obj<UsageView>>,
    /// Present (even as `null`): the provider's error, which the tree reading classifies.
    #[serde(default, deserialize_with = "present")]
    error: bool,
}

#[derive(Deserialize)]
struct ChoiceView<'a> {
    #[serde(borrow, default)]
    delta: Option<Obj<MessageView<'a>>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(deserializer).map(|_| true)
}

/// The borrowed reading; `None` sends the data down the general path.
fn read_raw(data: &str) -> Option<Read> {
    // One `data:` line when written back, and an object (the borrowed parse would take an array
    // whose elements line up with its fields).
    if data.contains(['\n', '\r']) || !data.trim_start().starts_with('{') || super::has_surrogate_escape(data) {
        return None;
    }
    let view: View<'_> = serde_json::from_str(data).ok()?;
    if view.error {
        return None;
    }
    let model = view.model.get();
    let start = (model.as_ptr() as usize).checked_sub(data.as_ptr() as usize)?;
    let model = start..start + model.len();
    let mut deltas = Vec::new();
    for choice in view.choices.iter().flatten() {
        let delta = choice.delta.as_ref();
        let calls = delta.and_then(|d| d.tool_calls.as_ref()).into_iter().flatten().map(|call| {
            let function = call.function.as_ref();
            CallRead {
                index: call.index,
                id: call.id.as_deref(),
                name: function.and_then(|f| f.name.as_deref()),
                arguments: function.and_then(|f| f.arguments.as_deref()),
            }
        });
        push_choice(&mut deltas, delta.and_then(|d| d.content.as_deref()), calls, choice.finish_reason.as_deref());
    }
    Some(Read::Chunk(ReadChunk {
        deltas,
        usage: view.usage.is_some(),
        reported: view.usage.as_ref().and_then(|usage| usage.tokens()),
        id: view.id.map(Cow::into_owned),
        native: NativeChunk::Raw { data: data.to_string(), model },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn chunk(read: Read) -> ReadChunk {
        match read {
            Read::Chunk(chunk) => chunk,
            other => panic!("not a chunk: {other:?}"),
        }
    }

    fn parsed_event(native: NativeChunk, model: &str) -> Value {
        let event = String::from_utf8(native.event(model)).unwrap();
        let data = event.strip_prefix("data: ").and_then(|e| e.strip_suffix("\n\n")).unwrap();
        assert!(!data.contains('\n'), "one data line: {event:?}");
        serde_json::from_str(data).unwrap()
    }

    /// The two readings of `data` say the same, and write the same event (as JSON).
    fn agree(data: &str) -> bool {
        let tree = read_tree(data);
        let Some(raw) = read_raw(data) else { return false };
        let (raw, tree) = (chunk(raw), chunk(tree));
        assert_eq!(raw.deltas, tree.deltas, "{data}");
        assert_eq!((raw.usage, raw.reported, &raw.id), (tree.usage, tree.reported, &tree.id), "{data}");
        assert!(matches!(raw.native, NativeChunk::Raw { .. }));
        assert_eq!(parsed_event(raw.native, "gpt-\"x\""), parsed_event(tree.native, "gpt-\"x\""), "{data}");
        true
    }

    #[test]
    fn an_upstreams_chunk_is_written_back_as_sent_with_the_model_set() {
        let data = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-2024","system_fingerprint":"fp","choices":[{"index":0,"delta":{"content":"Hel\"lo\n"},"logprobs":null,"finish_reason":null}]}"#;
        let read = chunk(read(data));
        assert_eq!(read.deltas, [Delta::Text("Hel\"lo\n".into())]);
        assert_eq!(read.id.as_deref(), Some("chatcmpl-1"));
        let event = String::from_utf8(read.native.event("route-model")).unwrap();
        assert_eq!(event, format!("data: {}\n\n", data.replace("\"gpt-4o-2024\"", "\"route-model\"")));
        assert!(agree(data));
    }

    #[test]
    fn tool_calls_usage_and_the_end_read_alike() {
        for data in [
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"read","arguments":""}}]},"finish_reason":null}]}"#,
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"p\":"}}]},"finish_reason":null}]}"#,
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":2}}}"#,
            r#"{"id":"c","model":"m","choices":[],"usage":{}}"#,
            r#"{"model":"m","choices":null,"usage":null}"#,
            r#"  {"model":{"nested":[1,2]},"choices":[{"delta":{"content":""},"finish_reason":"length"},{"delta":{"content":"b"}}]}"#,
        ] {
            assert!(agree(data), "{data} was not read raw");
        }
    }

    #[test]
    fn unusual_chunks_take_the_tree_and_errors_are_errors() {
        for data in [
            r#"{"model":"m","model":"n","choices":[]}"#,
            "{\"model\":\"m\",\n\"choices\":[]}",
            r#"{"choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"model":"m","choices":[{"delta":{"content":["x"]}}]}"#,
            r#"{"model":"m","choices":[{"delta":{"tool_calls":[{"index":-1,"function":{"name":"f"}}]}}]}"#,
            r#"{"model":"m","choices":[],"usage":{"prompt_tokens":1.5,"completion_tokens":2}}"#,
        ] {
            assert!(read_raw(data).is_none(), "{data}");
            assert!(matches!(read(data), Read::Chunk(ReadChunk { native: NativeChunk::Tree(_), .. })), "{data}");
        }
        // Arrays where the tree finds no object: no deltas, no usage figures (issue 33 review).
        for data in [
            r#"{"model":"m","choices":[[{"content":"hi"},"stop"]]}"#,
            r#"{"model":"m","choices":[{"delta":["hi"]}]}"#,
            r#"{"model":"m","choices":[],"usage":[7,2]}"#,
            r#"{"model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"prompt_tokens_details":[5]}}"#,
            r#"{"model":"m","choices":[{"delta":{"tool_calls":[["c1"]]}}]}"#,
        ] {
            let (read, tree) = (chunk(read(data)), chunk(read_tree(data)));
            assert_eq!((read.deltas, read.usage, read.reported), (tree.deltas, tree.usage, tree.reported), "{data}");
        }
        // A lone surrogate in a field Shield does not read: refused as the tree refuses it.
        let lone = r#"{"model":"m","logprobs":"\ud83d","choices":[{"delta":{"content":"hi"}}]}"#;
        assert!(matches!(read(lone), Read::Malformed));
        let pair = r#"{"model":"m","choices":[{"delta":{"content":"\ud83d\ude00"}}]}"#;
        assert_eq!(chunk(read(pair)).deltas, [Delta::Text("😀".into())]);
        // A number beyond f64 in a field Shield does not read: relayed as written (module doc).
        let huge = r#"{"model":"m","created":1e400,"choices":[{"delta":{"content":"hi"}}]}"#;
        assert!(matches!(read_tree(huge), Read::Malformed));
        let relayed = chunk(read(huge));
        assert_eq!(relayed.deltas, [Delta::Text("hi".into())]);
        assert!(String::from_utf8(relayed.native.event("t")).unwrap().contains(r#""created":1e400"#));
        // No `model`: the tree's event gains one.
        let read_chunk = chunk(read(r#"{"choices":[{"delta":{"content":"x"}}]}"#));
        assert_eq!(parsed_event(read_chunk.native, "t")["model"], "t");
        for data in [r#"{"model":"m","error":{"message":"overloaded"}}"#, r#"{"model":"m","error":null}"#] {
            assert!(matches!(read(data), Read::Error), "{data}");
        }
        for data in ["[\"m\",[]]", "garbage", "", "null"] {
            assert!(matches!(read(data), Read::Malformed), "{data}");
        }
    }

    fn text() -> impl Strategy<Value = Value> {
        prop_oneof![
            "\\PC{0,12}".prop_map(Value::from),
            Just(json!("line\nbreak \"quoted\" \\ é 🙂")),
            Just(Value::Null),
            Just(json!(3)),
        ]
    }

    fn call() -> impl Strategy<Value = Value> {
        (prop_oneof![Just(json!(0)), Just(json!(2)), Just(json!(-1)), Just(json!("1")), Just(Value::Null)], text(), text(), text())
            .prop_map(|(index, id, name, arguments)| {
                json!({"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
            })
    }

    fn choice() -> impl Strategy<Value = Value> {
        let finish =
            prop_oneof![Just(Value::Null), Just(json!("stop")), Just(json!("tool_calls")), Just(json!("length"))];
        (text(), proptest::option::of(proptest::collection::vec(call(), 0..3)), finish).prop_map(
            |(content, calls, finish)| {
                let mut delta = json!({"role": "assistant", "content": content});
                if let Some(calls) = calls {
                    delta["tool_calls"] = Value::from(calls);
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            },
        )
    }

    fn usage() -> impl Strategy<Value = Option<Value>> {
        proptest::option::of(prop_oneof![
            Just(Value::Null),
            Just(json!({"prompt_tokens": 7, "completion_tokens": 2})),
            Just(
                json!({"prompt_tokens": 7, "completion_tokens": 2, "completion_tokens_details": {"reasoning_tokens": 1}})
            ),
            Just(json!({"prompt_tokens": 7})),
            Just(json!({"prompt_tokens": 7.5, "completion_tokens": 2})),
        ])
    }

    proptest! {
        /// Whatever chunk an upstream sends, reading it is reading its tree: where the
        /// borrowed reading takes it, the same deltas, usage, id and event; where it does not,
        /// the tree's.
        #[test]
        fn both_readings_agree(
            model in text(),
            id in text(),
            choices in proptest::collection::vec(choice(), 0..3),
            usage in usage(),
            extra in "\\PC{0,8}",
        ) {
            let mut body = json!({"id": id, "object": "chat.completion.chunk", "model": model, "choices": choices, "extra": extra});
            if let Some(usage) = usage {
                body["usage"] = usage;
            }
            let data = serde_json::to_string(&body).unwrap();
            if !agree(&data) {
                let (read, tree) = (chunk(read(&data)), chunk(read_tree(&data)));
                prop_assert_eq!(read.deltas, tree.deltas);
                prop_assert_eq!((read.usage, read.reported, read.id), (tree.usage, tree.reported, tree.id));
            }
        }

        /// Bytes flipped, cut or inserted in a chunk: whatever is read as a chunk is written
        /// back as one JSON object on one data line.
        #[test]
        fn any_chunk_read_is_written_as_one_event(at in 0usize..200, byte in any::<u8>(), cut in 0usize..200, wrap in 0u8..2) {
            let valid = r#"{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#;
            let mut bytes = valid.as_bytes().to_vec();
            match wrap {
                0 => { let i = at % bytes.len(); bytes[i] = byte; }
                _ => bytes.truncate(cut % bytes.len()),
            }
            let Ok(data) = String::from_utf8(bytes) else { return Ok(()) };
            if let Read::Chunk(read) = read(&data) {
                prop_assert!(parsed_event(read.native, "t").is_object());
            }
        }
    }
}
