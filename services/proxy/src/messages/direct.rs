//! A large Messages body read without a tree of its history (issue 33, "parsing in
//! proportion"): `messages`, `system` and `tools` go straight from the body's text into the
//! typed request; only the other top-level fields become `serde_json` values. Claude Code
//! resends a 150 KB conversation every turn; building a tree of it, copying its strings into the
//! typed request and freeing the tree was most of such a request's cost, and on the same-shape
//! path the tree served nothing (the body is relayed from its text).
//!
//! Only the common, well-formed body is read here: anything the tree reading would refuse
//! (with its own error text), or that needs the tree (content only Anthropic reads, which is
//! kept whole as an opaque part; an image without a usable source; a value of a type no
//! request has), makes [`read`] answer `None`, and the body is read as a tree. So this reading
//! never decides an error, and where it answers it answers as the tree reading does (the
//! property test `reads_as_the_tree_does`).

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use shield_core::chat_request::MAX_MESSAGES;
use shield_core::exchange::{self, History, Message, Part, Role, Schema, SystemPrompt, Tool, ToolList};
use shield_core::json_read::{self, CheckedSchemas, Each, KeptText, Lenient, Reader, Schemas, Skip, Text, entries};
use shield_core::remembered::{self, Shape};
use shield_core::verdicts::Memo;

/// A body read directly: every top-level field but `messages`, `system` and `tools` as values,
/// those three typed.
#[derive(Debug, Default)]
pub(super) struct Read {
    pub fields: Map<String, Value>,
    pub system: SystemPrompt,
    pub messages: History,
    pub system_messages: bool,
    pub tools: ToolList,
    /// `tools ({kind})` for each server tool, in order.
    pub server_tools: Vec<String>,
    /// Where each top-level key stands ([`shield_core::verbatim::Verbatim::of_keys`]).
    pub keys: shield_core::verbatim::Keys,
}

/// The error that sends a body to the tree reading.
const AS_A_TREE: &str = "shield: read as a tree";

fn as_a_tree<E: serde::de::Error>() -> E {
    E::custom(AS_A_TREE)
}

/// Reads `body`, a JSON object; `None`: read it as a tree. `passed`: the tenant's tool schemas
/// checked before.
pub(super) fn read(body: &[u8], passed: Option<&CheckedSchemas>) -> Option<Read> {
    let read = json_read::whole(body, Body { bytes: body, passed }).ok()??;
    (1..=MAX_MESSAGES).contains(&read.messages.len()).then_some(read)
}

/// A body read with its tenant's memo (`shield_core::remembered`, issue 33): a message or a
/// `tools` array whose bytes the tenant sent before is not read, and the history and tools are
/// typed from their spans only if something asks for them; every other field is read from its
/// span as [`read`] reads it. `None`: read the body with [`read`].
pub(super) fn read_known(body: &bytes::Bytes, memo: &Memo) -> Option<Read> {
    let mut shape = MessagesShape::default();
    let sent = remembered::read(body, memo, &mut shape)?;
    (1..=MAX_MESSAGES).contains(&sent.messages.len()).then_some(())?;
    Some(Read {
        fields: sent.fields,
        system: sent.system,
        system_messages: sent.messages.last_turn(Role::System).is_some(),
        messages: sent.messages,
        tools: sent.tools,
        server_tools: shape.server_tools,
        keys: sent.keys,
    })
}

/// Messages' readers of a body's parts ([`remembered::read`]), and what they found besides.
#[derive(Default)]
struct MessagesShape {
    server_tools: Vec<String>,
}

impl remembered::ShapeReader for MessagesShape {
    const SHAPE: Shape = Shape::Messages;

    /// A message typed from its span (`None`: one the tree reading reads).
    fn message(span: &[u8]) -> Option<Message> {
        json_read::whole(span, OneMessage).ok()?.map(|Typed(message)| message)
    }

    /// A message read before, typed by a scan where it is a common one ([`read_before`]).
    fn message_read_before(span: &[u8]) -> Option<Message> {
        read_before::message(span).or_else(|| Self::message(span))
    }

    /// One tool of a `tools` array this tenant sent before (with no server tools), from its span.
    fn tool(span: &[u8]) -> Option<Tool> {
        read_before::tool(span).or_else(|| tool_as_read_first(span))
    }

    fn tools(&mut self, text: &[u8], memo: &Memo) -> Option<remembered::Read<Tool>> {
        let sent = json_read::whole(text, Each(OneTool(Schemas::Check(Some(memo.schemas()))))).ok()?;
        let mut typed = Vec::new();
        tools_in(sent.into_iter().flatten(), &mut typed, &mut self.server_tools);
        // Server tools are named to the caller on every request: such a list is read.
        Some(remembered::Read { typed, remember: self.server_tools.is_empty() })
    }

    const HAS_SYSTEM: bool = true;

    fn system_text(span: &[u8]) -> Option<Option<exchange::Text>> {
        json_read::kept_span(span).map(Some)
    }

    fn system_block(span: &[u8]) -> Option<Option<exchange::Text>> {
        json_read::whole(span, TextOf).ok()
    }

    fn system_block_read_before(span: &[u8]) -> Option<Option<exchange::Text>> {
        read_before::system_block(span).or_else(|| Self::system_block(span))
    }
}

/// One tool of a `tools` array this tenant sent before, read as [`OneTool`] read it then.
fn tool_as_read_first(span: &[u8]) -> Option<Tool> {
    let mut tools = Vec::with_capacity(1);
    tools_in([json_read::whole(span, OneTool(Schemas::Passed)).ok()?], &mut tools, &mut Vec::new());
    tools.pop()
}

/// The tools of a `tools` array as sent, and its server tools named.
fn tools_in(sent: impl IntoIterator<Item = SentTool>, tools: &mut Vec<Tool>, server_tools: &mut Vec<String>) {
    for tool in sent {
        match tool.kind.as_deref() {
            None | Some("custom") => tools.push(Tool {
                name: tool.name.unwrap_or_default(),
                description: tool.description.unwrap_or_default(),
                schema: tool.schema.map_or_else(no_schema, Schema::of_raw),
            }),
            Some(kind) => server_tools.push(format!("tools ({kind})")),
        }
    }
}

/// The top-level object of the body it holds (`None`: not an object, or no `messages` array).
struct Body<'b> {
    bytes: &'b [u8],
    passed: Option<&'b CheckedSchemas>,
}

impl<'de> Reader<'de> for Body<'_> {
    type Out = Option<Read>;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Option<Read>, A::Error> {
        let mut read = Read::default();
        let mut messages = None;
        entries(map, |key, map| {
            read.keys.met(self.bytes, key);
            match key {
                "messages" => {
                    let sent = map.next_value_seed(Lenient(Each(OneMessage)))?.ok_or_else(as_a_tree)?;
                    messages = Some(sent.into_iter().collect::<Option<Vec<Typed>>>().ok_or_else(as_a_tree)?);
                }
                "system" => {
                    let mut system = map.next_value_seed(Lenient(System))?.ok_or_else(as_a_tree)?;
                    // Empty system parts are dropped, as the tree reading drops them.
                    system.retain(|part| !part.is_empty());
                    read.system = system.into();
                }
                "tools" => {
                    let sent = map.next_value_seed(Lenient(Each(OneTool(Schemas::Check(self.passed)))))?;
                    let mut tools = Vec::new();
                    tools_in(sent.into_iter().flatten(), &mut tools, &mut read.server_tools);
                    read.tools = tools.into();
                }
                _ => {
                    read.fields.insert(key.to_string(), map.next_value()?);
                }
            }
            Ok(())
        })?;
        let Some(messages) = messages else { return Ok(None) };
        read.system_messages = messages.iter().any(|typed| typed.0.role == Role::System);
        read.messages = messages.into_iter().map(|typed| typed.0).collect::<Vec<_>>().into();
        Ok(Some(read))
    }
}

/// `system`: a string, or the texts of its blocks; `null` is none (`None`: another type).
struct System;

impl<'de> Reader<'de> for System {
    type Out = Option<Vec<exchange::Text>>;

    fn str(self, text: &str) -> Self::Out {
        Some(vec![text.into()])
    }

    fn seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Out, A::Error> {
        Ok(Each(TextOf).seq(seq)?.map(|texts| texts.into_iter().flatten().collect()))
    }

    fn null(self) -> Self::Out {
        Some(Vec::new())
    }
}

/// A block's `text`, kept as sent ([`KeptText`]; a block of another type has none, and a `text`
/// that is not a string is left to the tree reading).
#[derive(Clone, Copy)]
struct TextOf;

impl<'de> Reader<'de> for TextOf {
    type Out = Option<exchange::Text>;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Option<exchange::Text>, A::Error> {
        let mut text = None;
        entries(map, |key, map| {
            if key == "text" {
                text = Some(map.next_value_seed(KeptText)?);
            } else {
                map.next_value::<Skip>()?;
            }
            Ok(())
        })?;
        Ok(text)
    }
}

/// A message, typed.
struct Typed(Message);

/// One message (`None`: anything the tree reading refuses or reads as a tree only).
#[derive(Clone, Copy)]
struct OneMessage;

impl<'de> Reader<'de> for OneMessage {
    type Out = Option<Typed>;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Option<Typed>, A::Error> {
        let (mut role, mut content) = (None, None);
        entries(map, |key, map| {
            match key {
                "role" => role = map.next_value_seed(Lenient(Text))?,
                "content" => content = Some(map.next_value_seed(Lenient(Content))?),
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
            Ok(())
        })?;
        let Some(Some(blocks)) = content else { return Ok(None) };
        let Some(message) = typed_message(role.as_deref(), blocks) else { return Ok(None) };
        Ok(Some(Typed(message)))
    }
}

/// A message of `role` holding `blocks` (`None`: a role or a block kind only the tree reading
/// types); also the scan's ([`read_before`]).
fn typed_message(role: Option<&str>, blocks: Vec<Block>) -> Option<Message> {
    Some(match role? {
        // Mid-conversation system messages (Claude Code's reminders): their texts.
        "system" => Message {
            role: Role::System,
            content: blocks.into_iter().filter_map(|block| block.text).map(Part::Text).collect(),
        },
        sent @ ("user" | "assistant") => {
            let role = if sent == "user" { Role::User } else { Role::Assistant };
            Message { role, content: blocks.into_iter().map(Block::typed).collect::<Option<Vec<Part>>>()? }
        }
        _ => return None,
    })
}

/// A tool's schema when it gives none.
fn no_schema() -> Schema {
    Schema::of_value(&serde_json::json!({"type": "object"}))
}

/// Content: a string (one text block), or blocks that each have a string `type` (`None`:
/// anything else).
struct Content;

impl<'de> Reader<'de> for Content {
    type Out = Option<Vec<Block>>;

    fn str(self, text: &str) -> Self::Out {
        Some(vec![Block { kind: Some(Kind::Text), text: Some(text.into()), ..Block::default() }])
    }

    fn seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Out, A::Error> {
        let blocks = Each(OneBlock).seq(seq)?;
        Ok(blocks.filter(|blocks| blocks.iter().all(|block| block.kind.is_some())))
    }
}

/// One content block's fields, as sent: each the last string (or value) given for its key, as
/// a map keeps it.
#[derive(Debug, Default)]
struct Block {
    kind: Option<Kind>,
    text: Option<exchange::Text>,
    id: Option<String>,
    name: Option<String>,
    input: Option<Value>,
    tool_use_id: Option<String>,
    content: Option<exchange::Text>,
    is_error: Option<bool>,
    thinking: Option<String>,
    signature: Option<String>,
    data: Option<String>,
    source: Option<Value>,
}

impl Block {
    /// As the tree reading types a block (`messages::request::part_of`); `None` for the kinds
    /// it keeps opaque, which need the whole block.
    fn typed(self) -> Option<Part> {
        let part = match self.kind? {
            Kind::Text => Part::Text(self.text.unwrap_or_default()),
            Kind::Image => Part::Image(super::request::image_of(self.source.as_ref().unwrap_or(&Value::Null))?),
            Kind::ToolUse => Part::ToolUse {
                id: self.id.unwrap_or_default(),
                name: self.name.unwrap_or_default(),
                input: self.input.map_or_else(|| "{}".to_string(), |input| input.to_string()),
            },
            Kind::ToolResult => Part::ToolResult {
                id: self.tool_use_id.unwrap_or_default(),
                content: self.content.unwrap_or_default(),
                is_error: self.is_error.unwrap_or(false),
            },
            Kind::Thinking => Part::Thinking {
                thinking: self.thinking.unwrap_or_default(),
                signature: self.signature.unwrap_or_default(),
            },
            Kind::RedactedThinking => Part::RedactedThinking(self.data.unwrap_or_default()),
            Kind::Other => return None,
        };
        Some(part)
    }
}

/// A block's `type`, as far as typing it needs (read without keeping the string).
#[derive(Debug, Clone, Copy)]
enum Kind {
    Text,
    Image,
    ToolUse,
    ToolResult,
    Thinking,
    RedactedThinking,
    /// A kind the tree reading keeps opaque.
    Other,
}

impl Kind {
    fn named(kind: &str) -> Kind {
        match kind {
            "text" => Kind::Text,
            "image" => Kind::Image,
            "tool_use" => Kind::ToolUse,
            "tool_result" => Kind::ToolResult,
            "thinking" => Kind::Thinking,
            "redacted_thinking" => Kind::RedactedThinking,
            _ => Kind::Other,
        }
    }
}

struct KindName;

impl<'de> Reader<'de> for KindName {
    type Out = Option<Kind>;

    fn str(self, kind: &str) -> Option<Kind> {
        Some(Kind::named(kind))
    }
}

#[derive(Clone, Copy)]
struct OneBlock;

impl<'de> Reader<'de> for OneBlock {
    type Out = Block;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Block, A::Error> {
        let mut block = Block::default();
        entries(map, |key, map| {
            match key {
                "type" => block.kind = map.next_value_seed(Lenient(KindName))?,
                "text" => block.text = Some(map.next_value_seed(KeptText)?),
                "id" => block.id = map.next_value_seed(Lenient(Text))?,
                "name" => block.name = map.next_value_seed(Lenient(Text))?,
                "input" => block.input = Some(map.next_value()?),
                "tool_use_id" => block.tool_use_id = map.next_value_seed(Lenient(Text))?,
                "content" => block.content = map.next_value_seed(ResultContent)?,
                "is_error" => block.is_error = map.next_value_seed(Lenient(Flag))?,
                "thinking" => block.thinking = map.next_value_seed(Lenient(Text))?,
                "signature" => block.signature = map.next_value_seed(Lenient(Text))?,
                "data" => block.data = map.next_value_seed(Lenient(Text))?,
                "source" => block.source = Some(map.next_value()?),
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
            Ok(())
        })?;
        Ok(block)
    }
}

/// The depth serde_json has left at a block's field: the body, `messages`, the message, its
/// `content` and the block enclose it.
const BLOCK_FIELD_REMAINING: u8 = json_read::RECURSION_LIMIT - 5;

/// A tool result's `content`: a string kept as sent ([`KeptText`]), or the texts of its blocks
/// joined by newlines; `None`: another type.
struct ResultContent;

impl<'de> DeserializeSeed<'de> for ResultContent {
    type Value = Option<exchange::Text>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let raw = <&'de RawValue>::deserialize(deserializer).map_err(|_| as_a_tree::<D::Error>())?;
        if raw.get().starts_with('"') {
            return json_read::kept(raw).map(Some).ok_or_else(as_a_tree);
        }
        // Blocks (or another type): checked as the tree checks them where they stand, then read
        // from their text; each block's `text` kept as [`TextOf`] keeps it.
        let raw = json_read::checked::<D::Error>(raw.to_owned(), BLOCK_FIELD_REMAINING, Schemas::Check(None))?;
        let blocks = json_read::whole(raw.get().as_bytes(), Each(TextOf)).map_err(|_| as_a_tree::<D::Error>())?;
        let texts = blocks.map(|blocks| blocks.into_iter().flatten().collect::<Vec<_>>());
        Ok(texts.map(joined))
    }
}

/// A tool result's texts as one: one block's as it was kept; several joined by newlines.
fn joined(texts: Vec<exchange::Text>) -> exchange::Text {
    match <[exchange::Text; 1]>::try_from(texts) {
        Ok([one]) => one,
        Err(texts) => exchange::lines(texts.into_iter().map(exchange::Text::into_string)).into(),
    }
}

/// A boolean, or nothing.
struct Flag;

impl<'de> Reader<'de> for Flag {
    type Out = Option<bool>;

    fn bool(self, value: bool) -> Option<bool> {
        Some(value)
    }
}

/// One tool's fields, as sent.
#[derive(Default)]
struct SentTool {
    kind: Option<String>,
    name: Option<String>,
    description: Option<exchange::Text>,
    /// As sent ([`Schema`]).
    schema: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Clone, Copy)]
struct OneTool<'p>(Schemas<'p>);

/// The depth serde_json has left at a tool's `input_schema` (and at its `description`, a field
/// of the same object): the body, `tools` and the tool enclose it.
const INPUT_SCHEMA_REMAINING: u8 = json_read::RECURSION_LIMIT - 3;

impl<'de> Reader<'de> for OneTool<'_> {
    type Out = SentTool;

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<SentTool, A::Error> {
        let mut tool = SentTool::default();
        entries(map, |key, map| {
            match key {
                "type" => tool.kind = map.next_value_seed(Lenient(Text))?,
                "name" => tool.name = map.next_value_seed(Lenient(Text))?,
                "description" => {
                    tool.description = map.next_value_seed(json_read::KeptTextOrNone(INPUT_SCHEMA_REMAINING))?
                }
                "input_schema" => {
                    let raw = map.next_value()?;
                    tool.schema = Some(json_read::checked(raw, INPUT_SCHEMA_REMAINING, self.0)?);
                }
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
            Ok(())
        })?;
        Ok(tool)
    }
}

mod read_before;
#[cfg(test)]
mod tests;
