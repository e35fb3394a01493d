//! Reading JSON straight into typed values with serde visitors, without a `serde_json::Value`
//! tree of what is read (issue 33): the shared parts of the direct readers of large request
//! bodies (`chat_request`'s for Chat Completions, the proxy's for Anthropic's Messages).
//!
//! A [`Reader`] says what it makes of each JSON type; [`Lenient`] makes it a serde seed; every
//! object goes through [`entries`], which refuses serde_json's raw-value token (a tree reads an
//! object keyed by it as the JSON in its string, so only a tree reading reads such a body as
//! serde_json servers do); [`Skip`] drops a value under serde_json's recursion limit;
//! [`checked`] holds a value kept as its text (a `RawValue`) to what a tree would accept.

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

/// A value captured as its JSON text (serde_json's `RawValue`), checked as a tree reading would
/// check it. Capturing skips the value without serde_json's recursion limit, its check of
/// `\u` escapes (a lone surrogate) and its range of numbers (`1e999`), all of which a tree
/// reading refuses; so the text is walked once more through `deserialize_any`, which applies
/// them and allocates nothing but for a string written with escapes. `remaining` is the depth
/// serde_json has left where the value stands in its body (its limit, 128, less one for each
/// enclosing array or object), so a value nested past the limit counted from the body's root
/// is refused as the tree refuses it. On refusal the error is [`TREE_ONLY`].
///
/// The walk is a second pass over the captured text only: a few instructions a byte, against
/// the ~19 a byte of building the tree it replaces (issue 33: the 24 tool schemas of an agent
/// request).
pub fn checked<E: serde::de::Error>(
    raw: Box<serde_json::value::RawValue>,
    remaining: u8,
) -> Result<Box<serde_json::value::RawValue>, E> {
    let mut deserializer = serde_json::Deserializer::from_str(raw.get());
    match Checked(remaining).deserialize(&mut deserializer) {
        Ok(()) => Ok(raw),
        Err(_) => Err(E::custom(TREE_ONLY)),
    }
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
