//! Values of a JSON text its reader read before (issue 33), taken by a scan: an agent's
//! history and tools, resent on every turn and known by a keyed hash of their bytes
//! ([`crate::remembered`]), are typed again when a request is converted to another shape.
//! serde_json finds each string's end by looking at every byte, eight at a time and once more
//! per escape (tool output has one a line), to check it; these bytes were checked when first
//! read, so here a value's structure is found by [`json_scan`] (a string's end a word at a
//! time, then by `memchr`) and its strings are taken as sent. Each shape's reader of a message
//! read before is built on these (the proxy's Messages reader, [`crate::chat_request`]'s).
//!
//! Only text serde_json accepted may come here: a token is kept as it is, and a writer copies
//! it. Each function answers `None` where the first reading may not have answered alike (a key
//! written twice or with escapes, a value of a type it does not expect): the caller then reads
//! the value as it did first.

use crate::json_scan::{self, Field};

/// A span read before, as text: checked as UTF-8 when first read, and checked again here (with
/// SIMD, a fraction of the scan's cost) not to need `unsafe`.
pub fn utf8(span: &[u8]) -> Option<&str> {
    simdutf8::basic::from_utf8(span).ok()
}

/// The text of the block `text` holds, an object: its `text` kept as sent (`Some(None)`: none;
/// `None`: one of another type, left to the first reading).
pub fn text_in(text: &str) -> Option<Option<crate::exchange::Text>> {
    match object(text, &[])?.iter().find(|field| field.key == "text") {
        Some(field) => kept(value(text, field)?).map(Some),
        None => Some(None),
    }
}

/// The fields of the object `text` holds, the arrays of those named in `itemised` with their
/// items; `None` when a key is written twice (the first reading keeps the last) or is
/// serde_json's raw-value token.
pub fn object<'t>(text: &'t str, itemised: &[&str]) -> Option<Vec<Field<'t>>> {
    let fields = json_scan::fields(text.as_bytes(), itemised)?;
    for (i, field) in fields.iter().enumerate() {
        let twice = fields.get(..i).unwrap_or_default().iter().any(|earlier| earlier.key == field.key);
        if twice || field.key == crate::chat_request::RAW_VALUE_TOKEN {
            return None;
        }
    }
    Some(fields)
}

/// A field's value as sent.
pub fn value<'t>(text: &'t str, field: &Field<'_>) -> Option<&'t str> {
    text.get(field.value.clone())
}

/// A string value's plain text (`None`: not a string).
pub fn plain(token: &str) -> Option<String> {
    let inner = token.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(inner.to_owned());
    }
    serde_json::from_str(token).ok()
}

/// A string value's text kept as sent, as the first reading keeps it (`json_read::kept`).
pub fn kept(token: &str) -> Option<crate::exchange::Text> {
    if !token.starts_with('"') {
        return None;
    }
    crate::exchange::Text::of_token(token)
        .or_else(|| serde_json::from_str::<String>(token).ok().map(crate::exchange::Text::from))
}

/// A value the first reading reads as "a string, or nothing" (`Lenient(Text)`).
pub fn text_or_none(token: &str) -> Option<Option<String>> {
    match token.as_bytes().first()? {
        b'"' => plain(token).map(Some),
        _ => Some(None),
    }
}
