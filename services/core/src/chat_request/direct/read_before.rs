//! A Chat Completions message or tool typed again from bytes its reader ([`super::OneMessage`],
//! [`super::OneTool`]) read before, by a scan ([`crate::read_before`], which says why): an
//! OpenAI-shaped agent's history and tools, converted for an Anthropic-shaped target on every
//! turn.
//!
//! Only the common message is typed here: text (as a string or text parts), tool calls and
//! results, with keys written plainly and once. Anything else (an image, a part of another
//! kind, a field of a type the shape does not expect) answers `None`, and the caller reads it
//! as it was read first. Where this answers, it answers as that reading does (the property
//! tests `a_message_read_before_types_as_its_first_reading` and
//! `a_tool_read_before_types_as_its_first_reading`).

use crate::exchange::{Message, Part, Schema, Tool};
use crate::read_before::{self, kept, object, plain, text_or_none, value};

use super::{SentCall, SentMessage, SentRole};

/// The message `span` holds, which [`super::OneMessage`] read before; `None`: read it so.
pub(super) fn message(span: &[u8]) -> Option<Message> {
    let span = read_before::utf8(span)?;
    let mut message = SentMessage::default();
    for field in object(span, &["content", "tool_calls"])? {
        let value = value(span, &field)?;
        match field.key {
            "role" => {
                message.role = match plain(value).as_deref() {
                    Some("system" | "developer") => SentRole::System,
                    Some("assistant") => SentRole::Assistant,
                    Some("tool") => SentRole::Tool,
                    // `user`, another role, or one that is no string.
                    _ => SentRole::User,
                }
            }
            "content" => {
                message.content = Some(match &field.items {
                    Some(parts) => {
                        let mut typed = Vec::with_capacity(parts.len());
                        for part in parts {
                            typed.extend(text_part(span.get(part.span.clone())?)?);
                        }
                        typed
                    }
                    None if value.starts_with('"') => vec![Part::Text(kept(value)?)],
                    // `null` (an assistant's turn of tool calls) or another type: no parts.
                    None => Vec::new(),
                })
            }
            "tool_calls" => {
                message.tool_calls = match &field.items {
                    Some(calls) => {
                        Some(calls.iter().map(|call| tool_call(span.get(call.span.clone())?)).collect::<Option<_>>()?)
                    }
                    None if value == "null" => None,
                    None => return None,
                }
            }
            "tool_call_id" => message.tool_call_id = text_or_none(value)?,
            _ => {}
        }
    }
    Some(message.typed())
}

/// A content part as [`super::OnePart`] and `SentPart::typed` read it: a text part's text
/// (`Some(None)`: a part with no text, or no object); `None` for a part of another kind.
fn text_part(text: &str) -> Option<Option<Part>> {
    if !text.starts_with('{') {
        return Some(None);
    }
    let (mut kind, mut said) = (None, None);
    for field in object(text, &[])? {
        let value = value(text, &field)?;
        match field.key {
            "type" => kind = text_or_none(value)?,
            "text" if value.starts_with('"') => said = Some(kept(value)?),
            // A text of another type is checked by the first reading and is none.
            "text" => return None,
            _ => {}
        }
    }
    match kind.as_deref() {
        Some("text") | None => Some(said.map(Part::Text)),
        // An image, or a part only its own shape reads.
        Some(_) => None,
    }
}

/// A tool call as [`super::OneCall`] reads it (`None`: give up).
fn tool_call(text: &str) -> Option<SentCall> {
    let mut call = SentCall::default();
    for field in object(text, &[])? {
        let value = value(text, &field)?;
        match field.key {
            "id" => call.id = text_or_none(value)?,
            "function" => {
                // A function of another type is left to the first reading.
                let function = value;
                for field in object(function, &[])? {
                    let value = read_before::value(function, &field)?;
                    match field.key {
                        "name" => call.name = text_or_none(value)?,
                        "arguments" => call.arguments = text_or_none(value)?,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(call)
}

/// One tool of a `tools` array the tenant sent before (its schemas checked then), as
/// [`super::OneTool`] read it then and [`super::Tools`] typed it: a `function` with a name.
/// `None`: read it so.
pub(super) fn tool(span: &[u8]) -> Option<Tool> {
    let span = read_before::utf8(span)?;
    let function = object(span, &[])?.into_iter().find(|field| field.key == "function")?;
    let function = value(span, &function)?;
    let (mut name, mut description, mut schema) = (None, None, None);
    for field in object(function, &[])? {
        let value = value(function, &field)?;
        match field.key {
            "name" => name = text_or_none(value)?,
            // A description of another type is none (it was checked as a tree checks it then).
            "description" => description = if value.starts_with('"') { Some(kept(value)?) } else { None },
            "parameters" => schema = Some(Schema::of_text_read_before(value)),
            _ => {}
        }
    }
    Some(Tool {
        name: name?,
        description: description.unwrap_or_default(),
        schema: schema.unwrap_or_else(|| Schema::of_value(&super::super::empty_schema())),
    })
}
