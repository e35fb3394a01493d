//! Writing a `serde_json::Value` as JSON text, byte for byte what `serde_json::to_vec` writes,
//! with strings escaped sixteen bytes at a time (issue 33).
//!
//! Why hand-rolled: a request converted from one API shape to another (Claude Code's Messages
//! body to an OpenAI target, say) is rendered as a `Value` and written out, and nearly all of
//! it is long strings — tool output, file contents, the system prompt. serde_json's writer looks
//! up every byte of a string in its escape table (`format_escaped_str`: 29 % of the instructions
//! of a converted 148 KB request, ~9 per byte), and offers no hook to write a string another
//! way. Here a block of sixteen bytes that holds no quote, backslash or control character (most
//! blocks of such text) is passed over with a handful of operations, and the escapes that
//! are needed are serde_json's own, so the output is identical (the tests hold it to that).
//! Numbers are still written by serde_json.

use serde_json::{Map, Value};

/// `map` as a JSON object, the bytes `serde_json::to_vec(map)` gives.
pub fn map_to_vec(map: &Map<String, Value>) -> Vec<u8> {
    map_to_vec_sized(map, 0)
}

/// `map` written into a buffer sized once for it and `more` bytes after it. A converted agent
/// request is ~150 KB of text: a buffer grown as it is written was reallocated and copied a
/// dozen times over (`finish_grow`, 14 % of a converted 148 KB request's instructions).
fn map_to_vec_sized(map: &Map<String, Value>, more: usize) -> Vec<u8> {
    let size = map_size(map) + more;
    // Escapes (a newline or a quote is two bytes written) are a few in a hundred bytes of such
    // text, code with its quotes included.
    let mut out = Vec::with_capacity(size + size / 16 + 16);
    push_map(&mut out, map);
    out
}

/// About the length of `value` written: exact but for escapes and numbers. A walk of the tree's
/// lengths, not of its bytes.
fn value_size(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 20,
        Value::String(text) => text.len() + 2,
        Value::Array(items) => items.iter().map(|item| value_size(item) + 1).sum::<usize>() + 2,
        Value::Object(map) => map_size(map),
    }
}

fn map_size(map: &Map<String, Value>) -> usize {
    map.iter().map(|(key, value)| key.len() + 4 + value_size(value)).sum::<usize>() + 2
}

/// `map` as a JSON object followed by `raw` fields, each value JSON text written as it is (a
/// tool schema as the caller sent it, say: [`crate::exchange::Schema`]). A key the map holds
/// already is not written again: the map's value stands, as a later `insert` into the map
/// would have replaced the raw one.
pub fn map_to_vec_with(map: &Map<String, Value>, raw: &[(&str, &[u8])]) -> Vec<u8> {
    let mut object = Object::new(map, raw.iter().map(|(key, value)| key.len() + value.len() + 4).sum());
    for (key, value) in raw {
        object.field(key, |out| out.extend_from_slice(value));
    }
    object.finish()
}

/// A JSON object written into one buffer: `map`'s fields, then fields each written straight
/// into the buffer by its writer ([`Object::field`]). A converted agent history is ~150 KB:
/// written where it goes, not written apart and copied in (twice, with its messages'
/// reordering: 11 % of a converted 148 KB request's instructions).
pub struct Object<'m> {
    map: &'m Map<String, Value>,
    /// The object so far, without its closing `}`.
    out: Vec<u8>,
}

impl<'m> Object<'m> {
    /// The object with `map`'s fields, in a buffer sized for `more` bytes of fields after them.
    pub fn new(map: &'m Map<String, Value>, more: usize) -> Self {
        let mut out = map_to_vec_sized(map, more);
        out.pop();
        Object { map, out }
    }

    /// Adds field `key`, whose JSON value `write` appends. A key the map holds already is not
    /// written again: the map's value stands, as a later `insert` into the map would have
    /// replaced this one.
    pub fn field(&mut self, key: &str, write: impl FnOnce(&mut Vec<u8>)) {
        if self.map.contains_key(key) {
            return;
        }
        if self.out.len() > 1 {
            self.out.push(b',');
        }
        push_str(&mut self.out, key);
        self.out.push(b':');
        write(&mut self.out);
    }

    /// The object's JSON text.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(b'}');
        self.out
    }
}

/// Appends a JSON array of `items`, each written by `write` (one JSON value each).
pub fn push_array<T>(out: &mut Vec<u8>, items: impl IntoIterator<Item = T>, mut write: impl FnMut(&mut Vec<u8>, T)) {
    out.push(b'[');
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write(out, item);
    }
    out.push(b']');
}

/// Appends `value` as JSON text.
pub fn push_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // Writing to a Vec cannot fail, and a Number is always finite.
        Value::Number(number) => {
            let _ = serde_json::to_writer(&mut *out, number);
        }
        Value::String(text) => push_str(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                push_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => push_map(out, map),
    }
}

/// Appends `map` as a JSON object, its entries in the map's order (as serde_json writes them).
pub fn push_map(out: &mut Vec<u8>, map: &Map<String, Value>) {
    out.push(b'{');
    for (i, (key, value)) in map.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_str(out, key);
        out.push(b':');
        push_value(out, value);
    }
    out.push(b'}');
}

/// Appends `text` as a JSON string: quoted, with `"`, `\` and the control characters escaped as
/// serde_json escapes them (`\n`, `\t`, … and `\u00XX` for the rest); everything else, UTF-8
/// included, as it is.
pub fn push_str(out: &mut Vec<u8>, text: &str) {
    out.reserve(text.len() + 2);
    out.push(b'"');
    push_escaped(out, text);
    out.push(b'"');
}

/// Appends `text` escaped as the inside of a JSON string.
pub fn push_escaped(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len());
    // `written`: where the bytes not yet copied to `out` start.
    let mut written = 0;
    // Sixteen bytes at a time, as two words whose flags are tested together: most blocks of
    // prose, code and tool output hold nothing to escape and cost one test. The last few bytes
    // are padded with spaces, which need no escape.
    let blocks = bytes.chunks_exact(16);
    let mut last = [b' '; 16];
    last.iter_mut().zip(blocks.remainder()).for_each(|(slot, byte)| *slot = *byte);
    let word = |block: &[u8], from: usize| {
        let eight = block.get(from..from + 8).and_then(|eight| <[u8; 8]>::try_from(eight).ok());
        u64::from_le_bytes(eight.unwrap_or([b' '; 8]))
    };
    for (index, block) in blocks.chain([&last[..]]).enumerate() {
        let (low, high) = (escapes(word(block, 0)), escapes(word(block, 8)));
        if low | high == 0 {
            continue;
        }
        // Only the bytes flagged are looked at: in code and tool output a block with a newline
        // is common, and the rest of its bytes need nothing.
        for (mut flagged, half) in [(low, 0), (high, 8)] {
            while flagged != 0 {
                let offset = half + (flagged.trailing_zeros() / 8) as usize;
                escape(out, bytes, &mut written, index * 16 + offset, block.get(offset).copied().unwrap_or(b' '));
                flagged &= flagged - 1;
            }
        }
    }
    out.extend_from_slice(bytes.get(written..).unwrap_or_default());
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;
const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// The high bit of each byte of `word` that is a quote, a backslash or below 0x20, and no other
/// bit. Exact per byte: each byte's low seven bits are added to a constant that cannot carry
/// into the next byte, so a flag never spills over from its neighbour.
fn escapes(word: u64) -> u64 {
    // High bit set where the byte is not zero.
    let nonzero = |v: u64| ((v & LOW7) + LOW7) | v;
    // High bit set where the byte is 0x20 or more (its low seven bits reach 0x20, or its own
    // high bit is set).
    let at_least_space = ((word & LOW7) + ONES * 0x60) | word;
    let quote = nonzero(word ^ (ONES * u64::from(b'"')));
    let backslash = nonzero(word ^ (ONES * u64::from(b'\\')));
    !(at_least_space & quote & backslash) & HIGHS
}

/// Copies the clean run before the byte at `at`, then its escape (a byte that needs none is
/// left in the run).
fn escape(out: &mut Vec<u8>, bytes: &[u8], written: &mut usize, at: usize, byte: u8) {
    let short: &[u8] = match byte {
        b'"' => b"\\\"",
        b'\\' => b"\\\\",
        b'\n' => b"\\n",
        b'\r' => b"\\r",
        b'\t' => b"\\t",
        0x08 => b"\\b",
        0x0c => b"\\f",
        0x00..=0x1f => b"",
        _ => return,
    };
    out.extend_from_slice(bytes.get(*written..at).unwrap_or_default());
    *written = at + 1;
    if short.is_empty() {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digit = |nibble: u8| HEX.get(usize::from(nibble)).copied().unwrap_or(b'0');
        out.extend_from_slice(&[b'\\', b'u', b'0', b'0', digit(byte >> 4), digit(byte & 0xf)]);
    } else {
        out.extend_from_slice(short);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn to_vec(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        push_value(&mut out, value);
        out
    }

    fn same_as_serde(value: &Value) {
        assert_eq!(String::from_utf8(to_vec(value)).unwrap(), serde_json::to_string(value).unwrap(), "{value:?}");
    }

    #[test]
    fn every_byte_that_needs_escaping_at_every_position_of_a_block() {
        for byte in (0u8..0x20).chain([b'"', b'\\', 0x7f]) {
            for position in 0..40 {
                let mut text = "abcdefghijklmnopqrstuvwxyz0123456789ABCD".to_string().into_bytes();
                text.truncate(position);
                text.push(byte);
                text.extend_from_slice("é after ✓".as_bytes());
                same_as_serde(&Value::String(String::from_utf8(text.clone()).unwrap()));
                // And with another at every position after it, in the same block or the next.
                for second in position + 1..40 {
                    let mut both = text.clone();
                    both.truncate(second);
                    both.push(b'\n');
                    if let Ok(text) = String::from_utf8(both) {
                        same_as_serde(&Value::String(text));
                    }
                }
            }
        }
    }

    #[test]
    fn a_converted_history_is_written_without_growing_its_buffer() {
        // Tool output: lines of code, a newline (two bytes written) every ~60.
        let line = "    let value = config.get(\"path\").unwrap_or_default(); // x\n";
        let history: Vec<Value> = (0..400)
            .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": line.repeat(5)}))
            .collect();
        let Value::Object(map) = json!({"model": "m", "messages": history, "max_tokens": 1024}) else { panic!() };
        let size = map_size(&map);
        let out = map_to_vec(&map);
        assert!(out.len() <= size + size / 16 + 16, "{} written, {size} reserved", out.len());
        assert_eq!(out, serde_json::to_vec(&map).unwrap());
    }

    #[test]
    fn values_of_every_kind() {
        same_as_serde(&json!(null));
        same_as_serde(&json!({"a": [1, -2, 3.5, 1e300, true, false, null, "x\"y"], "": {}, "k\n": []}));
        same_as_serde(&json!(u64::MAX));
        same_as_serde(&json!(""));
    }

    fn values() -> impl Strategy<Value = Value> {
        let text = prop_oneof![any::<String>(), "[a-z\"\\\\\n\t\u{0}-\u{1f}é✓ ]{0,40}"];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
            text.prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::vec(("[a-z\"\\\\\n]{0,6}", inner), 0..8)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn writes_what_serde_json_writes(value in values()) {
            prop_assert_eq!(to_vec(&value), serde_json::to_vec(&value).unwrap());
            if let Value::Object(map) = &value {
                prop_assert_eq!(map_to_vec(map), serde_json::to_vec(map).unwrap());
            }
        }

        /// Raw fields join the object as if inserted, unless the map has their key.
        #[test]
        fn raw_fields_join_the_object(
            map in prop::collection::btree_map("[a-z]{0,3}", values(), 0..5),
            raw in prop::collection::btree_map("[a-z]{0,3}", values(), 0..3),
        ) {
            let map: Map<String, Value> = map.into_iter().collect();
            let texts: Vec<(String, Vec<u8>)> =
                raw.iter().map(|(key, value)| (key.clone(), serde_json::to_vec_pretty(value).unwrap())).collect();
            let fields: Vec<(&str, &[u8])> = texts.iter().map(|(key, text)| (key.as_str(), text.as_slice())).collect();
            let mut expected = map.clone();
            for (key, value) in &raw {
                expected.entry(key.clone()).or_insert_with(|| value.clone());
            }
            let written: Value = serde_json::from_slice(&map_to_vec_with(&map, &fields)).unwrap();
            // Through text on both sides: serde_json reads some floats back a bit off.
            let expected: Value = serde_json::from_slice(&serde_json::to_vec(&expected).unwrap()).unwrap();
            prop_assert_eq!(written, expected);
        }

        #[test]
        fn any_string(text in any::<String>()) {
            let mut out = Vec::new();
            push_str(&mut out, &text);
            prop_assert_eq!(out, serde_json::to_vec(&text).unwrap());
        }
    }
}
