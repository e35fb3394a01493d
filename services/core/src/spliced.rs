//! A body for the upstream as it goes on the wire: a few byte slices, each either text Shield
//! wrote or a slice of the caller's own body, shared rather than copied (issue 33).
//!
//! The same-shape path relays a caller's body with a few top-level fields replaced
//! ([`crate::verbatim`]). Writing that out as one buffer copied the whole 150 KB agent history
//! once more per request (a `perf` profile on AMD EPYC put the copy at 3 % of the request's
//! CPU); sent as slices, the history goes from the buffer the request was read into straight
//! to the socket (hyper writes a body's frames with one `writev`); to an HTTPS upstream, rustls
//! still copies it into its records, and only Shield's own copy is saved. Hand-rolled because it is a
//! `Vec<Bytes>` and its length; what is Shield's own is the rule for which slices are worth
//! sharing.

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;

/// A slice shorter than this is copied next to the text around it: an extra part costs a
/// `Bytes` clone and an `iovec`, which a copy of a few hundred bytes undercuts.
pub const SHARE_FROM: usize = 1024;

/// A body as one or more parts, sent in order.
#[derive(Debug, Clone, Default)]
pub struct Spliced {
    parts: Vec<Bytes>,
    len: usize,
}

impl Spliced {
    /// The body's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The parts, in order (none empty).
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    pub fn into_parts(self) -> Vec<Bytes> {
        self.parts
    }

    /// The body as one slice: borrowed when it is one part, else copied (a signer that hashes
    /// the whole payload).
    pub fn contiguous(&self) -> Cow<'_, [u8]> {
        match self.parts.as_slice() {
            [] => Cow::Borrowed(&[]),
            [one] => Cow::Borrowed(one),
            _ => Cow::Owned(self.to_vec()),
        }
    }

    /// The body copied into one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        for part in &self.parts {
            out.extend_from_slice(part);
        }
        out
    }
}

impl From<Vec<u8>> for Spliced {
    fn from(body: Vec<u8>) -> Spliced {
        Spliced::from(Bytes::from(body))
    }
}

impl From<Bytes> for Spliced {
    fn from(body: Bytes) -> Spliced {
        let len = body.len();
        Spliced { parts: if body.is_empty() { Vec::new() } else { vec![body] }, len }
    }
}

/// Writes a [`Spliced`]: text goes into [`Splicer::text`]; [`Splicer::share`] adds a slice of a
/// shared buffer, as a part of its own when it is at least [`SHARE_FROM`] bytes long.
#[derive(Debug, Default)]
pub struct Splicer {
    parts: Vec<Bytes>,
    pending: Vec<u8>,
    len: usize,
}

impl Splicer {
    /// The buffer that text is written to (after every part shared so far).
    pub fn text(&mut self) -> &mut Vec<u8> {
        &mut self.pending
    }

    /// Adds `source[span]`; a span outside `source` adds nothing.
    pub fn share(&mut self, source: &Bytes, span: Range<usize>) {
        if span.start > span.end || span.end > source.len() {
            return;
        }
        if span.len() < SHARE_FROM {
            self.pending.extend_from_slice(source.get(span).unwrap_or_default());
            return;
        }
        self.flush();
        self.len += span.len();
        self.parts.push(source.slice(span));
    }

    fn flush(&mut self) {
        if !self.pending.is_empty() {
            let text = std::mem::take(&mut self.pending);
            self.len += text.len();
            self.parts.push(Bytes::from(text));
        }
    }

    pub fn finish(mut self) -> Spliced {
        self.flush();
        Spliced { parts: self.parts, len: self.len }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn short_slices_are_copied_long_ones_shared() {
        let source = Bytes::from(vec![b'x'; 3 * SHARE_FROM]);
        let mut out = Splicer::default();
        out.text().extend_from_slice(b"{");
        out.share(&source, 0..10);
        out.share(&source, 10..10 + SHARE_FROM);
        out.text().extend_from_slice(b"}");
        let body = out.finish();
        assert_eq!(body.parts().len(), 3);
        assert_eq!(body.parts()[1].as_ptr(), source[10..].as_ptr(), "the long slice is the source's own bytes");
        assert_eq!(body.len(), 2 + 10 + SHARE_FROM);
        assert!(matches!(body.contiguous(), Cow::Owned(_)));
    }

    #[test]
    fn out_of_range_spans_add_nothing() {
        let source = Bytes::from_static(b"abc");
        let mut out = Splicer::default();
        #[allow(clippy::reversed_empty_ranges, reason = "the case under test")]
        out.share(&source, 2..1);
        out.share(&source, 1..9);
        assert!(out.finish().is_empty());
        assert!(Spliced::from(Vec::new()).parts().is_empty());
    }

    proptest! {
        /// Whatever the mix of text and slices, the body is their concatenation, its length
        /// is the sum, and no part is empty.
        #[test]
        fn the_body_is_what_was_written(
            source in proptest::collection::vec(any::<u8>(), 0..4 * SHARE_FROM),
            steps in proptest::collection::vec((any::<bool>(), 0usize..4 * SHARE_FROM, 0usize..2 * SHARE_FROM), 0..12),
        ) {
            let source = Bytes::from(source);
            let (mut out, mut expected) = (Splicer::default(), Vec::new());
            for (is_text, a, n) in steps {
                if is_text {
                    let text = vec![b'"'; n % 40];
                    out.text().extend_from_slice(&text);
                    expected.extend_from_slice(&text);
                } else {
                    let span = a..a + n;
                    if span.end <= source.len() {
                        expected.extend_from_slice(&source[span.clone()]);
                    }
                    out.share(&source, span);
                }
            }
            let body = out.finish();
            prop_assert_eq!(body.to_vec(), expected.clone());
            prop_assert_eq!(body.len(), expected.len());
            prop_assert!(body.parts().iter().all(|part| !part.is_empty()));
            prop_assert_eq!(body.contiguous().into_owned(), expected);
        }
    }
}
