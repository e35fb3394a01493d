//! An upstream's answer kept as it sent it, for a caller of the same shape: its bytes, and
//! where `model`'s value sits and the object ends. The answer is rendered with `model` replaced
//! and Shield's `x_shield` spliced in before the closing brace, so that no tree of it is built,
//! walked, written and dropped per answer (issue 19 for OpenAI's shape; issue 33 for
//! Anthropic's, where that tree was a tenth of a relayed 148 KB Messages request's
//! instructions). Each flavour's borrowed view ([`super::openai`], [`super::anthropic`]) checks
//! the shape, types the answer and finds `model`; what a view does not take is kept as a tree
//! ([`render_tree`]), and both give the same answer.
//!
//! One difference, accepted: a view skips what it does not read without checking numbers'
//! range or nesting depth, which a tree refuses (`1e400`, arrays 129 deep). Such an answer is
//! relayed as the upstream sent it (an unread field, or `model`, which is replaced), where the
//! tree would have taken it for no answer; nothing of it is read as Shield's own data.

use std::ops::Range;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::x_shield::XShieldJson;

/// An answer's bytes with where `model`'s value sits and where the object ends.
#[derive(Debug)]
pub struct AsSent {
    bytes: Vec<u8>,
    /// The bytes of `model`'s value.
    model: Range<usize>,
    /// The index of the closing `}`.
    end: usize,
}

/// Where `model`'s value sits in an answer's text, and where the object ends.
#[derive(Debug)]
pub(super) struct Place {
    model: Range<usize>,
    end: usize,
}

/// The place of `model`, a value a view borrowed from `text`; `None` when it is not in `text`
/// (a view always borrows it).
pub(super) fn place(text: &str, model: &RawValue) -> Option<Place> {
    let model = model.get();
    let start = (model.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    let end = text.as_bytes().iter().rposition(|&b| b == b'}')?;
    let model = start..start + model.len();
    (model.end <= end).then_some(Place { model, end })
}

impl AsSent {
    /// `bytes`, the answer whose text `place` was found in.
    pub(super) fn new(bytes: Vec<u8>, Place { model, end }: Place) -> AsSent {
        AsSent { bytes, model, end }
    }

    /// The answer with `model` set and `x_shield` added.
    pub fn render(self, model: &str, x_shield: &impl XShieldJson) -> Vec<u8> {
        let (Some(head), Some(middle)) = (self.bytes.get(..self.model.start), self.bytes.get(self.model.end..self.end))
        else {
            // The view's own offsets: always inside the bytes it read. Were they not, the
            // general path renders the same answer.
            return match serde_json::from_slice(&self.bytes) {
                Ok(Value::Object(map)) => render_tree(map, model, x_shield),
                _ => render_tree(Map::new(), model, x_shield),
            };
        };
        // Room for `x_shield`: a route's record with an attempt or two, and four guardrail
        // records (input and output, two detectors) are ~700 bytes; growing the buffer past it
        // would copy the whole answer again.
        let mut out = Vec::with_capacity(self.bytes.len() + model.len() + 1024);
        out.extend_from_slice(head);
        let _ = serde_json::to_writer(&mut out, model);
        out.extend_from_slice(middle);
        out.extend_from_slice(b",\"x_shield\":");
        x_shield.write_json(&mut out);
        out.push(b'}');
        out
    }
}

/// An answer kept for a caller of its upstream's shape: as sent, or as a tree when the view
/// did not take it.
#[derive(Debug)]
pub enum Kept {
    Raw(Box<AsSent>),
    Tree(Map<String, Value>),
}

impl Kept {
    /// The answer with `model` set and `x_shield` Shield's.
    pub fn render(self, model: &str, x_shield: &impl XShieldJson) -> Vec<u8> {
        match self {
            Kept::Raw(raw) => raw.render(model, x_shield),
            Kept::Tree(body) => render_tree(body, model, x_shield),
        }
    }
}

/// An answer held as a map, with `model` set and `x_shield` Shield's (an upstream's own
/// dropped).
pub fn render_tree(mut body: Map<String, Value>, model: &str, x_shield: &impl XShieldJson) -> Vec<u8> {
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

/// A JSON object read as `T`, and never an array: serde_json reads a derived struct from either
/// (its fields in order), which a tree's `get` would not find in an array. The borrowed views
/// of answers and chunks read their nested objects through this, so that they read what the
/// tree reads or nothing.
pub(super) struct Obj<T>(pub(super) T);

impl<T> std::ops::Deref for Obj<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Obj<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object<T>(std::marker::PhantomData<T>);

        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
            type Value = Obj<T>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Obj)
            }
        }

        deserializer.deserialize_map(Object(std::marker::PhantomData))
    }
}

/// Whether `data` holds a `\u` escape of a UTF-16 surrogate. A borrowed view skips the fields
/// it does not read without checking their escapes, where a tree refuses a lone surrogate: such
/// a text goes the tree's way, so that what one reading refuses the other does too. (An emoji
/// escaped as a pair also goes that way; only speed differs.)
pub(super) fn has_surrogate_escape(data: &str) -> bool {
    let bytes = data.as_bytes();
    memchr::memchr_iter(b'\\', bytes).any(|at| {
        matches!(bytes.get(at + 1..at + 4), Some([b'u', b'd' | b'D', b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F']))
    })
}
