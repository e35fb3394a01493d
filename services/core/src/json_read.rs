//! Reading JSON straight into typed values with serde visitors, without a `serde_json::Value`
//! tree of what is read (issue 33): the shared parts of the direct readers of large request
//! bodies (`chat_request`'s for Chat Completions, the proxy's for Anthropic's Messages).
//!
//! A [`Reader`] says what it makes of each JSON type; [`Lenient`] makes it a serde seed; every
//! object goes through [`entries`], which refuses serde_json's raw-value token (a tree reads an
//! object keyed by it as the JSON in its string, so only a tree reading reads such a body as
//! serde_json servers do); [`Skip`] drops a value under serde_json's recursion limit.

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The error a read stops with at the raw-value token (no API's key): a caller reads the body as
/// a tree instead.
pub const RAW_VALUE_KEY: &str = "shield: raw-value key";

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
            return Err(serde::de::Error::custom(RAW_VALUE_KEY));
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
