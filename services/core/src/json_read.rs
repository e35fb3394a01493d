//! Reading JSON straight into typed values with serde visitors, without a `serde_json::Value`
//! tree of what is read (issue 33): the shared parts of the direct readers of large request
//! bodies (`chat_request`'s for Chat Completions, the proxy's for Anthropic's Messages).
//!
//! A [`Reader`] says what it makes of each JSON type; [`Lenient`] makes it a serde seed; every
//! object goes through [`entries`], which refuses serde_json's raw-value token (a tree reads an
//! object keyed by it as the JSON in its string, so only a tree reading reads such a body as
//! serde_json servers do); [`Skip`] drops a value under serde_json's recursion limit;
//! [`checked`] holds a value kept as its text (a `RawValue`) to what a tree would accept.

use std::collections::HashSet;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The error a read stops with where only a tree reading reads the body as a serde_json server
/// would: at the raw-value token (no API's key), or at a value kept as text that a tree refuses
/// ([`checked`]). A caller reads the body as a tree instead, which accepts or refuses it.
pub const TREE_ONLY: &str = "shield: read as a tree";

/// What a reader makes of each JSON type; a type it does not expect reads as `Out::default()`
/// (consumed and ignored).
pub trait Reader<'de>: Sized {
    type Out: Default;

    fn str(self, _: &str) -> Self::Out {
        Self::Out::default()
    }

    fn bool(self, _: bool) -> Self::Out {
        Self::Out::default()
    }

    fn null(self) -> Self::Out {
        Self::Out::default()
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Out, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Self::Out::default())
    }

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Out, A::Error> {
        // Through `entries`, as every object here, so that its keys are checked.
        entries(map, |_, map| map.next_value::<Skip>().map(drop))?;
        Ok(Self::Out::default())
    }
}

/// A value read and dropped. Unlike serde's `IgnoredAny`, which serde_json skips without its
/// recursion limit, this nests as the value does, so a body nested past the limit is refused
/// here as the tree reading refuses it.
pub struct Skip;

impl<'de> serde::Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Skip, D::Error> {
        Lenient(Dropped).deserialize(deserializer).map(|()| Skip)
    }
}

/// Reads anything into nothing.
pub struct Dropped;

impl<'de> Reader<'de> for Dropped {
    type Out = ();
}

/// A [`Reader`] as a serde seed and visitor.
pub struct Lenient<R>(pub R);

impl<'de, R: Reader<'de>> DeserializeSeed<'de> for Lenient<R> {
    type Value = R::Out;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<R::Out, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, R: Reader<'de>> Visitor<'de> for Lenient<R> {
    type Value = R::Out;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<R::Out, E> {
        Ok(self.0.bool(value))
    }

    fn visit_i64<E>(self, _: i64) -> Result<R::Out, E> {
        Ok(R::Out::default())
    }

    fn visit_u64<E>(self, _: u64) -> Result<R::Out, E> {
        Ok(R::Out::default())
    }

    fn visit_f64<E>(self, _: f64) -> Result<R::Out, E> {
        Ok(R::Out::default())
    }

    fn visit_unit<E>(self) -> Result<R::Out, E> {
        Ok(self.0.null())
    }

    fn visit_str<E>(self, text: &str) -> Result<R::Out, E> {
        Ok(self.0.str(text))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<R::Out, A::Error> {
        self.0.seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<R::Out, A::Error> {
        self.0.map(map)
    }
}

/// Reads a map's entries: `field` is called with each key, and reads that key's value. Every
/// object the direct reading does not parse into a `Value` goes through here: an object keyed
/// by serde_json's raw-value token (which a tree reads as the JSON in its string, in any
/// position it may take there) stops the read, and the body is read as a tree.
pub fn entries<'de, A: MapAccess<'de>>(
    mut map: A,
    mut field: impl FnMut(&str, &mut A) -> Result<(), A::Error>,
) -> Result<(), A::Error> {
    while let Some(Key(key)) = map.next_key()? {
        if key == crate::chat_request::RAW_VALUE_TOKEN {
            return Err(serde::de::Error::custom(TREE_ONLY));
        }
        field(&key, &mut map)?;
    }
    Ok(())
}

/// A key, borrowed from the body unless it was written with escapes (serde's own `Cow<str>`
/// always copies).
pub struct Key<'de>(pub std::borrow::Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }

            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(key)))
            }

            fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(key.to_string())))
            }
        }
        deserializer.deserialize_str(Visit)
    }
}

/// A string, or nothing.
#[derive(Clone, Copy)]
pub struct Text;

impl<'de> Reader<'de> for Text {
    type Out = Option<String>;

    fn str(self, text: &str) -> Option<String> {
        Some(text.to_string())
    }
}

/// A string field's value kept as the caller's JSON wrote it ([`crate::exchange::Text`]): a
/// converted request writes it as it came rather than unescaping and escaping it again
/// (issue 33). A value of another type stops the read ([`TREE_ONLY`]: the tree reading types
/// it), since capturing a value skips what a tree refuses in it (nesting past the limit,
/// numbers out of range).
pub struct KeptText;

impl<'de> DeserializeSeed<'de> for KeptText {
    type Value = crate::exchange::Text;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<crate::exchange::Text, D::Error> {
        let raw = <&'de serde_json::value::RawValue as serde::Deserialize>::deserialize(deserializer)
            .map_err(|_| serde::de::Error::custom(TREE_ONLY))?;
        kept(raw).ok_or_else(|| serde::de::Error::custom(TREE_ONLY))
    }
}

/// [`KeptText`] for a field where a value of another type is no text (as the tree reading
/// types it): such a value is checked as a tree checks it, `.0` being the depth serde_json has
/// left where it stands ([`checked`]), and read as `None`.
pub struct KeptTextOrNone(pub u8);

impl<'de> DeserializeSeed<'de> for KeptTextOrNone {
    type Value = Option<crate::exchange::Text>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        // Capturing skips the value without the checks a tree makes: any failure is the tree's
        // to name.
        let raw = <&'de serde_json::value::RawValue as serde::Deserialize>::deserialize(deserializer)
            .map_err(|_| serde::de::Error::custom(TREE_ONLY))?;
        if raw.get().starts_with('"') {
            return kept(raw).map(Some).ok_or_else(|| serde::de::Error::custom(TREE_ONLY));
        }
        checked::<D::Error>(raw.to_owned(), self.0, Schemas::Check(None)).map(|_| None)
    }
}

/// The text of a JSON string token: kept as sent, or (one with a surrogate escape) read as
/// serde_json reads it; `None` for a value of another type, or a string serde_json refuses.
pub fn kept(token: &serde_json::value::RawValue) -> Option<crate::exchange::Text> {
    if !token.get().starts_with('"') {
        return None;
    }
    let text = crate::exchange::Text::json(token);
    text.or_else(|| serde_json::from_str::<String>(token.get()).ok().map(crate::exchange::Text::from))
}

/// The text of a span holding one JSON string, kept as sent ([`KeptText`]); `None` for a span
/// serde_json refuses or that holds another type.
pub fn kept_span(span: &[u8]) -> Option<crate::exchange::Text> {
    let raw = serde_json::from_slice::<&serde_json::value::RawValue>(span).ok()?;
    kept(raw)
}

/// Each entry of an array, read by `R` (`None` when not an array).
#[derive(Clone, Copy)]
pub struct Each<R>(pub R);

impl<'de, R: Reader<'de> + Copy> Reader<'de> for Each<R> {
    type Out = Option<Vec<R::Out>>;

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Out, A::Error> {
        let mut all = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(one) = seq.next_element_seed(Lenient(self.0))? {
            all.push(one);
        }
        Ok(Some(all))
    }
}

/// `body`, one JSON value and nothing after it, read by `reader`. serde_json reading bytes
/// checks each string it meets on its own with the standard library's UTF-8 validator, ~5 % of
/// a 148 KB agent request's CPU (`perf`, Intel Xeon, issue 33); here the whole body is checked
/// once, with SIMD (simdutf8), and read as text, whose strings serde_json does not check again.
/// A body that is not UTF-8 is read as bytes, as before, so it is refused in serde_json's words.
pub fn whole<'de, R: Reader<'de>>(body: &'de [u8], reader: R) -> serde_json::Result<R::Out> {
    fn all<'de, I: serde_json::de::Read<'de>, R: Reader<'de>>(
        mut deserializer: serde_json::Deserializer<I>,
        reader: R,
    ) -> serde_json::Result<R::Out> {
        let out = Lenient(reader).deserialize(&mut deserializer)?;
        deserializer.end().map(|()| out)
    }
    match simdutf8::basic::from_utf8(body) {
        Ok(text) => all(serde_json::Deserializer::from_str(text), reader),
        Err(_) => all(serde_json::Deserializer::from_slice(body), reader),
    }
}

/// A value captured as its JSON text (serde_json's `RawValue`), checked as a tree reading would
/// check it. Capturing skips the value without serde_json's recursion limit, its check of
/// `\u` escapes (a lone surrogate) and its range of numbers (`1e999`), all of which a tree
/// reading refuses; so the text is walked once more through `deserialize_any`, which applies
/// them and allocates nothing but for a string written with escapes. `remaining` is the depth
/// serde_json has left where the value stands in its body (its limit, 128, less one for each
/// enclosing array or object), so a value nested past the limit counted from the body's root
/// is refused as the tree refuses it. On refusal the error is [`TREE_ONLY`].
///
/// The walk is a second pass over the captured text only: ~11 instructions a byte of a schema
/// (its keys and short strings are many tokens), against the ~19 a byte of the tree it
/// replaces (issue 33: the 24 tool schemas of an agent request, callgrind). A byte pre-scan that
/// skipped the walk for text with nothing a tree could refuse cost more than the walk (~15 a
/// byte as compiled) and was dropped.
///
/// `passed`: the tenant's schema texts that passed before ([`CheckedSchemas`]); one found there
/// is not walked again, and one that passes now is added.
pub fn checked<E: serde::de::Error>(
    raw: Box<serde_json::value::RawValue>,
    remaining: u8,
    schemas: Schemas<'_>,
) -> Result<Box<serde_json::value::RawValue>, E> {
    let passed = match schemas {
        Schemas::Passed => return Ok(raw),
        Schemas::Check(passed) => passed,
    };
    let key = passed.map(|passed| (passed, passed.key(raw.get(), remaining)));
    if key.is_some_and(|(passed, key)| passed.contains(key)) {
        return Ok(raw);
    }
    if !walked(raw.get(), remaining) {
        return Err(E::custom(TREE_ONLY));
    }
    if let Some((passed, key)) = key {
        passed.insert(key);
    }
    Ok(raw)
}

/// How [`checked`] checks a schema.
#[derive(Debug, Clone, Copy)]
pub enum Schemas<'p> {
    /// Walked as a tree would read it, unless the tenant's checked schemas hold it.
    Check(Option<&'p CheckedSchemas>),
    /// Not walked: read from bytes that were read whole and passed before (a `tools` array the
    /// tenant sent before, [`crate::remembered`]).
    Passed,
}

/// The schema texts one tenant sent that [`checked`] accepted, each as a keyed hash of the text
/// and the depth it stood at (issue 33). A coding agent resends the same tool schemas on every
/// turn; walking them again was 7.5 % of a 148 KB Chat Completions request's CPU (`perf`, AMD
/// EPYC), the hash of their text is a tenth of that. Only passes are kept, so what is refused
/// is refused every time, and a text at another depth is walked again. Kept per tenant (with
/// its guardrail memo, [`crate::verdicts::Memo::schemas`]) so that one tenant's requests never
/// run faster for what another sent; the hash is [`crate::keyed_hash`]'s under a key drawn for
/// the memo, so no caller can aim a text at another's entry. Bounded as the guardrail memo is:
/// two generations of [`SCHEMA_GENERATION`] entries.
pub struct CheckedSchemas {
    key: crate::keyed_hash::HashKey,
    generations: parking_lot::Mutex<[HashSet<(u128, u8)>; 2]>,
}

/// Schema texts per generation: ~40 agents' tool sets of two dozen tools each.
pub const SCHEMA_GENERATION: usize = 1024;

impl Default for CheckedSchemas {
    fn default() -> Self {
        CheckedSchemas { key: crate::keyed_hash::HashKey::random(), generations: parking_lot::Mutex::default() }
    }
}

impl std::fmt::Debug for CheckedSchemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedSchemas").finish_non_exhaustive()
    }
}

impl CheckedSchemas {
    fn key(&self, text: &str, remaining: u8) -> (u128, u8) {
        (self.key.hash(text.as_bytes()), remaining)
    }

    fn contains(&self, key: (u128, u8)) -> bool {
        let [current, older] = &mut *self.generations.lock();
        if current.contains(&key) {
            return true;
        }
        // Found in the older generation: kept into the current one.
        let found = older.remove(&key);
        if found {
            Self::add(current, older, key);
        }
        found
    }

    fn insert(&self, key: (u128, u8)) {
        let [current, older] = &mut *self.generations.lock();
        Self::add(current, older, key);
    }

    fn add(current: &mut HashSet<(u128, u8)>, older: &mut HashSet<(u128, u8)>, key: (u128, u8)) {
        if current.len() >= SCHEMA_GENERATION {
            *older = std::mem::take(current);
        }
        current.insert(key);
    }

    /// Texts remembered, both generations.
    pub fn len(&self) -> usize {
        let [current, older] = &*self.generations.lock();
        current.len() + older.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether the walk accepts `text` with `remaining` depth left.
fn walked(text: &str, remaining: u8) -> bool {
    Checked(remaining).deserialize(&mut serde_json::Deserializer::from_str(text)).is_ok()
}

/// serde_json's recursion limit: the depth it has left at a body's root.
pub const RECURSION_LIMIT: u8 = 128;

/// A walk that accepts what a tree reading accepts, with `.0` the depth serde_json would have
/// left (it counts one down on entering an array or object and refuses at zero).
#[derive(Clone, Copy)]
struct Checked(u8);

impl Checked {
    fn deeper<E: serde::de::Error>(self) -> Result<Checked, E> {
        match self.0.saturating_sub(1) {
            0 => Err(E::custom("recursion limit exceeded")),
            remaining => Ok(Checked(remaining)),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Checked {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.deeper()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        let inner = self.deeper()?;
        entries(map, |_, map| map.next_value_seed(inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::value::RawValue;

    /// JSON text, some of it past what a tree reads: deep nesting, lone surrogates, numbers out
    /// of range, the raw-value token (plain and escaped), and the lookalikes `may_refuse` flags.
    fn json(depth: u32) -> BoxedStrategy<String> {
        let leaf = prop_oneof![
            Just("1e999".to_string()),
            Just("-1E+400".to_string()),
            Just("1e5".to_string()),
            Just("0.5".to_string()),
            Just("9".repeat(310)),
            Just(format!("{}.5", "1".repeat(305))),
            Just(r#""\ud800""#.to_string()),
            Just(r#""\ud83d\ude00""#.to_string()),
            Just(r#""\u0041 e1 [{""#.to_string()),
            Just(r#""\\u""#.to_string()),
            Just("null".to_string()),
            "[a-z ]{0,8}".prop_map(|s| format!("\"{s}\"")),
            any::<i64>().prop_map(|n| n.to_string()),
        ];
        leaf.prop_recursive(depth, 400, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(|all| format!("[{}]", all.join(","))),
                prop::collection::vec(
                    (
                        prop_oneof![
                            Just("k".to_string()),
                            Just("$serde_json::private::RawValue".to_string()),
                            Just("\\u0024serde_json::private::RawValue".to_string())
                        ],
                        inner.clone()
                    ),
                    0..3
                )
                .prop_map(|all| format!(
                    "{{{}}}",
                    all.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect::<Vec<_>>().join(",")
                )),
                inner.prop_map(|one| format!("[[[[[[[[[[{one}]]]]]]]]]]")),
            ]
        })
        .boxed()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The check accepts what a tree reading accepts where the value stands (a tree of the
        /// text nested in `128 - remaining` arrays), and only that.
        #[test]
        fn the_check_accepts_exactly_what_a_tree_accepts(text in json(40), remaining in prop_oneof![Just(3u8), Just(12), Just(124), Just(128)]) {
            let Ok(raw) = serde_json::from_str::<Box<RawValue>>(&text) else { return Ok(()) };
            let enclosing = usize::from(RECURSION_LIMIT - remaining);
            let tree = serde_json::from_str::<serde_json::Value>(&format!("{}{text}{}", "[".repeat(enclosing), "]".repeat(enclosing)));
            let check = checked::<serde_json::Error>(raw.clone(), remaining, Schemas::Check(None)).is_ok();
            // The raw-value token is refused whatever a tree makes of it: such a body is read
            // as a tree, which decides.
            if text.contains("serde_json::private::RawValue") {
                prop_assert!(!check);
            } else {
                prop_assert_eq!(check, tree.is_ok(), "{:.300}", text);
            }
            // With a tenant's memo: the same answer when the text is walked and remembered, when
            // it is found there, and at another depth (walked afresh there).
            let passed = CheckedSchemas::default();
            for _ in 0..2 {
                prop_assert_eq!(checked::<serde_json::Error>(raw.clone(), remaining, Schemas::Check(Some(&passed))).is_ok(), check);
            }
            let shallow = checked::<serde_json::Error>(raw.clone(), 3, Schemas::Check(None)).is_ok();
            prop_assert_eq!(checked::<serde_json::Error>(raw, 3, Schemas::Check(Some(&passed))).is_ok(), shallow);
        }
    }

    /// Each thing a tree refuses, refused, at the depth it stands.
    #[test]
    fn what_a_tree_refuses_is_refused() {
        let check = |text: &str, remaining: u8| {
            checked::<serde_json::Error>(
                serde_json::from_str::<Box<RawValue>>(text).unwrap(),
                remaining,
                Schemas::Check(None),
            )
            .is_ok()
        };
        assert!(check(r#"{"type": "object", "properties": {"a": {"type": "string"}}}"#, 124));
        assert!(!check(r#"{"a": "\ud800"}"#, 124));
        assert!(check(r#"{"a": "\ud83d\ude00"}"#, 124));
        assert!(!check(r#"{"a": 1e999}"#, 124));
        assert!(check(r#"{"a": 1e300}"#, 124));
        assert!(!check(&"9".repeat(400), 124));
        assert!(!check(r#"{"$serde_json::private::RawValue": "{}"}"#, 124));
        assert!(!check(r#"{"\u0024serde_json::private::RawValue": "{}"}"#, 124));
        let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        assert!(check(&nested(3), 4) && !check(&nested(4), 4));
        assert!(check(&nested(123), 124) && !check(&nested(124), 124));
    }

    /// A text the memo holds is not walked again (here one a walk refuses, as a hash collision
    /// would be: only a pass is ever remembered, so this cannot happen but by one), per memo and
    /// at the depth it was held at; the memo keeps two generations and drops the oldest.
    #[test]
    fn the_memo_is_consulted_per_depth_and_bounded() {
        let raw = |text: &str| serde_json::from_str::<Box<RawValue>>(text).unwrap();
        let refused = r#"{"a": 1e999}"#;
        let (passed, other) = (CheckedSchemas::default(), CheckedSchemas::default());
        passed.insert(passed.key(refused, 124));
        assert!(
            checked::<serde_json::Error>(raw(refused), 124, Schemas::Check(Some(&passed))).is_ok(),
            "taken from the memo"
        );
        assert!(
            checked::<serde_json::Error>(raw(refused), 12, Schemas::Check(Some(&passed))).is_err(),
            "another depth"
        );
        assert!(
            checked::<serde_json::Error>(raw(refused), 124, Schemas::Check(Some(&other))).is_err(),
            "another tenant's memo"
        );
        assert!(checked::<serde_json::Error>(raw(refused), 124, Schemas::Check(Some(&passed))).is_ok());

        let first = r#"{"type": "object"}"#;
        assert!(
            checked::<serde_json::Error>(raw(first), 124, Schemas::Check(Some(&other))).is_ok() && other.len() == 1
        );
        for n in 0..2 * SCHEMA_GENERATION {
            other.insert(other.key(&n.to_string(), 124));
        }
        assert!(other.len() <= 2 * SCHEMA_GENERATION);
        assert!(!other.contains(other.key(first, 124)), "the oldest generation dropped");
        assert!(other.contains(other.key(&(2 * SCHEMA_GENERATION - 1).to_string(), 124)));
    }
}
