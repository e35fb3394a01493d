//! A body's top-level fields as the JSON text they were sent as (issue 33). The same-shape path
//! relays a caller's body with a few top-level fields replaced (`model`, `stream`, a target's
//! `extra_body`); writing it from the parsed tree re-escaped every string of a 150 KB agent
//! history (42 % of the request's instructions), and capturing the fields as serde_json
//! `RawValue`s re-validated every byte (a quarter of them). This finds where each top-level
//! value starts and ends in a body serde_json has parsed, and relays those bytes unchanged (as
//! slices of the body as read, [`crate::spliced`], not copies): from where the direct readers
//! met each key ([`Verbatim::of_keys`], a few bytes read per
//! field), or, for a body read as a tree, by scanning it, skipping strings with `memchr`.
//!
//! Hand-rolled because no JSON crate here hands back the spans of a parse it has made; it reads
//! only bodies serde_json accepted, and answers `None` (the caller then writes from the tree)
//! for anything it does not expect: an escaped key, a duplicate key, trailing bytes.

use std::ops::Range;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::json_scan::{back_space, skip_space};
use crate::spliced::{Spliced, Splicer};

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

/// More top-level keys than any API's request has ([`Verbatim::of_keys`]).
pub const MOST_KEYS: usize = 64;

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

    /// `body`'s fields from where a direct reader found its top-level keys ([`Keys`]), when they
    /// were all written without escapes and are distinct. A body serde_json read whole is
    /// `{ "key" : value , "key" : value }` with white space anywhere between: each value runs
    /// from just past its key's colon to just before the comma that precedes the next key (or
    /// the closing brace), so its span follows from the keys alone. Finding the spans this way
    /// reads a few bytes around each key instead of every byte of the values again ([`spans`]:
    /// a tenth of a 148 KB agent request's CPU on Intel Xeon, `perf`, issue 33).
    pub fn of_keys(body: &Bytes, keys: Keys) -> Option<Verbatim> {
        let Keys(mut keys) = keys;
        let text: &[u8] = body;
        // An object: a reader that met no key may have read an array or a string.
        (text.get(skip_space(text, 0)) == Some(&b'{')).then_some(())?;
        // Distinct keys are checked each against those before it: a body of more keys than any
        // request has is written from its parsed fields instead, so that many thousand keys
        // cannot make the check quadratic.
        (keys.len() <= MOST_KEYS).then_some(())?;
        let mut fields: Vec<(String, Range<usize>)> = Vec::with_capacity(keys.len());
        for i in 0..keys.len() {
            let (key, at) = keys.get_mut(i).map(|(key, at)| (std::mem::take(key), *at))?;
            let at = at?;
            let key_end = at + key.len();
            (at >= 1 && text.get(at - 1) == Some(&b'"') && text.get(key_end) == Some(&b'"')).then_some(())?;
            let colon = skip_space(text, key_end + 1);
            (text.get(colon) == Some(&b':')).then_some(())?;
            let start = skip_space(text, colon + 1);
            let end = match keys.get(i + 1) {
                Some((_, next)) => {
                    let comma = back_space(text, (*next)?.checked_sub(1)?);
                    (text.get(comma.checked_sub(1)?) == Some(&b',')).then_some(())?;
                    back_space(text, comma - 1)
                }
                None => {
                    let close = back_space(text, text.len());
                    (text.get(close.checked_sub(1)?) == Some(&b'}')).then_some(())?;
                    back_space(text, close - 1)
                }
            };
            (start < end && fields.iter().all(|(k, _)| *k != key)).then_some(())?;
            fields.push((key, start..end));
        }
        Some(Verbatim { text: body.clone(), fields })
    }

    /// The value of field `key`, parsed (`None` too for text that is not JSON, which a body read
    /// whole never holds).
    pub fn value(&self, key: &str) -> Option<Value> {
        let (_, span) = self.fields.iter().rev().find(|(k, _)| k == key)?;
        serde_json::from_slice(self.text.get(span.clone())?).ok()
    }

    /// A JSON object: every field as sent but those `replaced` names, then `set` (a later entry
    /// of a key wins, as with a map's insert). Long values are slices of the body as read, not
    /// copies ([`Spliced`]).
    pub fn relay(&self, replaced: impl Fn(&str) -> bool, set: &[(&str, &Value)]) -> Spliced {
        let mut out = Splicer::default();
        out.text().push(b'{');
        let mut first = true;
        for (key, span) in self.fields.iter().filter(|(key, _)| !replaced(key) && !set.iter().any(|(k, _)| k == key)) {
            push_key(out.text(), key, &mut first);
            out.share(&self.text, span.clone());
        }
        for (i, (key, value)) in set.iter().enumerate() {
            if !set.get(i + 1..).unwrap_or_default().iter().any(|(later, _)| later == key) {
                push_key(out.text(), key, &mut first);
                crate::json_write::push_value(out.text(), value);
            }
        }
        out.text().push(b'}');
        out.finish()
    }
}

fn push_key(out: &mut Vec<u8>, key: &str, first: &mut bool) {
    if !std::mem::take(first) {
        out.push(b',');
    }
    crate::json_write::push_str(out, key);
    out.push(b':');
}

/// Each top-level key (as written, unescaped keys only) with the span of its value.
fn spans(body: &[u8]) -> Option<Vec<(&str, Range<usize>)>> {
    Some(crate::json_scan::fields(body, &[])?.into_iter().map(|field| (field.key, field.value)).collect())
}

/// The top-level keys of a body as a direct reader met them, in order, each with the offset
/// of its text in the body (just past the opening quote) when the reader took it straight
/// from the body, `None` when it had to copy it (a key written with escapes).
#[derive(Debug, Default)]
pub struct Keys(Vec<(String, Option<usize>)>);

impl Keys {
    /// Notes `key`, a top-level key the reader of `body` met: it lies inside `body` when serde_json
    /// lent it from there (a copied key lives in an allocation of its own, which cannot overlap
    /// the body).
    pub fn met(&mut self, body: &[u8], key: &str) {
        let (start, at) = (body.as_ptr() as usize, key.as_ptr() as usize);
        let inside = at >= start && at + key.len() <= start + body.len();
        self.0.push((key.to_string(), inside.then(|| at - start)));
    }

    /// Notes `key`, whose text starts at `at` in the body (a scan found it there).
    pub fn found(&mut self, key: &str, at: usize) {
        self.0.push((key.to_string(), Some(at)));
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
        let out =
            String::from_utf8(v.relay(|key| key == "t", &[("model", &model), ("extra", &json!(2))]).to_vec()).unwrap();
        assert_eq!(out, r#"{"n":1e0,"text":"a\"b\\c}]","nested":{"x": [1, {"y": "}"}]},"model":"target","extra":2}"#);
        assert!(verbatim(r#"{"a": 1, "a": 2}"#).is_none(), "duplicate keys take the parsed path");
        assert!(verbatim(r#"{"\u0061": 1}"#).is_none(), "escaped keys take the parsed path");
        assert_eq!(verbatim("{}").unwrap().relay(|_| false, &[]).to_vec(), b"{}");
    }

    proptest! {
        /// Whatever the object, the relayed body reads as the parsed one with `set` applied.
        #[test]
        fn relayed_bodies_read_as_the_parsed_ones(
            fields in prop::collection::btree_map("[a-z \"\\\\]{0,6}", any::<(i64, String, Option<bool>)>(), 0..8),
            pretty in any::<bool>(),
        ) {
            let object: Map<String, Value> = fields.into_iter()
                // `p`: values on both sides of the length from which the relay shares a slice
                // of the body instead of copying it.
                .map(|(k, (n, s, b))| (k, json!({"n": n, "s": s, "b": b, "l": [s, n, {"}": "]"}], "p": "a\\".repeat((n.unsigned_abs() % 700) as usize)})))
                .collect();
            let value = Value::Object(object.clone());
            let body = if pretty { serde_json::to_string_pretty(&value).unwrap() } else { value.to_string() };
            let set = json!("x");
            match verbatim(&body) {
                Some(v) => {
                    let relayed: Value = serde_json::from_slice(&v.relay(|k| k.len() == 2, &[("model", &set)]).to_vec()).unwrap();
                    let mut expected = object.clone();
                    expected.retain(|k, _| k.len() != 2);
                    expected.insert("model".into(), set.clone());
                    prop_assert_eq!(relayed, Value::Object(expected));
                }
                None => prop_assert!(object.keys().any(|k| k.contains('"') || k.contains('\\')), "only escaped keys fall back"),
            }
        }

        /// The spans found from where a reader met the keys are the spans the scan of every
        /// byte finds, whatever the white space (also between a value and its comma), the
        /// values, and the keys (escaped or repeated ones fall back, as with the scan).
        #[test]
        fn spans_from_the_keys_are_the_scanned_spans(
            fields in prop::collection::vec(("[a-z\"\\\\]{0,4}", any::<(i64, String, Option<bool>)>()), 0..8),
            space in prop::collection::vec(prop_oneof![Just(""), Just(" "), Just("\n  "), Just("\t\r\n")], 6),
        ) {
            let mut body = format!("{}{{", space[0]);
            for (i, (key, (n, text, flag))) in fields.iter().enumerate() {
                let value = json!({"n": n, "s": text, "b": flag, "l": [text, n, {"}": "],\""}]});
                let value = if i % 3 == 0 { value } else { json!(text) };
                if i > 0 {
                    body.push_str(&format!("{},{}", space[1], space[2]));
                }
                body.push_str(&format!("{}{}{}:{}{value}", json!(key), space[3], space[4], space[5]));
            }
            body.push_str(&format!("{}}}{}", space[1], space[0]));
            let bytes = Bytes::from(body.clone());
            let by_keys = Verbatim::of_keys(&bytes, keys_of(&bytes));
            let parsed: Map<String, Value> = serde_json::from_str(&body).unwrap();
            let distinct = parsed.len() == fields.len();
            let scanned = Verbatim::of(&bytes, &parsed).filter(|_| distinct);
            prop_assert_eq!(by_keys.map(|v| v.fields), scanned.map(|v| v.fields), "{}", body);
        }
    }

    /// The keys of an object body as a direct reader meets them.
    fn keys_of(body: &[u8]) -> Keys {
        struct Visit<'b>(&'b [u8]);
        impl<'de> serde::de::Visitor<'de> for Visit<'_> {
            type Value = Keys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                let mut keys = Keys::default();
                while let Some(key) = map.next_key::<crate::json_read::Key>()? {
                    keys.met(self.0, &key.0);
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
                Ok(keys)
            }
        }
        serde::Deserializer::deserialize_map(&mut serde_json::Deserializer::from_slice(body), Visit(body)).unwrap()
    }
}
