//! Where values stand in a JSON text, found without reading them (issue 33): the top-level
//! fields of an object, the items of an array, the end of a value. Strings are skipped with
//! `memchr` (a quote or a backslash, 32 bytes at a time with AVX2), so walking a 150 KB agent
//! history costs a few instructions per string, where reading it (serde_json, even to skip it)
//! looks at every byte eight at a time and copies every string.
//!
//! A scan does not validate what it skips: it answers `None` for anything it does not expect
//! (an escaped or control character in a key, a missing separator, trailing bytes), and the
//! caller then reads the text with serde_json, which accepts or refuses it. Its users take a
//! value it skipped as valid JSON only when serde_json read the same bytes whole before
//! ([`crate::chat_request`]'s remembered history) or when they read the span themselves.
//! Hand-rolled because no JSON crate here hands back the spans of what it skips.

use std::ops::Range;

/// Just past the white space at `at`.
pub fn skip_space(text: &[u8], mut at: usize) -> usize {
    while text.get(at).is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// Just past the last byte before `end` that is not white space.
pub fn back_space(text: &[u8], mut end: usize) -> usize {
    while end > 0 && text.get(end - 1).is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        end -= 1;
    }
    end
}

/// The index just past the string that opens at `at`. Only quotes stop the search: a quote
/// ends the string unless an odd run of backslashes precedes it (as simdjson tells them), so
/// the escapes of a tool's output (a `\n` every line) cost nothing.
pub fn string_end(text: &[u8], at: usize) -> Option<usize> {
    let mut from = at + 1;
    loop {
        let quote = next_quote(text, from)?;
        let mut before = quote;
        // Stops at the opening quote at the latest.
        while before > at + 1 && text.get(before - 1) == Some(&b'\\') {
            before -= 1;
        }
        if (quote - before).is_multiple_of(2) {
            return Some(quote + 1);
        }
        from = quote + 1;
    }
}

/// The index of the first quote at or after `from`. Most strings are short (keys, ids, a
/// block's type, a schema's names): their first 16 bytes are looked at a word at a time, which
/// costs less than memchr's set-up for a call; a longer one is searched by memchr from there.
fn next_quote(text: &[u8], from: usize) -> Option<usize> {
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    const LOW: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let mut at = from;
    for _ in 0..2 {
        let Some(word) = text.get(at..at + 8).and_then(|word| <[u8; 8]>::try_from(word).ok()) else { break };
        // A zero byte of `word ^ QUOTES` is a quote; the lowest flag is the first (a borrow
        // can only flag bytes above a zero one).
        let quotes = u64::from_le_bytes(word) ^ QUOTES;
        let flags = quotes.wrapping_sub(LOW) & !quotes & HIGH;
        if flags != 0 {
            return Some(at + (flags.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    Some(at + memchr::memchr(b'"', text.get(at..)?)?)
}

/// A value found: where it ends, and how deeply it nests (0 for a string or a scalar, 1 for an
/// object or array of scalars): serde_json refuses text nested past its recursion limit, which
/// a reader of the span alone would not see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub end: usize,
    pub depth: usize,
}

/// The value that starts at `at` (not at white space).
pub fn value_end(text: &[u8], at: usize) -> Option<Found> {
    match text.get(at)? {
        b'"' => Some(Found { end: string_end(text, at)?, depth: 0 }),
        b'{' | b'[' => {
            let (mut depth, mut deepest) = (0usize, 0usize);
            let mut i = at;
            loop {
                match text.get(i)? {
                    b'"' => {
                        i = string_end(text, i)?;
                        continue;
                    }
                    b'{' | b'[' => {
                        depth += 1;
                        deepest = deepest.max(depth);
                    }
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(Found { end: i + 1, depth: deepest });
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let rest = text.get(at..)?;
            let len = rest.iter().position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))?;
            (len > 0).then_some(Found { end: at + len, depth: 0 })
        }
    }
}

/// A top-level field of an object text: its key (written without escapes), where the key's
/// text starts (just past its quote), its value, and the items of that value when it was asked
/// for them and it is an array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field<'t> {
    pub key: &'t str,
    pub key_at: usize,
    pub value: Range<usize>,
    pub depth: usize,
    pub items: Option<Vec<Item>>,
}

/// Each top-level field of `text`, an object and nothing else but white space; the fields named
/// in `itemised` with their items, found in the same pass. `None` for a key written with
/// escapes or holding a control character, or anything but an object.
pub fn fields<'t>(text: &'t [u8], itemised: &[&str]) -> Option<Vec<Field<'t>>> {
    fields_knowing(text, itemised, |_, _| None)
}

/// [`fields`], where `known(key, at)` may tell where the value of `key` that starts at `at`
/// ends without its being scanned, all of it or its first items (bytes read before: they end
/// where they did, a JSON value being delimited by its own bytes), and the items of an array
/// after those ([`items_after`]); such a field's depth is that of the items it was given.
pub fn fields_knowing<'t>(
    text: &'t [u8],
    itemised: &[&str],
    mut known: impl FnMut(&str, usize) -> Option<(usize, Option<Vec<Item>>)>,
) -> Option<Vec<Field<'t>>> {
    let mut at = skip_space(text, 0);
    (text.get(at) == Some(&b'{')).then_some(())?;
    at = skip_space(text, at + 1);
    let mut fields = Vec::new();
    if text.get(at) == Some(&b'}') {
        return (skip_space(text, at + 1) == text.len()).then_some(fields);
    }
    loop {
        (text.get(at) == Some(&b'"')).then_some(())?;
        let end = string_end(text, at)?;
        let key = std::str::from_utf8(text.get(at + 1..end - 1)?)
            .ok()
            .filter(|key| !key.bytes().any(|b| b == b'\\' || b < 0x20))?;
        let key_at = at + 1;
        at = skip_space(text, end);
        (text.get(at) == Some(&b':')).then_some(())?;
        let start = skip_space(text, at + 1);
        let (found, items) = match known(key, start) {
            Some((end, items)) => {
                let depth = items.iter().flatten().map(|item| 1 + item.depth).max().unwrap_or(0);
                (Found { end, depth }, items)
            }
            None if itemised.contains(&key) && text.get(start) == Some(&b'[') => {
                let (items, end) = items_at(text, start)?;
                let depth = 1 + items.iter().map(|item| item.depth).max().unwrap_or(0);
                (Found { end, depth }, Some(items))
            }
            None => (value_end(text, start)?, None),
        };
        fields.push(Field { key, key_at, value: start..found.end, depth: found.depth, items });
        at = skip_space(text, found.end);
        match text.get(at)? {
            b',' => at = skip_space(text, at + 1),
            b'}' => return (skip_space(text, at + 1) == text.len()).then_some(fields),
            _ => return None,
        }
    }
}

/// An item of an array: its span and how deeply it nests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub span: Range<usize>,
    pub depth: usize,
}

/// Each item of the array that `span` of `text` holds; `None` when it holds no array.
pub fn items(text: &[u8], span: Range<usize>) -> Option<Vec<Item>> {
    let (items, end) = items_at(text.get(..span.end)?, skip_space(text, span.start))?;
    (end == span.end).then_some(items)
}

/// The items of the array that opens at `at`, and the index just past it.
fn items_at(text: &[u8], mut at: usize) -> Option<(Vec<Item>, usize)> {
    (text.get(at) == Some(&b'[')).then_some(())?;
    at = skip_space(text, at + 1);
    if text.get(at) == Some(&b']') {
        return Some((Vec::new(), at + 1));
    }
    items_from(text, at, Vec::new())
}

/// The items of an array after those it holds up to `at`, where an item ends (a separator or
/// the array's end follows), and the index just past the array.
pub fn items_after(text: &[u8], at: usize) -> Option<(Vec<Item>, usize)> {
    let at = skip_space(text, at);
    match text.get(at)? {
        b',' => items_from(text, skip_space(text, at + 1), Vec::new()),
        b']' => Some((Vec::new(), at + 1)),
        _ => None,
    }
}

/// `items`, then each item from `at`, where one starts.
fn items_from(text: &[u8], mut at: usize, mut items: Vec<Item>) -> Option<(Vec<Item>, usize)> {
    loop {
        let found = value_end(text, at)?;
        items.push(Item { span: at..found.end, depth: found.depth });
        at = skip_space(text, found.end);
        match text.get(at)? {
            b',' => at = skip_space(text, at + 1),
            b']' => return Some((items, at + 1)),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    #[test]
    fn fields_and_items_are_found_where_they_stand() {
        let text = br#" { "a" : [1, "x\"]", {"b": [ ]} ] , "c":"}" , "d":-1.5e3 } "#;
        let found = fields(text, &[]).unwrap();
        let keys: Vec<&str> = found.iter().map(|f| f.key).collect();
        assert_eq!(keys, ["a", "c", "d"]);
        let span = |r: &Range<usize>| std::str::from_utf8(&text[r.clone()]).unwrap().to_string();
        assert_eq!(span(&found[0].value), r#"[1, "x\"]", {"b": [ ]} ]"#);
        assert_eq!(found[0].depth, 3);
        assert_eq!(span(&found[1].value), r#""}""#);
        assert_eq!(span(&found[2].value), "-1.5e3");
        let list = items(text, found[0].value.clone()).unwrap();
        let spans: Vec<String> = list.iter().map(|i| span(&i.span)).collect();
        assert_eq!(spans, ["1", r#""x\"]""#, r#"{"b": [ ]}"#]);
        assert_eq!(items(b"[ ]", 0..3).unwrap(), []);
        assert!(items(b"{}", 0..2).is_none(), "not an array");
        for bad in [&br#"{"a\u0062":1}"#[..], br#"{"a":1,}"#, br#"{"a":1} x"#, br#"{"a" 1}"#, b"[1]", b"{\"a\x01\":1}"]
        {
            assert!(fields(bad, &[]).is_none(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(items(b"[1,]", 0..4).is_none() && items(b"[1 2]", 0..5).is_none());
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-z\"\\\\\\]\\[{}, \n\u{e9}]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,3}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The first quote is found wherever it stands: in the first words or after them.
        #[test]
        fn the_first_quote_is_found(text in "[a\"\\\\\u{e9}]{0,40}", from in 0usize..40) {
            let text = text.as_bytes();
            let want = text.get(from..).and_then(|rest| rest.iter().position(|b| *b == b'"')).map(|i| from + i);
            prop_assert_eq!(next_quote(text, from), want);
        }

        /// Whatever valid JSON, compact or pretty, each field's and item's span reads back as
        /// the value serde_json reads there.
        #[test]
        fn spans_read_as_the_values(
            object in prop::collection::btree_map("[a-z]{1,4}", json(), 0..6),
            pretty in any::<bool>(),
        ) {
            let value = Value::Object(object.into_iter().collect());
            let text = if pretty { serde_json::to_vec_pretty(&value) } else { serde_json::to_vec(&value) }.unwrap();
            let found = fields(&text, &[]).unwrap();
            let every: Vec<&str> = found.iter().map(|f| f.key).collect();
            let listed = fields(&text, &every).unwrap();
            prop_assert_eq!(found.len(), listed.len());
            for (field, with) in found.iter().zip(&listed) {
                prop_assert_eq!((&field.value, field.depth), (&with.value, with.depth));
                if with.items.is_some() {
                    prop_assert_eq!(&with.items, &items(&text, field.value.clone()));
                }
            }
            let Value::Object(map) = &value else { unreachable!() };
            prop_assert_eq!(found.len(), map.len());
            for field in &found {
                let read: Value = serde_json::from_slice(&text[field.value.clone()]).unwrap();
                prop_assert_eq!(&read, &map[field.key]);
                if let Value::Array(list) = &read {
                    let spans = items(&text, field.value.clone()).unwrap();
                    prop_assert_eq!(spans.len(), list.len());
                    for (item, want) in spans.iter().zip(list) {
                        let read: Value = serde_json::from_slice(&text[item.span.clone()]).unwrap();
                        prop_assert_eq!(&read, want);
                    }
                }
            }
        }
    }
}
