//! A typed request of another shape (a Chat Completions or Responses caller's: Codex on an
//! Anthropic route) as a Messages body's `system`, `messages` and `tools`, written straight into
//! the body. A converted agent history is ~150 KB, most of it tool output, which a tree of
//! `Value`s copied once more, in thousands of allocations, before it was written (issue 33);
//! texts read as sent ([`Text`]) are copied as they came.
//!
//! System messages anywhere join the top-level `system` after its own parts; consecutive
//! same-role turns merge into one (Anthropic wants user and assistant turns to alternate); a
//! block Anthropic would refuse (empty text, thinking it did not sign) or one only its own
//! shape carries is left out.

use serde_json::Value;
use shield_core::exchange::{self, Image, Message, Part, Role, Text};
use shield_core::json_write::{push_array, push_str, push_value};

use super::anthropics_thinking;

/// Whether the request has a system prompt to write: a part of its own or a system message's
/// text, not empty.
pub(super) fn has_system(request: &exchange::Request) -> bool {
    system_texts(request).next().is_some()
}

/// The top-level `system` as an array of text blocks onto `out`.
pub(super) fn system(request: &exchange::Request, out: &mut Vec<u8>) {
    push_array(out, system_texts(request), text_block);
}

/// The system prompt's own parts, then each system message's text parts, the empty left out.
fn system_texts(request: &exchange::Request) -> impl Iterator<Item = &Text> {
    let messages = (&request.messages).into_iter().filter(|message| message.role == Role::System);
    request.system.iter().chain(messages.flat_map(texts)).filter(|text| !text.is_empty())
}

fn texts(message: &Message) -> impl Iterator<Item = &Text> {
    message.content.iter().filter_map(|part| if let Part::Text(text) = part { Some(text) } else { None })
}

/// `messages` as a JSON array onto `out`: each user or assistant turn with its blocks, a turn
/// of the same role as the one before written into it.
pub(super) fn messages(request: &exchange::Request, out: &mut Vec<u8>) {
    out.push(b'[');
    // The role of the turn being written, and whether a block is in it yet.
    let mut open: Option<Role> = None;
    let mut blocks = false;
    for message in &request.messages {
        let role: &[u8] = match message.role {
            Role::System => continue,
            Role::User => b"user",
            Role::Assistant => b"assistant",
        };
        if open != Some(message.role) {
            if open.is_some() {
                out.extend_from_slice(b"]},");
            }
            out.extend_from_slice(br#"{"role":""#);
            out.extend_from_slice(role);
            out.extend_from_slice(br#"","content":["#);
            (open, blocks) = (Some(message.role), false);
        }
        for part in message.content.iter().filter(|part| is_block(part)) {
            if std::mem::replace(&mut blocks, true) {
                out.push(b',');
            }
            block(out, part);
        }
    }
    if open.is_some() {
        out.extend_from_slice(b"]}");
    }
    out.push(b']');
}

/// Whether a part is written as a block: empty text is refused by Anthropic, thinking it did
/// not sign (Gemini's, or a thought without a signature) too, and a part only its own shape
/// carries has no place here.
fn is_block(part: &Part) -> bool {
    match part {
        Part::Text(text) => !text.is_empty(),
        Part::Thinking { .. } => anthropics_thinking(part),
        Part::Opaque { .. } => false,
        Part::Image(_) | Part::ToolUse { .. } | Part::ToolResult { .. } | Part::RedactedThinking(_) => true,
    }
}

fn text_block(out: &mut Vec<u8>, text: &Text) {
    out.extend_from_slice(br#"{"type":"text","text":"#);
    text.push_json(out);
    out.push(b'}');
}

/// A part [`is_block`] takes, as its content block.
fn block(out: &mut Vec<u8>, part: &Part) {
    match part {
        Part::Text(text) => text_block(out, text),
        Part::Image(Image::Base64 { media_type, data }) => {
            out.extend_from_slice(br#"{"type":"image","source":{"type":"base64","media_type":"#);
            push_str(out, media_type);
            out.extend_from_slice(br#","data":"#);
            push_str(out, data);
            out.extend_from_slice(b"}}");
        }
        Part::Image(Image::Url(url)) => {
            out.extend_from_slice(br#"{"type":"image","source":{"type":"url","url":"#);
            push_str(out, url);
            out.extend_from_slice(b"}}");
        }
        Part::ToolUse { id, name, input } => {
            out.extend_from_slice(br#"{"type":"tool_use","id":"#);
            push_str(out, id);
            out.extend_from_slice(br#","name":"#);
            push_str(out, name);
            out.extend_from_slice(br#","input":"#);
            // Arguments that are not a JSON object become `{}`. Read as a tree and written
            // again, as before: a duplicate key is sent once, as the tree keeps it.
            match serde_json::from_str::<Value>(input) {
                Ok(input @ Value::Object(_)) => push_value(out, &input),
                _ => out.extend_from_slice(b"{}"),
            }
            out.push(b'}');
        }
        Part::ToolResult { id, content, is_error } => {
            out.extend_from_slice(br#"{"type":"tool_result","tool_use_id":"#);
            push_str(out, id);
            out.extend_from_slice(br#","content":["#);
            if !content.is_empty() {
                text_block(out, content);
            }
            out.push(b']');
            if *is_error {
                out.extend_from_slice(br#","is_error":true"#);
            }
            out.push(b'}');
        }
        Part::Thinking { thinking, signature } => {
            out.extend_from_slice(br#"{"type":"thinking","thinking":"#);
            push_str(out, thinking);
            out.extend_from_slice(br#","signature":"#);
            push_str(out, signature);
            out.push(b'}');
        }
        Part::RedactedThinking(data) => {
            out.extend_from_slice(br#"{"type":"redacted_thinking","data":"#);
            push_str(out, data);
            out.push(b'}');
        }
        // Not a block ([`is_block`]).
        Part::Opaque { .. } => {}
    }
}

/// `tools` in the Messages shape onto `out`, each description as sent and each schema as the
/// caller sent it ([`exchange::Schema`]: never read as a tree and written again).
pub(super) fn tools(tools: &[exchange::Tool], out: &mut Vec<u8>) {
    push_array(out, tools, |out, tool| {
        out.extend_from_slice(br#"{"name":"#);
        push_str(out, &tool.name);
        if !tool.description.is_empty() {
            out.extend_from_slice(br#","description":"#);
            tool.description.push_json(out);
        }
        out.extend_from_slice(br#","input_schema":"#);
        out.extend_from_slice(tool.schema.text().as_bytes());
        out.push(b'}');
    });
}

/// About the length of the tools written.
pub(super) fn tools_size(tools: &[exchange::Tool]) -> usize {
    tools.iter().map(|tool| tool.schema.text().len() + tool.description.len() + 64).sum()
}

#[cfg(test)]
mod tests;
