//! A body's top-level fields as the JSON text they were sent as (issue 33). The same-shape path
//! relays a caller's body with a few top-level fields replaced (`model`, `stream`, a target's
//! `extra_body`); writing it from the parsed tree re-escaped every string of a 150 KB agent
//! history (42 % of the request's instructions), and capturing the fields as serde_json
//! `RawValue`s re-validated every byte (a quarter of them). This finds where each top-level
//! value starts and ends in a body serde_json has already parsed, skipping strings with
//! `memchr`, and copies those bytes out unchanged.
//!
//! Hand-rolled because no JSON crate here hands back the spans of a parse it has made; it reads
//! only bodies serde_json accepted, and answers `None` (the caller then writes from the tree)
//! for anything it does not expect: an escaped key, a duplicate key, trailing bytes.

use std::ops::Range;

use bytes::Bytes;
use serde_json::{Map, Value};

/// The top-level fields of an object body, each with the bytes of its value as sent.
#[derive(Debug, Clone)]
pub struct Verbatim {
    /// The body as read: shared with the request, not copied.
    text: Bytes,
    fields: Vec<(String, Range<usize>)>,
}

/// Below this size a body is written from its parsed fields: finding the spans and keeping the
/// text cost more than serialising a few short values again (callgrind, issue 33: +1.2 % on
/// a one-line prompt).
pub const WORTH_IT: usize = 2048;

impl Verbatim {
    /// [`Verbatim::of`] for a body of at least [`WORTH_IT`] bytes.
    pub fn of_large(body: &Bytes, fields: &Map<String, Value>) -> Option<Verbatim> {
        (body.len() >= WORTH_IT).then(|| Verbatim::of(body, fields)).flatten()
    }

    /// `body`'s fields, when `body` is an object whose keys are `fields`' keys.
    pub fn of(body: &Bytes, fields: &Map<String, Value>) -> Option<Verbatim> {
        let spans = spans(body)?;
        if spans.len() != fields.len() || !spans.iter().all(|(key, _)| fields.contains_key(*key)) {
            return None; // a duplicate key, or a key written with escapes
        }
        let fields = spans.into_iter().map(|(key, span)| (key.to_string(), span)).collect();
        Some(Verbatim { text: body.clone(), fields })
    }

    /// `body`'s fields, when `body` is an object whose keys are written without escapes and
    /// distinct (not yet parsed: a caller that finds the body malformed drops this).
    pub fn of_distinct(body: &Bytes) -> Option<Verbatim> {
        let spans = spans(body)?;
        let distinct = spans.iter().enumerate().all(|(i, (key, _))| spans.iter().take(i).all(|(k, _)| k != key));
        distinct.then(|| Verbatim {
            text: body.clone(),
            fields: spans.into_iter().map(|(k, s)| (k.to_string(), s)).collect(),
        })
    }

    /// The value of field `key`, parsed (`None` too for text that is not JSON, which a body read
    /// whole never holds).
    pub fn value(&self, key: &str) -> Option<Value> {
        let (_, span) = self.fields.iter().rev().find(|(k, _)| k == key)?;
        serde_json::from_slice(self.text.get(span.clone())?).ok()
    }

    /// A JSON object: every field as sent but those `replaced` names, then `set` (a later entry
    /// of a key wins, as with a map's insert).
    pub fn relay(&self, replaced: impl Fn(&str) -> bool, set: &[(&str, &Value)]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.text.len() + 256);
        out.push(b'{');
        for (key, span) in self.fields.iter().filter(|(key, _)| !replaced(key) && !set.iter().any(|(k, _)| k == key)) {
            push_key(&mut out, key);
            out.extend_from_slice(self.text.get(span.clone()).unwrap_or_default());
        }
        for (i, (key, value)) in set.iter().enumerate() {
            if !set.get(i + 1..).unwrap_or_default().iter().any(|(later, _)| later == key) {
                push_key(&mut out, key);
                crate::json_write::push_value(&mut out, value);
            }
        }
        out.push(b'}');
        out
    }
}

fn push_key(out: &mut Vec<u8>, key: &str) {
    if out.len() > 1 {
        out.push(b',');
    }
    crate::json_write::push_str(out, key);
    out.push(b':');
}

/// Each top-level key (as written, unescaped keys only) with the span of its value.
fn spans(body: &[u8]) -> Option<Vec<(&str, Range<usize>)>> {
    let mut at = skip_space(body, 0);
    (body.get(at) == Some(&b'{')).then_some(())?;
    at = skip_space(body, at + 1);
    let mut spans = Vec::new();
    if body.get(at) == Some(&b'}') {
        return (skip_space(body, at + 1) == body.len()).then_some(spans);
    }
    loop {
        (body.get(at) == Some(&b'"')).then_some(())?;
        let end = string_end(body, at)?;
        let key = std::str::from_utf8(body.get(at + 1..end - 1)?).ok().filter(|key| !key.contains('\\'))?;
        at = skip_space(body, end);
        (body.get(at) == Some(&b':')).then_some(())?;
        let start = skip_space(body, at + 1);
        let end = value_end(body, start)?;
        spans.push((key, start..end));
        at = skip_space(body, end);
        match body.get(at)? {
            b',' => at = skip_space(body, at + 1),
            b'}' => return (skip_space(body, at + 1) == body.len()).then_some(spans),
            _ => return None,
        }
    }
}

fn skip_space(body: &[u8], mut at: usize) -> usize {
    while body.get(at).is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// The index just past the string that opens at `at`.
fn string_end(body: &[u8], at: usize) -> Option<usize> {
    let mut from = at + 1;
    loop {
        let found = from + memchr::memchr2(b'"', b'\\', body.get(from..)?)?;
        if body.get(found) == Some(&b'\\') {
            from = found + 2;
        } else {
            return Some(found + 1);
        }
    }
}

/// The index just past the value that starts at `at`.
fn value_end(body: &[u8], at: usize) -> Option<usize> {
    match body.get(at)? {
        b'"' => string_end(body, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match body.get(i)? {
                    b'"' => {
                        i = string_end(body, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let rest = body.get(at..)?;
            Some(at + rest.iter().position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn verbatim(body: &str) -> Option<Verbatim> {
        let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(body) else { return None };
        Verbatim::of(&Bytes::copy_from_slice(body.as_bytes()), &fields)
    }

    #[test]
    fn values_are_copied_as_sent_and_set_fields_replace_them() {
        let body = r#" { "model" : "m", "n": 1e0 , "text":"a\"b\\c}]", "nested": {"x": [1, {"y": "}"}]}, "t": true } "#;
        let v = verbatim(body).unwrap();
        let model = json!("target");
        let out = String::from_utf8(v.relay(|key| key == "t", &[("model", &model), ("extra", &json!(2))])).unwrap();
        assert_eq!(out, r#"{"n":1e0,"text":"a\"b\\c}]","nested":{"x": [1, {"y": "}"}]},"model":"target","extra":2}"#);
        assert!(verbatim(r#"{"a": 1, "a": 2}"#).is_none(), "duplicate keys take the parsed path");
        assert!(verbatim(r#"{"\u0061": 1}"#).is_none(), "escaped keys take the parsed path");
        assert_eq!(verbatim("{}").unwrap().relay(|_| false, &[]), b"{}");
    }

    proptest! {
        /// Whatever the object, the relayed body reads as the parsed one with `set` applied.
        #[test]
        fn relayed_bodies_read_as_the_parsed_ones(
            fields in prop::collection::btree_map("[a-z \"\\\\]{0,6}", any::<(i64, String, Option<bool>)>(), 0..8),
            pretty in any::<bool>(),
        ) {
            let object: Map<String, Value> = fields.into_iter()
                .map(|(k, (n, s, b))| (k, json!({"n": n, "s": s, "b": b, "l": [s, n, {"}": "]"}]})))
                .collect();
            let value = Value::Object(object.clone());
            let body = if pretty { serde_json::to_string_pretty(&value).unwrap() } else { value.to_string() };
            let set = json!("x");
            match verbatim(&body) {
                Some(v) => {
                    let relayed: Value = serde_json::from_slice(&v.relay(|k| k.len() == 2, &[("model", &set)])).unwrap();
                    let mut expected = object.clone();
                    expected.retain(|k, _| k.len() != 2);
                    expected.insert("model".into(), set.clone());
                    prop_assert_eq!(relayed, Value::Object(expected));
                }
                None => prop_assert!(object.keys().any(|k| k.contains('"') || k.contains('\\')), "only escaped keys fall back"),
            }
        }
    }
}
