//! A large Chat Completions body read without a tree of its history (issue 33, "parsing in
//! proportion"). `messages` and `tools` go straight from the body's text into the typed
//! request; only the few other top-level fields become `serde_json` values. Building a tree of
//! a 150 KB agent history (a map node and a key string for every object), copying its text into
//! the typed request and freeing the tree was most of such a request's instructions, and on the
//! same-shape path the tree served nothing: the body is relayed from its text ([`Verbatim`]).
//!
//! Lenient exactly as [`super::typed_of_openai`] is over a tree: a field of the wrong type reads
//! as absent, a message that is not an object as an empty user turn, a repeated key as its last
//! value. The property test `reads_as_the_tree_does` holds the two readings to one result.

use serde::de::{MapAccess, SeqAccess};
use serde_json::{Map, Value};

use crate::exchange::{History, Message, Part, Role, Schema, Tool, ToolList};
use crate::json_read::{self, CheckedSchemas, Each, Lenient, Reader, Schemas, Skip, TREE_ONLY, Text, entries};
use crate::remembered::{self, Shape as Sent};
use crate::verdicts::Memo;

/// What `messages` was, as sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Shape {
    #[default]
    Absent,
    /// Not an array.
    Other,
    /// An array of this many entries.
    Array(usize),
}

impl Shape {
    pub(super) fn of(messages: Option<&Value>) -> Shape {
        match messages {
            None => Shape::Absent,
            Some(Value::Array(messages)) => Shape::Array(messages.len()),
            Some(_) => Shape::Other,
        }
    }
}

/// A body read directly: every top-level field but `messages` and `tools` as values, those two
/// typed.
#[derive(Debug, Default)]
pub(super) struct Read {
    pub fields: Map<String, Value>,
    pub messages: History,
    pub shape: Shape,
    pub tools: ToolList,
    /// Where each top-level key stands ([`crate::verbatim::Verbatim::of_keys`]).
    pub keys: crate::verbatim::Keys,
}

/// The fields [`Read`] holds only typed (and the body's text holds as sent).
pub(super) const TYPED_ONLY: [&str; 2] = ["messages", "tools"];

/// Why a body was not read directly.
#[derive(Debug)]
pub(super) enum Unread {
    Malformed(serde_json::Error),
    /// Only a tree reads it alike: an object keyed by serde_json's raw-value token (which a tree
    /// reads as the JSON in its string), or a tool schema kept as text that a tree would refuse.
    TreeOnly,
}

/// Reads `body`, a JSON object; `passed`: the tenant's tool schemas checked before.
pub(super) fn read(body: &[u8], passed: Option<&CheckedSchemas>) -> Result<Read, Unread> {
    json_read::whole(body, Body { bytes: body, passed })
        .map_err(|e| if e.to_string().starts_with(TREE_ONLY) { Unread::TreeOnly } else { Unread::Malformed(e) })
}

/// A body read with its tenant's memo ([`crate::remembered`], issue 33): a message or a
/// `tools` array whose bytes the tenant sent before is not read, and the history and tools are
/// typed from their spans only if something asks for them; every other field is read from its
/// span as [`read`] reads it. `None`: read the body with [`read`].
pub(super) fn read_known(body: &bytes::Bytes, memo: &Memo) -> Option<Read> {
    let sent = remembered::read(body, memo, &mut Chat)?;
    let shape = Shape::Array(sent.messages.len());
    Some(Read { fields: sent.fields, messages: sent.messages, shape, tools: sent.tools, keys: sent.keys })
}

/// Chat Completions' readers of a body's parts ([`remembered::read`]).
struct Chat;

impl remembered::ShapeReader for Chat {
    const SHAPE: Sent = Sent::ChatCompletions;

    /// A message typed from its span. Every span reads: a value that is no object is an empty user
    /// turn, as in [`read`].
    fn message(span: &[u8]) -> Option<Message> {
        json_read::whole(span, OneMessage).ok().map(SentMessage::typed)
    }

    /// A message read before, typed by a scan where it is a common one ([`read_before`]).
    fn message_read_before(span: &[u8]) -> Option<Message> {
        read_before::message(span).or_else(|| Self::message(span))
    }

    /// One tool of a `tools` array read before, typed from its span as [`Tools`] types it.
    fn tool(span: &[u8]) -> Option<Tool> {
        read_before::tool(span).or_else(|| tool_as_read_first(span))
    }

    fn tools(&mut self, text: &[u8], memo: &Memo) -> Option<remembered::Read<Tool>> {
        let typed = json_read::whole(text, Tools(Schemas::Check(Some(memo.schemas())))).ok()?.unwrap_or_default();
        Some(remembered::Read { typed, remember: true })
    }
}

/// One tool of a `tools` array, typed from its span as [`Tools`] types it.
fn tool_as_read_first(span: &[u8]) -> Option<Tool> {
    let function = json_read::whole(span, OneTool(Schemas::Passed)).ok()??;
    Some(Tool {
        name: function.name?,
        description: function.description.unwrap_or_default(),
        schema: function.parameters.map_or_else(|| Schema::of_value(&super::empty_schema()), Schema::of_raw),
    })
}

mod read_before;

/// The top-level object of the body it holds.
struct Body<'b> {
    bytes: &'b [u8],
    passed: Option<&'b CheckedSchemas>,
}

impl<'de> Reader<'de> for Body<'_> {
    type Out = Read;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Read, A::Error> {
        let mut read = Read::default();
        entries(map, |key, map| {
            read.keys.met(self.bytes, key);
            match key {
                "messages" => {
                    let messages = map.next_value_seed(Lenient(Messages))?;
                    read.shape = messages.as_ref().map_or(Shape::Other, |m| Shape::Array(m.len()));
                    read.messages = messages.unwrap_or_default().into();
                }
                "tools" => {
                    read.tools =
                        map.next_value_seed(Lenient(Tools(Schemas::Check(self.passed))))?.unwrap_or_default().into()
                }
                _ => {
                    read.fields.insert(key.to_string(), map.next_value()?);
                }
            }
            Ok(())
        })?;
        Ok(read)
    }
}

/// `messages`: each entry as a typed message.
struct Messages;

impl<'de> Reader<'de> for Messages {
    type Out = Option<Vec<Message>>;

    fn seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Out, A::Error> {
        let sent = Each(OneMessage).seq(seq)?;
        Ok(sent.map(|all| all.into_iter().map(SentMessage::typed).collect()))
    }
}

/// One Chat Completions message's fields, as sent.
#[derive(Default)]
struct SentMessage {
    role: SentRole,
    content: Option<Vec<Part>>,
    tool_calls: Option<Vec<SentCall>>,
    tool_call_id: Option<String>,
}

impl SentMessage {
    /// As [`super::typed_of_openai`] types a message.
    fn typed(self) -> Message {
        let content = self.content.unwrap_or_default();
        match self.role {
            SentRole::System => Message { role: Role::System, content },
            SentRole::Assistant => {
                let mut parts = content;
                parts.extend(self.tool_calls.into_iter().flatten().map(|call| Part::ToolUse {
                    id: call.id.unwrap_or_default(),
                    name: call.name.unwrap_or_default(),
                    input: call.arguments.unwrap_or_else(|| "{}".into()),
                }));
                Message { role: Role::Assistant, content: parts }
            }
            SentRole::Tool => {
                let content = super::tool_result_text(content);
                let id = self.tool_call_id.unwrap_or_default();
                Message { role: Role::User, content: vec![Part::ToolResult { id, content, is_error: false }] }
            }
            SentRole::User => Message { role: Role::User, content },
        }
    }
}

/// A message's `role`, as far as typing it needs, read without keeping the string.
#[derive(Clone, Copy, Default)]
enum SentRole {
    System,
    Assistant,
    Tool,
    /// `user`, and any role no other variant names or one that is not a string: a user's, as
    /// in [`super::typed_of_openai`].
    #[default]
    User,
}

struct RoleName;

impl<'de> Reader<'de> for RoleName {
    type Out = SentRole;

    fn str(self, role: &str) -> SentRole {
        match role {
            "system" | "developer" => SentRole::System,
            "assistant" => SentRole::Assistant,
            "tool" => SentRole::Tool,
            _ => SentRole::User,
        }
    }
}

#[derive(Clone, Copy)]
struct OneMessage;

impl<'de> Reader<'de> for OneMessage {
    type Out = SentMessage;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<SentMessage, A::Error> {
        let mut message = SentMessage::default();
        entries(map, |key, map| {
            match key {
                "role" => message.role = map.next_value_seed(Lenient(RoleName))?,
                "content" => message.content = Some(map.next_value_seed(SentContent)?),
                "tool_calls" => message.tool_calls = map.next_value_seed(Lenient(Each(OneCall)))?,
                "tool_call_id" => message.tool_call_id = map.next_value_seed(Lenient(Text))?,
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
            Ok(())
        })?;
        Ok(message)
    }
}

/// Where a message's `content` stands: the body, `messages` and the message enclose it.
const CONTENT_REMAINING: u8 = json_read::RECURSION_LIMIT - 3;

/// The same at a part's field: `content` and the part enclose it too.
const PART_FIELD_REMAINING: u8 = CONTENT_REMAINING - 2;

/// A message's `content`, captured: a string kept as sent ([`json_read::kept`]: an agent's tool
/// output is most of its history, and a converted body copies it as it came), anything else
/// read from its text by [`Content`]. Capturing skips the value without serde_json's depth
/// count, so one nested deeper than it may stand in the body goes to the tree reading, as does
/// any failure (the tree's to name).
struct SentContent;

impl<'de> serde::de::DeserializeSeed<'de> for SentContent {
    type Value = Vec<Part>;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Vec<Part>, D::Error> {
        let tree_only = || serde::de::Error::custom(TREE_ONLY);
        let raw = <&'de serde_json::value::RawValue as serde::Deserialize>::deserialize(deserializer)
            .map_err(|_| tree_only())?;
        let text = raw.get().as_bytes();
        if text.starts_with(b"\"") {
            return json_read::kept(raw).map(|text| vec![Part::Text(text)]).ok_or_else(tree_only);
        }
        // A scalar nests nothing (and `value_end` wants a delimiter after one).
        let depth = match text.first() {
            Some(b'[' | b'{') => crate::json_scan::value_end(text, 0).ok_or_else(tree_only)?.depth,
            _ => 0,
        };
        if depth >= usize::from(CONTENT_REMAINING) {
            return Err(tree_only());
        }
        json_read::whole(text, Content).map_err(|_| tree_only())
    }
}

/// Content read from its text: parts (as [`super::parts_of`] reads them), a string (which
/// [`SentContent`] keeps before), nothing for another type.
struct Content;

impl<'de> Reader<'de> for Content {
    type Out = Vec<Part>;

    fn str(self, text: &str) -> Vec<Part> {
        vec![Part::Text(text.into())]
    }

    fn seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Vec<Part>, A::Error> {
        Ok(Each(OnePart).seq(seq)?.into_iter().flatten().flat_map(SentPart::typed).collect())
    }
}

#[derive(Default)]
struct SentPart {
    kind: Option<String>,
    /// As sent ([`json_read::KeptTextOrNone`]).
    text: Option<crate::exchange::Text>,
    image_url: Option<String>,
}

impl SentPart {
    fn typed(self) -> Option<Part> {
        match self.kind.as_deref() {
            Some("text") | None => self.text.map(Part::Text),
            Some("image_url") => self.image_url.as_deref().and_then(super::image_of),
            Some(_) => Some(Part::Opaque {
                kind: self.kind.unwrap_or_default(),
                text: self.text.map(crate::exchange::Text::into_string).unwrap_or_default(),
            }),
        }
    }
}

#[derive(Clone, Copy)]
struct OnePart;

impl<'de> Reader<'de> for OnePart {
    type Out = SentPart;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<SentPart, A::Error> {
        let mut part = SentPart::default();
        entries(map, |key, map| {
            match key {
                "type" => part.kind = map.next_value_seed(Lenient(Text))?,
                "text" => part.text = map.next_value_seed(json_read::KeptTextOrNone(PART_FIELD_REMAINING))?,
                "image_url" => part.image_url = map.next_value_seed(Lenient(Field("url")))?,
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
            Ok(())
        })?;
        Ok(part)
    }
}

/// One string field of an object.
#[derive(Clone, Copy)]
struct Field(&'static str);

impl<'de> Reader<'de> for Field {
    type Out = Option<String>;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Option<String>, A::Error> {
        let mut found = None;
        entries(map, |key, map| {
            if key == self.0 {
                found = map.next_value_seed(Lenient(Text))?;
            } else {
                map.next_value::<Skip>()?;
            }
            Ok(())
        })?;
        Ok(found)
    }
}

/// A tool call an assistant message made.
#[derive(Default)]
struct SentCall {
    id: Option<String>,
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Clone, Copy)]
struct OneCall;

impl<'de> Reader<'de> for OneCall {
    type Out = SentCall;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<SentCall, A::Error> {
        let mut call = SentCall::default();
        entries(map, |key, map| {
            match key {
                "id" => call.id = map.next_value_seed(Lenient(Text))?,
                "function" => {
                    let function = map.next_value_seed(Lenient(Function::Call))?;
                    (call.name, call.arguments) = function.map(|f| (f.name, f.arguments)).unwrap_or_default();
                }
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
            Ok(())
        })?;
        Ok(call)
    }
}

/// A `function` object: a call's (`name`, `arguments`) or a tool's (`name`, `description`,
/// `parameters`).
#[derive(Default)]
struct SentFunction {
    name: Option<String>,
    arguments: Option<String>,
    description: Option<crate::exchange::Text>,
    /// As sent: read as a tree only by a renderer of another shape ([`Schema`]).
    parameters: Option<Box<serde_json::value::RawValue>>,
}

/// A `function` object: `Call`'s (whose `parameters`, no field of a call, are skipped) or
/// `Tool`'s (with the tenant's schemas checked before).
#[derive(Clone, Copy)]
enum Function<'p> {
    Call,
    Tool(Schemas<'p>),
}

/// The depth serde_json has left at a tool's `parameters`: the body, `tools`, the tool and its
/// `function` enclose it.
const PARAMETERS_REMAINING: u8 = json_read::RECURSION_LIMIT - 4;

/// The same at a tool's `description`, a field of the same object.
const DESCRIPTION_REMAINING: u8 = PARAMETERS_REMAINING;

impl<'de> Reader<'de> for Function<'_> {
    type Out = Option<SentFunction>;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Out, A::Error> {
        let mut function = SentFunction::default();
        entries(map, |key, map| {
            match key {
                "name" => function.name = map.next_value_seed(Lenient(Text))?,
                "arguments" => function.arguments = map.next_value_seed(Lenient(Text))?,
                // A tool's only (a call's is no field anyone reads, and it stands deeper in the
                // body than `DESCRIPTION_REMAINING` counts: skipped under serde_json's limit).
                "description" if matches!(self, Function::Tool(_)) => {
                    function.description = map.next_value_seed(json_read::KeptTextOrNone(DESCRIPTION_REMAINING))?
                }
                "parameters" if matches!(self, Function::Tool(_)) => {
                    // Capturing skips the text without serde_json's depth, escape and number
                    // checks, so a malformed schema could fail later than a tree reading fails
                    // and in other words: any failure here is the tree's to name.
                    let raw = map.next_value().map_err(|_: A::Error| serde::de::Error::custom(TREE_ONLY))?;
                    let passed = if let Function::Tool(schemas) = self { schemas } else { Schemas::Check(None) };
                    function.parameters = Some(json_read::checked(raw, PARAMETERS_REMAINING, passed)?);
                }
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
            Ok(())
        })?;
        Ok(Some(function))
    }
}

/// `tools`: each function tool with a name.
struct Tools<'p>(Schemas<'p>);

impl<'de> Reader<'de> for Tools<'_> {
    type Out = Option<Vec<Tool>>;

    fn seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Out, A::Error> {
        let sent = Each(OneTool(self.0)).seq(seq)?;
        Ok(sent.map(|all| {
            all.into_iter()
                .flatten()
                .filter_map(|function| {
                    Some(Tool {
                        name: function.name?,
                        description: function.description.unwrap_or_default(),
                        schema: function
                            .parameters
                            .map_or_else(|| Schema::of_value(&super::empty_schema()), Schema::of_raw),
                    })
                })
                .collect()
        }))
    }
}

#[derive(Clone, Copy)]
struct OneTool<'p>(Schemas<'p>);

impl<'de> Reader<'de> for OneTool<'_> {
    type Out = Option<SentFunction>;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Out, A::Error> {
        let mut function = None;
        entries(map, |key, map| {
            if key == "function" {
                function = map.next_value_seed(Lenient(Function::Tool(self.0)))?;
            } else {
                map.next_value::<Skip>()?;
            }
            Ok(())
        })?;
        Ok(function)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// JSON with repeated keys allowed (serde_json's own values cannot hold them).
    #[derive(Debug, Clone)]
    enum Json {
        Null,
        Bool(bool),
        Number(f64),
        Text(String),
        /// A string token written as some clients write it, with escapes serde_json does not
        /// write (kept as sent, issue 33).
        Raw(&'static str),
        Array(Vec<Json>),
        Object(Vec<(String, Json)>),
    }

    impl Json {
        fn write(&self, out: &mut String) {
            match self {
                Json::Null => out.push_str("null"),
                Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
                Json::Number(n) => out.push_str(&serde_json::to_string(n).unwrap()),
                Json::Text(t) => out.push_str(&serde_json::to_string(t).unwrap()),
                Json::Raw(token) => out.push_str(token),
                Json::Array(all) => {
                    out.push('[');
                    for (i, one) in all.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        one.write(out);
                    }
                    out.push(']');
                }
                Json::Object(fields) => {
                    out.push('{');
                    for (i, (key, value)) in fields.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        if key.contains("\\u") {
                            // Written with an escape, as some clients do.
                            out.push_str(&format!("\"{key}\""));
                        } else {
                            out.push_str(&serde_json::to_string(key).unwrap());
                        }
                        out.push(':');
                        value.write(out);
                    }
                    out.push('}');
                }
            }
        }
    }

    const KEYS: [&str; 16] = [
        "role",
        "content",
        "tool_calls",
        "tool_call_id",
        "type",
        "text",
        "image_url",
        "url",
        "function",
        "name",
        "arguments",
        "description",
        "parameters",
        "id",
        "x",
        "rol\\u0065",
    ];
    const TEXTS: [&str; 14] = [
        "system",
        "developer",
        "assistant",
        "tool",
        "user",
        "text",
        "image_url",
        "input_audio",
        "data:image/png;base64,AAA",
        "https://x.test/y.png",
        "a\nb",
        "é \"q\" \\",
        "",
        "{}",
    ];

    fn json() -> BoxedStrategy<Json> {
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            (-5i32..5).prop_map(|n| Json::Number(f64::from(n) / 2.0)),
            prop::sample::select(&TEXTS[..]).prop_map(|t| Json::Text(t.to_string())),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
                // `rol\u0065` is written with its escape: it reads as `role`.
                prop::collection::vec((prop::sample::select(&KEYS[..]), inner), 0..6)
                    .prop_map(|fields| Json::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
            ]
        })
        .boxed()
    }

    /// An object with some of `fields` (each value as given, or any JSON), now and then a key
    /// repeated with another value.
    fn object(fields: Vec<(&'static str, BoxedStrategy<Json>)>) -> BoxedStrategy<Json> {
        let each: Vec<_> = fields
            .into_iter()
            .map(|(key, value)| {
                prop::option::weighted(0.75, prop_oneof![6 => value, 1 => json()])
                    .prop_map(move |value| value.map(|value| (key.to_string(), value)))
            })
            .collect();
        (each, prop::bool::weighted(0.15), json())
            .prop_map(|(fields, repeat, other)| {
                let mut fields: Vec<_> = fields.into_iter().flatten().collect();
                if let Some((key, _)) = fields.first().filter(|_| repeat).cloned() {
                    fields.push((key, other));
                }
                Json::Object(fields)
            })
            .boxed()
    }

    fn one_of(texts: &'static [&'static str]) -> BoxedStrategy<Json> {
        prop::sample::select(texts).prop_map(|t| Json::Text(t.to_string())).boxed()
    }

    fn text() -> BoxedStrategy<Json> {
        prop_oneof![
            6 => one_of(&TEXTS),
            1 => prop::sample::select(&[r#""x\/y \u00e9\t""#, r#""\ud83d\ude00 pair""#, r#""\u0000 nul \b\f""#][..])
                .prop_map(Json::Raw),
        ]
        .boxed()
    }

    fn array(of: BoxedStrategy<Json>) -> BoxedStrategy<Json> {
        prop_oneof![8 => prop::collection::vec(of, 0..5).prop_map(Json::Array), 1 => json()].boxed()
    }

    /// Mostly message-shaped: roles, content as text or parts, tool calls.
    fn messages() -> BoxedStrategy<Json> {
        const ROLES: [&str; 6] = ["system", "developer", "assistant", "tool", "user", "other"];
        let url = object(vec![("url", one_of(&["data:image/png;base64,AAA", "https://x.test/y.png", "ftp://x"]))]);
        let part =
            object(vec![("type", one_of(&["text", "image_url", "input_audio"])), ("text", text()), ("image_url", url)]);
        let function = object(vec![("name", text()), ("arguments", text())]);
        let call = object(vec![("id", text()), ("function", function), ("type", text())]);
        array(object(vec![
            ("role", one_of(&ROLES)),
            ("content", prop_oneof![text(), array(part)].boxed()),
            ("tool_calls", array(call)),
            ("tool_call_id", text()),
            // Written with its escape: it reads as `role`.
            ("rol\\u0065", one_of(&ROLES)),
        ]))
    }

    fn tools() -> BoxedStrategy<Json> {
        let function = object(vec![("name", text()), ("description", text()), ("parameters", json())]);
        array(object(vec![("type", text()), ("function", function)]))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Read directly or as a tree, a body gives the same typed request, the same `messages`
        /// shape and the same upstream body.
        #[test]
        fn reads_as_the_tree_does(messages in messages(), tools in tools(), pretty in any::<bool>()) {
            let mut body = String::from(if pretty { "{ \"model\": \"m\",\n \"temperature\": 0.5, " } else { "{\"model\":\"m\"," });
            body.push_str("\"messages\": ");
            messages.write(&mut body);
            body.push_str(", \"tools\" :");
            tools.write(&mut body);
            body.push_str(&format!(", \"pad\": \"{}\" }}", "p".repeat(crate::verbatim::WORTH_IT)));

            let Ok(read) = read(body.as_bytes(), None) else { panic!("unread") };
            let Value::Object(tree) = serde_json::from_str::<Value>(&body).unwrap() else { unreachable!() };
            prop_assert_eq!(read.shape, Shape::of(tree.get("messages")));
            let direct = super::super::typed(&read.fields, read.messages, read.tools);
            prop_assert_eq!(&direct, &super::super::typed_of_openai(&tree));
            // Read again with the tenant's checked schemas, twice: walked and remembered, then
            // taken from the memo; the same request either way.
            let passed = CheckedSchemas::default();
            for _ in 0..2 {
                let Ok(again) = super::read(body.as_bytes(), Some(&passed)) else { panic!("unread") };
                prop_assert_eq!(&super::super::typed(&again.fields, again.messages, again.tools), &direct);
            }

            // Read with the tenant's memo, twice: each message read and remembered, then known
            // by its bytes and not read; the same request either way, and the same guardrail
            // units and characters before anything types the history.
            let memo = crate::verdicts::Verdicts::default().of("tenant");
            let shared = bytes::Bytes::copy_from_slice(body.as_bytes());
            for turn in 0..2 {
                let Some(known) = read_known(&shared, &memo) else {
                    prop_assert!(!matches!(read.shape, Shape::Array(_)), "an array of messages not read by its spans");
                    break;
                };
                prop_assert_eq!(known.shape, read.shape);
                prop_assert_eq!(known.messages.sent().map(|sent| sent.spans.len()), Some(direct.messages.len()));
                let lazy = super::super::typed(&known.fields, known.messages, known.tools);
                prop_assert_eq!(lazy.prompt_chars(), direct.prompt_chars(), "turn {}", turn);
                let hashes = |request| crate::verdicts::units(request).iter().map(|unit| memo.text_hash(unit)).collect::<Vec<_>>();
                prop_assert_eq!(hashes(&lazy), hashes(&direct));
                prop_assert_eq!(lazy.tools.len(), direct.tools.len());
                prop_assert_eq!(lazy.messages.turns(), direct.messages.turns());
                prop_assert!(lazy.messages.sent().is_some() && !lazy.messages.is_typed(), "nothing typed the history");
                prop_assert!(turn == 0 || !matches!(tools, Json::Array(_)) || lazy.tools.sent().is_some(), "nor the tools, known");
                prop_assert_eq!(&lazy, &direct);
            }
            let remembered = super::super::ChatRequest::parse_remembering(&shared, Some(&memo)).unwrap();
            prop_assert_eq!(remembered.exchange.as_ref(), &direct);

            let request = super::super::ChatRequest::parse(body.as_bytes()).unwrap();
            prop_assert!(request.openai_fields().is_some_and(|f| !f.contains_key("messages")), "read directly");
            prop_assert_eq!(request.exchange.as_ref(), &direct);
            let relayed: Value = serde_json::from_slice(&request.upstream_body("t", None, true, &[]).unwrap().to_vec()).unwrap();
            let mut changed = request.clone();
            if let super::super::Origin::OpenAi(sent) = &mut changed.origin {
                let every = std::sync::Arc::make_mut(sent).fields_mut().clone();
                prop_assert_eq!(every, tree.clone());
            }
            let from_tree: Value = serde_json::from_slice(&changed.upstream_body("t", None, true, &[]).unwrap().to_vec()).unwrap();
            prop_assert_eq!(relayed, from_tree);
        }
    }

    /// A history known by its spans is judged as its typed reading is, whichever detectors run
    /// (a detector switched on reads the texts, typing the history then), and a message edited
    /// in place is read again.
    #[test]
    fn a_known_history_is_judged_as_the_typed_one() {
        use crate::guardrails::{Detector, GuardrailPolicy, Mode};
        let body = |tool_output: &str| {
            let messages = serde_json::json!([
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": [{"type": "text", "text": "mail "}, {"type": "text", "text": "jane@example.com"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": tool_output},
            ]);
            let body = serde_json::json!({"model": "m", "messages": messages, "pad": "p".repeat(4096)}).to_string();
            bytes::Bytes::from(body)
        };
        let policy = |pii, secrets| GuardrailPolicy {
            pii_detection: Detector { mode: pii },
            secrets_detection: Detector { mode: secrets },
            ..Default::default()
        };
        let memo = crate::verdicts::Verdicts::default().of("tenant");
        for output in ["clean output", "key sk-proj-abcdefghijklmnopqrstuvwxyz012345"] {
            let sent = body(output);
            let typed = super::super::ChatRequest::parse(&sent).unwrap();
            for policy in
                [policy(Mode::Monitor, Mode::Off), policy(Mode::Off, Mode::Block), policy(Mode::Warn, Mode::Monitor)]
            {
                let want = policy.check_request(&typed.exchange, None);
                for _ in 0..2 {
                    let known = super::super::ChatRequest::parse_remembering(&sent, Some(&memo)).unwrap();
                    assert!(known.exchange.messages.sent().is_some());
                    assert_eq!(policy.check_request(&known.exchange, Some(&memo)), want, "{output}");
                    assert_eq!(known.exchange.prompt_chars(), typed.exchange.prompt_chars());
                    // A message new on this turn is typed alone for its scan, not the history.
                    assert!(!known.exchange.messages.is_typed());
                }
            }
        }
    }

    /// A `tools` array the tenant sent before is found by its length and the hash of that many
    /// bytes, not scanned: wherever it stands in the body, it reads as the same tools. Another
    /// array of the same length is not taken for it, and bytes after it that are no JSON make
    /// the body refused as without the memo.
    #[test]
    fn a_known_tools_array_is_found_by_its_length_not_scanned() {
        let tool = |description: &str| {
            serde_json::json!({"type": "function", "function": {"name": "Read", "description": description,
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}})
        };
        let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
        let pad = "p".repeat(crate::verbatim::WORTH_IT);
        let first = serde_json::json!([tool("Reads a file."), tool("Lists a dir.")]).to_string();
        let same_length = serde_json::json!([tool("Reads a file."), tool("Lists a DIR.")]).to_string();
        assert_eq!(first.len(), same_length.len());
        let body = |tools: &str, tools_first: bool| {
            let body = if tools_first {
                format!(r#"{{"model":"m","tools":{tools},"messages":{messages},"pad":"{pad}"}}"#)
            } else {
                format!(r#"{{"model":"m","messages":{messages},"pad":"{pad}","tools":{tools}}}"#)
            };
            bytes::Bytes::from(body)
        };
        let memo = crate::verdicts::Verdicts::default().of("tenant");
        let typed = |sent: &bytes::Bytes| super::super::ChatRequest::parse(sent).unwrap().exchange.as_ref().clone();
        let remembered = |sent: &bytes::Bytes| super::super::ChatRequest::parse_remembering(sent, Some(&memo));
        let sent = body(&first, false);
        assert!(remembered(&sent).unwrap().exchange.tools.sent().is_none(), "read, then remembered");
        assert_eq!(memo.tools_lengths()[0], first.len());
        for (tools, tools_first) in [(&first, true), (&first, false), (&same_length, true), (&first, true)] {
            let sent = body(tools, tools_first);
            let known = remembered(&sent).unwrap();
            let whole = known.exchange.tools.sent().is_some_and(|sent| sent.spans.len() == 1 && sent.len == 2);
            assert_eq!(whole, tools == &first, "known by its length: {tools}");
            assert_eq!(known.exchange.tools.is_typed(), tools != &first, "typed only when read: {tools}");
            assert_eq!(known.exchange.as_ref(), &typed(&sent), "{tools}");
        }
        let broken =
            bytes::Bytes::from(format!(r#"{{"model":"m","tools":{first}],"messages":{messages},"pad":"{pad}"}}"#));
        let refused =
            |read: Result<super::super::ChatRequest, super::super::BadRequest>| read.err().map(|e| e.to_string());
        assert_eq!(refused(remembered(&broken)), refused(super::super::ChatRequest::parse(&broken)));
        assert!(refused(remembered(&broken)).is_some());
    }

    #[test]
    fn a_raw_value_key_is_read_as_a_tree_reads_it() {
        const TOKEN: &str = "$serde_json::private::RawValue";
        let parse = |messages: Value| {
            let body = serde_json::json!({"model": "m", "messages": messages, "pad": "p".repeat(4096)}).to_string();
            let tree = serde_json::from_str::<Value>(&body);
            let request = super::super::ChatRequest::parse(body.as_bytes());
            assert_eq!(request.is_ok(), tree.is_ok(), "{body:.200}");
            request.ok()
        };
        let hidden = serde_json::json!({"role": "user", "content": "AKIA in hiding"}).to_string();
        let request = parse(serde_json::json!([{TOKEN: hidden}])).unwrap();
        assert_eq!(request.prompt_text(), "AKIA in hiding\n", "the guardrails read what a serde_json server would");
        // Wherever the object stands: as content, as a role, as `messages` itself.
        let request = parse(serde_json::json!([{"role": "user", "content": {TOKEN: "\"AKIA deeper\""}}])).unwrap();
        assert_eq!(request.prompt_text(), "AKIA deeper\n");
        let request = parse(serde_json::json!([{"role": {TOKEN: "\"assistant\""}, "content": "x"}])).unwrap();
        assert_eq!(request.exchange.messages[0].role, Role::Assistant);
        let request = parse(serde_json::json!({TOKEN: r#"[{"role": "user", "content": "hi"}]"#})).unwrap();
        assert!(request.check_routable().is_ok());
        // What a tree refuses is refused: a value that is not JSON text, or another key beside it.
        assert!(parse(serde_json::json!([{"role": "user", "content": "hi", "x": {TOKEN: "nope"}}])).is_none());
        assert!(parse(serde_json::json!([{"role": "user", "content": "hi", "x": {TOKEN: "1", "y": 2}}])).is_none());
    }

    #[test]
    fn nesting_is_refused_past_the_tree_s_recursion_limit_wherever_it_is() {
        let parse = |depth: usize, at: &str| {
            let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
            let body = match at {
                "message" => format!(r#"{{"model": "m", "messages": {nested}, "pad": "{}"}}"#, "p".repeat(4096)),
                "ignored" => format!(
                    r#"{{"model": "m", "messages": [{{"role": "user", "x": {nested}}}], "pad": "{}"}}"#,
                    "p".repeat(4096)
                ),
                // A tool's description, kept as sent when it is a string (issue 33), and a
                // call's, which no one reads: deeper in the body than a tool's.
                "description" => format!(
                    r#"{{"model": "m", "tools": [{{"type": "function", "function": {{"name": "f", "description": {nested}}}}}], "pad": "{}"}}"#,
                    "p".repeat(4096)
                ),
                "call description" => format!(
                    r#"{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}, {{"role": "assistant", "content": null, "tool_calls": [{{"id": "c", "type": "function", "function": {{"name": "f", "arguments": "{{}}", "description": {nested}}}}}]}}], "pad": "{}"}}"#,
                    "p".repeat(4096)
                ),
                // A message's content, captured and read from its text (issue 33), and a part's
                // text within it.
                "content" => format!(
                    r#"{{"model": "m", "messages": [{{"role": "user", "content": {nested}}}], "pad": "{}"}}"#,
                    "p".repeat(4096)
                ),
                "part text" => format!(
                    r#"{{"model": "m", "messages": [{{"role": "user", "content": [{{"type": "text", "text": {nested}}}]}}], "pad": "{}"}}"#,
                    "p".repeat(4096)
                ),
                _ => format!(r#"{{"model": "m", "tools": [{{"function": {nested}}}], "pad": "{}"}}"#, "p".repeat(4096)),
            };
            let tree = serde_json::from_str::<Value>(&body).is_ok();
            let direct = super::super::ChatRequest::parse(body.as_bytes());
            assert_eq!(direct.is_ok(), tree, "depth {depth} in {at}: {:?}", direct.err());
            // With a tenant's memo, twice (read, then known by its bytes): spans read alone nest
            // less deeply than in the body, and are refused alike all the same.
            let (memo, shared) = (crate::verdicts::Verdicts::default().of("t"), bytes::Bytes::from(body.clone()));
            for _ in 0..2 {
                let known = super::super::ChatRequest::parse_remembering(&shared, Some(&memo));
                assert_eq!(known.as_ref().err(), direct.as_ref().err(), "depth {depth} in {at}, with the memo");
            }
            direct.err().map(|e| e.0)
        };
        for at in ["message", "ignored", "tool", "description", "call description", "content", "part text"] {
            assert_eq!(parse(100, at), None);
            let refused = parse(100_000, at).unwrap();
            assert!(refused.contains("recursion limit"), "{refused}");
            for depth in 120..=130 {
                parse(depth, at);
            }
        }
    }

    /// A tool's `parameters` are kept as their text, never a tree (issue 33); what a tree
    /// reading refuses in them (a lone surrogate, a number out of range, nesting past the
    /// recursion limit counted from the body's root) is still refused with the tree's words,
    /// and a call's `parameters` (no field of a call) are skipped under the same limit.
    #[test]
    fn a_schema_kept_as_text_is_refused_where_a_tree_refuses_it() {
        let pad = "p".repeat(4096);
        let tool = |schema: &str| {
            format!(
                r#"{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "pad": "{pad}",
                "tools": [{{"type": "function", "function": {{"name": "f", "parameters": {schema}}}}}]}}"#
            )
        };
        let call = |schema: &str| {
            format!(
                r#"{{"model": "m", "pad": "{pad}", "messages": [{{"role": "assistant", "content": null,
                "tool_calls": [{{"id": "c", "type": "function", "function": {{"name": "f", "arguments": "{{}}", "parameters": {schema}}}}}]}}]}}"#
            )
        };
        let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let mut cases: Vec<(String, String)> = vec![
            ("a lone surrogate".into(), r#"{"type": "object", "description": "\ud800"}"#.into()),
            ("a number out of range".into(), r#"{"type": "object", "maximum": 1e999}"#.into()),
            ("the raw-value token".into(), r#"{"$serde_json::private::RawValue": "{}"}"#.into()),
            // Malformed: refused in the tree's words (review: the capture met these first).
            ("a trailing comma".into(), r#"{"a": [1,]}"#.into()),
            ("a trailing comma in an object".into(), r#"{"a": 1,}"#.into()),
            ("a control character".into(), "{\"a\": \"\u{1}\"}".into()),
            ("a lone surrogate, then a syntax error".into(), r#"{"a": "\ud800", "b": 1,}"#.into()),
            ("a number out of range, then a syntax error".into(), r#"{"a": 1e999 "b"}"#.into()),
            ("deep, then truncated".into(), format!("{}1", "[".repeat(200))),
        ];
        for depth in 118..=128 {
            cases.push((format!("nested {depth}"), nested(depth)));
        }
        let (mut tools, mut calls) = (0, 0);
        for (case, schema) in &cases {
            for (at, body) in [("tool", tool(schema)), ("call", call(schema))] {
                let tree = serde_json::from_str::<Value>(&body);
                let direct = super::super::ChatRequest::parse(body.as_bytes());
                match (&direct, &tree) {
                    (Ok(direct), Ok(Value::Object(tree))) => {
                        assert_eq!(&*direct.exchange, &super::super::typed_of_openai(tree), "{case} in a {at}");
                        *if at == "tool" { &mut tools } else { &mut calls } += 1;
                    }
                    (Err(refused), Err(tree)) => {
                        assert_eq!(refused.0, format!("malformed JSON body: {tree}"), "{case}")
                    }
                    _ => panic!("{case} in a {at}: direct {:?}, tree {:?}", direct.as_ref().err(), tree.err()),
                }
            }
        }
        // Four levels enclose a tool's parameters, six a call's: the tree accepts nesting to 123
        // and 121; it also reads the raw-value token (as the JSON in its string), and so does
        // the direct reading, by handing such a body to the tree.
        assert_eq!((tools, calls), (7, 5));
        let schema =
            r#"{"type": "object", "properties": {"path": {"type": "string", "description": "a \"quoted\" π"}}}"#;
        let request = super::super::ChatRequest::parse(tool(schema).as_bytes()).unwrap();
        assert_eq!(request.exchange.tools[0].schema.text(), schema, "kept as sent");
    }

    /// A large body is checked as UTF-8 once and read as text; one that is not UTF-8 is read as
    /// bytes and refused in serde_json's words, wherever the bad byte stands.
    #[test]
    fn a_large_body_that_is_not_utf8_is_refused_in_serde_json_s_words() {
        let good =
            format!(r#"{{"model": "m", "messages": [{{"role": "user", "content": "π ✓ {}"}}]}}"#, "x".repeat(3000));
        let read = super::super::ChatRequest::parse(good.as_bytes()).unwrap();
        assert!(read.prompt_text().starts_with("π ✓ x"));
        for at in [40, 3000, good.len() - 4] {
            let mut bad = good.clone().into_bytes();
            bad[at] = 0xff;
            let tree = serde_json::from_slice::<Value>(&bad).unwrap_err();
            let refused = super::super::ChatRequest::parse(&bad).err().map(|e| e.0);
            assert_eq!(refused, Some(format!("malformed JSON body: {tree}")), "a bad byte at {at}");
        }
    }

    /// A large body that is JSON but no object is refused as such, as a small one is (review:
    /// the reader met no key, and an empty object's spans were found for it).
    #[test]
    fn a_large_body_that_is_no_object_is_refused_as_one() {
        for body in [
            format!(r#"["{}"]"#, "x".repeat(3000)),
            format!(r#""{}""#, "x".repeat(3000)),
            format!("null{}", " ".repeat(3000)),
        ] {
            let refused = super::super::ChatRequest::parse(body.as_bytes()).err().map(|e| e.0);
            assert_eq!(refused.as_deref(), Some("the body must be a JSON object"), "{body:.20}");
        }
    }

    #[test]
    fn a_malformed_large_body_is_refused_with_serde_json_s_reason() {
        let body = format!(r#"{{"model": "m", "messages": [{{"role": "user", "content": "{}"]}}"#, "x".repeat(4096));
        let Err(refused) = super::super::ChatRequest::parse(body.as_bytes()) else { panic!("accepted") };
        assert!(refused.0.starts_with("malformed JSON body: "), "{refused}");
        let trailing = format!(r#"{{"model": "m", "messages": [], "pad": "{}"}} x"#, "x".repeat(4096));
        assert!(super::super::ChatRequest::parse(trailing.as_bytes()).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// A message the first reading typed is typed alike by a scan when it is typed again,
        /// or left to that reading.
        #[test]
        fn a_message_read_before_types_as_its_first_reading(messages in messages()) {
            use remembered::ShapeReader;
            let Json::Array(all) = messages else { return Ok(()) };
            for one in all {
                let mut span = String::new();
                one.write(&mut span);
                let Some(first) = Chat::message(span.as_bytes()) else { continue };
                if let Some(again) = read_before::message(span.as_bytes()) {
                    prop_assert_eq!(format!("{again:?}"), format!("{first:?}"), "{}", span);
                }
                prop_assert_eq!(Chat::message_read_before(span.as_bytes()), Some(first));
            }
        }

        /// A tool read before is typed by a scan as it was typed then (its schema's text as
        /// sent), or left to that reading.
        #[test]
        fn a_tool_read_before_types_as_its_first_reading(tools in tools()) {
            use remembered::ShapeReader;
            let Json::Array(all) = tools else { return Ok(()) };
            for one in all {
                let mut span = String::new();
                one.write(&mut span);
                let Some(first) = tool_as_read_first(span.as_bytes()) else { continue };
                if let Some(again) = read_before::tool(span.as_bytes()) {
                    prop_assert_eq!((&again.name, &again.description), (&first.name, &first.description), "{}", span);
                    prop_assert_eq!(again.schema.text(), first.schema.text(), "{}", span);
                }
                let by_trait = Chat::tool(span.as_bytes()).map(|tool| tool.schema.text().to_string());
                prop_assert_eq!(by_trait, Some(first.schema.text().to_string()));
            }
        }
    }

    /// An OpenAI-shaped agent's messages (text, tool calls, a tool's result as a string or as
    /// text parts) are typed by the scan, as the first reading types them.
    #[test]
    fn an_agent_s_messages_read_before_are_typed_by_a_scan() {
        use remembered::ShapeReader;
        let messages = serde_json::json!([
            {"role": "system", "content": "You are an agent.\nBe brief."},
            {"role": "user", "content": [{"type": "text", "text": "fix \"it\""}, {"type": "text", "text": "now"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.rs\nb.rs\n"},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"role": "developer", "content": "be careful"},
        ]);
        for message in messages.as_array().unwrap() {
            let span = message.to_string();
            let first = Chat::message(span.as_bytes()).unwrap();
            let again = read_before::message(span.as_bytes()).expect("typed by the scan");
            assert_eq!(format!("{again:?}"), format!("{first:?}"), "{span}");
        }
        let tool = serde_json::json!({"type": "function", "function": {"name": "Bash", "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}});
        let span = tool.to_string();
        let again = read_before::tool(span.as_bytes()).expect("typed by the scan");
        assert_eq!(again.schema.text(), tool["function"]["parameters"].to_string());
        assert_eq!(Some(again), tool_as_read_first(span.as_bytes()));
    }
}
