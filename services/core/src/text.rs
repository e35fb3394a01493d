//! A text a request carries (a message's text, a tool's result, a system prompt's part, a tool's
//! description), held as plain text or, when it was read from a large body, as the JSON string
//! the caller sent (issue 33).
//!
//! Why: Claude Code's history converted for an OpenAI-shaped target is ~100 KB of text, most of
//! it tool output full of newlines and quotes. Unescaping every string into a `String` and
//! escaping it again on the way out was half of that request's instructions, for bytes that come
//! out as they went in: a JSON string's escapes mean the same in every API shape. A [`Text`] read
//! from the body keeps its JSON token, a JSON writer copies it ([`Text::push_json`]), and the text
//! is unescaped only when something reads it as text (the guardrails, for a message new on this
//! turn): once, kept.
//!
//! Its length ([`Text::len`]) is the plain text's, counted from the escapes without unescaping,
//! so token estimates are the same however the text was read.

use std::borrow::Borrow;
use std::sync::OnceLock;

use crate::json_write;

/// A text: plain, or a JSON string token as sent (see the module's documentation). Reads as
/// `&str` (`Deref`), unescaping then; compares and serializes as its plain text.
#[derive(Clone, Default)]
pub struct Text(Form);

#[derive(Clone)]
enum Form {
    Plain(String),
    Json(Box<Token>),
}

impl Default for Form {
    fn default() -> Self {
        Form::Plain(String::new())
    }
}

/// A JSON string token, its plain text's length, and the plain text once something read it.
#[derive(Clone)]
struct Token {
    /// The token with its quotes: a JSON string serde_json read (a `RawValue`), with no `\u`
    /// escape of a UTF-16 surrogate ([`Text::json`]).
    json: Box<str>,
    len: usize,
    plain: OnceLock<String>,
}

impl Text {
    /// The text of `token`, a JSON value serde_json read from a body (so valid JSON: a
    /// `RawValue`, not any text, since the token is copied into other bodies as it is); kept as
    /// sent when it holds an escape. `None` when it is not a string, or holds a `\u` escape of a
    /// UTF-16 surrogate (an emoji written as a pair, or a lone half that serde_json refuses when
    /// it unescapes): read such a string as serde_json does.
    pub fn json(token: &serde_json::value::RawValue) -> Option<Text> {
        Text::of_token(token.get())
    }

    /// [`Text::json`] of a token known to be a JSON string serde_json read before (the span of
    /// a message the tenant sent before, or read earlier in this request): not checked again.
    /// Given anything else it answers `None`, or keeps what it was given as the token, which a
    /// writer then copies as it is: so only bytes serde_json accepted may come here.
    pub fn of_token(token: &str) -> Option<Text> {
        let inner = token.strip_prefix('"')?.strip_suffix('"')?;
        if !inner.contains('\\') {
            return Some(Text(Form::Plain(inner.to_owned())));
        }
        let len = plain_len(inner.as_bytes())?;
        Some(Text(Form::Json(Box::new(Token { json: token.into(), len, plain: OnceLock::new() }))))
    }

    /// The plain text, unescaped now if it was not yet.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Form::Plain(text) => text,
            Form::Json(token) => token.plain.get_or_init(|| unescape(&token.json)),
        }
    }

    /// The plain text's length in bytes, without unescaping it.
    pub fn len(&self) -> usize {
        match &self.0 {
            Form::Plain(text) => text.len(),
            Form::Json(token) => token.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The plain text, taken.
    pub fn into_string(self) -> String {
        match self.0 {
            Form::Plain(text) => text,
            Form::Json(token) => {
                let Token { json, plain, .. } = *token;
                plain.into_inner().unwrap_or_else(|| unescape(&json))
            }
        }
    }

    /// Appends the text as a JSON string: the token as sent, or the plain text escaped.
    pub fn push_json(&self, out: &mut Vec<u8>) {
        match &self.0 {
            Form::Plain(text) => json_write::push_str(out, text),
            Form::Json(token) => out.extend_from_slice(token.json.as_bytes()),
        }
    }

    /// Appends the text escaped as the inside of a JSON string (no quotes).
    pub fn push_escaped(&self, out: &mut Vec<u8>) {
        match &self.0 {
            Form::Plain(text) => json_write::push_escaped(out, text),
            Form::Json(token) => {
                let inner = token.json.get(1..token.json.len() - 1).unwrap_or_default();
                out.extend_from_slice(inner.as_bytes());
            }
        }
    }

    /// Appends `texts` joined by `separator` as one JSON string, each as [`Text::push_escaped`]
    /// writes it: the same text as [`json_write::push_str`] of the joined plain texts.
    pub fn push_joined<'t>(out: &mut Vec<u8>, texts: impl IntoIterator<Item = &'t Text>, separator: &str) {
        let mut texts = texts.into_iter();
        let first = texts.next();
        let second = texts.next();
        match (first, second) {
            (None, _) => out.extend_from_slice(b"\"\""),
            (Some(one), None) => one.push_json(out),
            (Some(first), Some(second)) => {
                out.push(b'"');
                first.push_escaped(out);
                for text in std::iter::once(second).chain(texts) {
                    json_write::push_escaped(out, separator);
                    text.push_escaped(out);
                }
                out.push(b'"');
            }
        }
    }
}

/// The length of the plain text of `inner` (a JSON string's inside, its escapes valid) without
/// unescaping it; `None` when it holds a `\u` escape of a surrogate.
fn plain_len(inner: &[u8]) -> Option<usize> {
    let mut len = 0;
    let mut at = 0;
    while let Some(found) = memchr::memchr(b'\\', inner.get(at..)?) {
        let escape = at + found;
        len += found;
        match inner.get(escape + 1)? {
            b'u' => {
                let hex = std::str::from_utf8(inner.get(escape + 2..escape + 6)?).ok()?;
                let unit = u32::from_str_radix(hex, 16).ok()?;
                len += char::from_u32(unit)?.len_utf8();
                at = escape + 6;
            }
            _ => {
                len += 1;
                at = escape + 2;
            }
        }
    }
    Some(len + inner.len().saturating_sub(at))
}

/// The plain text of a token [`Text::json`] kept (serde_json accepted it and it holds no
/// surrogate escape, so this reading cannot fail; were it to, its inside is returned as is).
fn unescape(token: &str) -> String {
    serde_json::from_str(token)
        .unwrap_or_else(|_| token.get(1..token.len().saturating_sub(1)).unwrap_or_default().to_owned())
}

impl std::ops::Deref for Text {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Text {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// For `join` over texts (a Responses tool output's parts).
impl Borrow<str> for Text {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for Text {
    fn from(text: String) -> Text {
        Text(Form::Plain(text))
    }
}

impl From<&str> for Text {
    fn from(text: &str) -> Text {
        Text(Form::Plain(text.to_owned()))
    }
}

impl From<Text> for String {
    fn from(text: Text) -> String {
        text.into_string()
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Text) -> bool {
        self.len() == other.len() && self.as_str() == other.as_str()
    }
}

impl Eq for Text {}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Text {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn raw(token: &str) -> &serde_json::value::RawValue {
        serde_json::from_str(token).unwrap()
    }

    /// A JSON token of `text` with more escapes than serde_json writes: `/` as `\/`, and some
    /// characters as `\u` escapes (never surrogates: those are not kept).
    fn token_of(text: &str, escape_slash: bool, unicode: bool) -> String {
        let mut token = String::from("\"");
        for c in text.chars() {
            match c {
                '/' if escape_slash => token.push_str("\\/"),
                c if unicode && !c.is_ascii() && (c as u32) < 0x10000 => {
                    token.push_str(&format!("\\u{:04x}", c as u32))
                }
                c if unicode && c == 'e' => token.push_str("\\u0065"),
                c => {
                    let one = serde_json::to_string(&c.to_string()).unwrap();
                    token.push_str(&one[1..one.len() - 1]);
                }
            }
        }
        token.push('"');
        token
    }

    proptest! {
        /// A token kept as sent reads, measures, compares and writes as its plain text, however
        /// it was escaped.
        #[test]
        fn a_kept_token_is_its_plain_text(text in "(\\PC|[\\n\\t\"\\\\/\u{7f}\u{1}é€])*", slash: bool, unicode: bool) {
            let token = token_of(&text, slash, unicode);
            prop_assert_eq!(serde_json::from_str::<String>(&token).unwrap(), text.clone());
            let kept = Text::json(raw(&token)).unwrap();
            prop_assert_eq!(kept.len(), text.len());
            prop_assert_eq!(kept.is_empty(), text.is_empty());
            prop_assert_eq!(&kept, &Text::from(text.as_str()));
            prop_assert_eq!(kept.as_str(), text.as_str());
            let mut written = Vec::new();
            kept.push_json(&mut written);
            prop_assert_eq!(serde_json::from_slice::<String>(&written).unwrap(), text.clone());
            prop_assert_eq!(Text::json(raw(&token)).unwrap().into_string(), text);
        }

        /// Joined texts read as the plain texts joined, whichever form each is in.
        #[test]
        fn joined_texts_read_as_the_texts_joined(texts in prop::collection::vec(("(\\PC|[\\n\"\\\\])*", any::<bool>()), 0..4), separator in "[\\n ]{0,2}") {
            let kept: Vec<Text> = texts.iter().map(|(text, as_sent)| if *as_sent {
                Text::json(raw(&serde_json::to_string(text).unwrap())).unwrap()
            } else {
                Text::from(text.as_str())
            }).collect();
            let mut written = Vec::new();
            Text::push_joined(&mut written, &kept, &separator);
            let joined = texts.iter().map(|(text, _)| text.as_str()).collect::<Vec<_>>().join(&separator);
            prop_assert_eq!(serde_json::from_slice::<String>(&written).unwrap(), joined);
        }

        /// Plain texts joined are written as serde_json writes the joined text, byte for byte
        /// (an escape never spans two characters), whatever the texts and the separator.
        #[test]
        fn plain_texts_joined_are_the_joined_text_as_serde_json_writes_it(
            texts in prop::collection::vec(any::<String>(), 0..4),
            separator in prop_oneof![Just(String::new()), Just("\n".to_string()), any::<String>()],
        ) {
            let plain: Vec<Text> = texts.iter().map(|text| Text::from(text.as_str())).collect();
            let mut written = Vec::new();
            Text::push_joined(&mut written, &plain, &separator);
            prop_assert_eq!(written, serde_json::to_vec(&texts.join(&separator)).unwrap());
        }
    }

    #[test]
    fn a_token_with_an_escape_is_kept_as_sent_and_one_without_is_plain() {
        let mut written = Vec::new();
        Text::json(raw(r#""line\nnext \u00e9 \/""#)).unwrap().push_json(&mut written);
        assert_eq!(written, br#""line\nnext \u00e9 \/""#);
        assert!(matches!(Text::json(raw(r#""plain""#)).unwrap().0, Form::Plain(_)));
        assert_eq!(Text::json(raw(r#""a\u00e9\u20ac""#)).unwrap().len(), "aé€".len());
    }

    #[test]
    fn a_surrogate_escape_or_another_type_is_not_kept() {
        assert!(Text::json(raw(r#""\ud83d\ude00""#)).is_none());
        assert!(Text::json(raw(r#""lone \uD800""#)).is_none());
        assert!(Text::json(raw("42")).is_none());
    }
}
