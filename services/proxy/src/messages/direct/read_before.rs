//! A Messages message, tool or system block typed again from bytes its reader
//! ([`super::OneMessage`], [`super::OneTool`], [`super::TextOf`]) read before, by a scan
//! ([`shield_core::read_before`], which says why): Claude Code's history, two dozen tools and
//! 14 KB system prompt, converted for an OpenAI-shaped target on every turn. Before, typing
//! them through serde_json again was ~60 % of that request's instructions.
//!
//! Only the common message is typed here: text, images, tool use and results, thinking, with
//! keys written plainly and once, into the first reading's own block ([`super::Block`], typed
//! by the same code). Anything else (a kind only Anthropic reads, a key given twice or with
//! escapes, a field of a type the shape does not expect) answers `None`, and the caller reads it as it was
//! read first. Where this answers, it answers as that reading does (the property tests
//! `a_message_read_before_types_as_its_first_reading` and the like for tools and blocks).

use serde_json::Value;
use shield_core::exchange::{self, Message, Schema, Tool};
use shield_core::json_scan::Field;
use shield_core::read_before::{self, kept, object, plain, text_in, text_or_none, value};

use super::{Block, Kind};

/// The message `span` holds, which [`super::OneMessage`] read before; `None`: read it so.
pub(super) fn message(span: &[u8]) -> Option<Message> {
    let span = read_before::utf8(span)?;
    let (mut role, mut content) = (None, None);
    // The content's blocks are found in the same pass as the message's fields.
    for field in object(span, &["content"])? {
        match field.key {
            "role" => role = Some(plain(value(span, &field)?)?),
            "content" => content = Some(field),
            _ => {}
        }
    }
    let content = content?;
    let blocks = match &content.items {
        Some(blocks) => {
            blocks.iter().map(|item| block(span.get(item.span.clone())?)).collect::<Option<Vec<Block>>>()?
        }
        None if span.as_bytes().get(content.value.start) == Some(&b'"') => {
            vec![Block { kind: Some(Kind::Text), text: Some(kept(value(span, &content)?)?), ..Block::default() }]
        }
        None => return None,
    };
    super::typed_message(role.as_deref(), blocks)
}

/// One tool of a `tools` array the tenant sent before (with no server tool, its schemas checked
/// then), which [`super::OneTool`] read then; `None`: read it so.
pub(super) fn tool(span: &[u8]) -> Option<Tool> {
    let span = read_before::utf8(span)?;
    let (mut name, mut description, mut schema) = (None, None, None);
    for field in object(span, &[])? {
        let value = value(span, &field)?;
        match field.key {
            // A server tool is no tool here (none is in a list remembered).
            "type" => match text_or_none(value)?.as_deref() {
                None | Some("custom") => {}
                Some(_) => return None,
            },
            "name" => name = text_or_none(value)?,
            // A description of another type is none (it was checked as a tree checks it then).
            "description" => description = if value.starts_with('"') { Some(kept(value)?) } else { None },
            "input_schema" => schema = Some(Schema::of_text_read_before(value)),
            _ => {}
        }
    }
    Some(Tool {
        name: name.unwrap_or_default(),
        description: description.unwrap_or_default(),
        schema: schema.unwrap_or_else(super::no_schema),
    })
}

/// A block's text, as [`super::TextOf`] read it (`Some(None)`: none): the blocks of Claude
/// Code's 14 KB system prompt, the same on every turn. `None`: read it so.
pub(super) fn system_block(span: &[u8]) -> Option<Option<exchange::Text>> {
    text_in(read_before::utf8(span)?)
}

/// A block's fields, as [`super::OneBlock`] reads them (`None`: not an object, no string
/// `type`, or a field of a type the first reading leaves to the tree).
fn block(text: &str) -> Option<Block> {
    let mut block = Block::default();
    let mut kind = None;
    for field in object(text, &["content"])? {
        let value = value(text, &field)?;
        match field.key {
            "type" => {
                kind = Some(Kind::named(&plain(value)?));
            }
            "text" => block.text = Some(kept(value)?),
            "id" => block.id = text_or_none(value)?,
            "name" => block.name = text_or_none(value)?,
            // Read as a value, as the first reading reads it (and writes it again).
            "input" => block.input = Some(serde_json::from_str::<Value>(value).ok()?),
            "tool_use_id" => block.tool_use_id = text_or_none(value)?,
            "content" => block.content = result_content(text, &field)?,
            "is_error" => {
                block.is_error = match value {
                    "true" => Some(true),
                    "false" => Some(false),
                    _ => None,
                }
            }
            "thinking" => block.thinking = text_or_none(value)?,
            "signature" => block.signature = text_or_none(value)?,
            "data" => block.data = text_or_none(value)?,
            "source" => block.source = Some(serde_json::from_str::<Value>(value).ok()?),
            _ => {}
        }
    }
    block.kind = Some(kind?);
    Some(block)
}

/// A tool result's `content`, as `super::ResultContent` reads it: a string kept as sent, the
/// texts of its blocks (one as it was kept, several joined by newlines), `None` for another
/// type. The outer `None`: read the message as it was read first.
fn result_content(text: &str, field: &Field<'_>) -> Option<Option<exchange::Text>> {
    let value = value(text, field)?;
    match (&field.items, value.as_bytes().first()?) {
        (_, b'"') => kept(value).map(Some),
        (Some(items), _) => {
            let mut texts = Vec::new();
            for item in items {
                let item = text.get(item.span.clone())?;
                if !item.starts_with('{') {
                    continue;
                }
                texts.extend(text_in(item)?);
            }
            Some(Some(super::joined(texts)))
        }
        _ => Some(None),
    }
}
