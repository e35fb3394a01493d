//! HTTP/1.1 framing, shared by the upstream hop ([`crate::egress::wire`]) and the proxy's own
//! server ([`crate::server`]): what a head's fields say of its body and connection ([`Said`]),
//! and a body decoded as it arrives ([`Framing`]: `Content-Length`, chunked with extensions and
//! trailers, or to the connection's end).
//!
//! Strict where leniency is exploitable: a malformed or conflicting `Content-Length`, a bad
//! chunk size or a chunk not followed by CRLF is an error, never a guess.

use bytes::{Buf, Bytes, BytesMut};
use http::{StatusCode, Version};

/// The most header fields a head may have (hyper's default too).
pub const MAX_HEADERS: usize = 100;
/// The longest chunk-size line, extensions included.
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// The most bytes of chunk extensions in one body (hyper's bound too): each costs a line to
/// parse, and a body of one-byte chunks with long extensions would otherwise cost thousands of
/// bytes read per byte of body.
const MAX_EXTENSIONS: usize = 16 * 1024;
/// The most bytes of trailer fields after a chunked body (read and dropped).
const MAX_TRAILERS: usize = 64 * 1024;
/// What one read asks for at least.
pub const READ_SIZE: usize = 8 * 1024;
/// The most one read asks for, when more of a body is known to be coming.
pub const MAX_READ: usize = 64 * 1024;

/// What is wrong with a head or a body's framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// What a head says of its body's framing and its connection, read from its fields in one pass
/// (names compared without case).
#[derive(Default)]
pub struct Said<'a> {
    /// `Content-Length`, every value checked and equal to the others.
    length: Option<u64>,
    /// The last `Transfer-Encoding` field's value.
    coding: Option<&'a [u8]>,
    /// `Connection: close` / `keep-alive`.
    close: bool,
    keep_alive: bool,
}

impl<'a> Said<'a> {
    pub fn of(fields: &[httparse::Header<'a>]) -> Result<Said<'a>, Malformed> {
        let mut said = Said::default();
        for field in fields {
            let name = field.name.as_bytes();
            if name.eq_ignore_ascii_case(b"content-length") {
                for item in field.value.split(|b| *b == b',') {
                    let item = item.trim_ascii();
                    if item.is_empty() || item.len() > 19 || !item.iter().all(u8::is_ascii_digit) {
                        return Err(Malformed("content-length"));
                    }
                    let parsed = item.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
                    if said.length.is_some_and(|l| l != parsed) {
                        return Err(Malformed("conflicting content-length values"));
                    }
                    said.length = Some(parsed);
                }
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                said.coding = Some(field.value);
            } else if name.eq_ignore_ascii_case(b"connection") {
                for token in field.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                    said.close |= token.eq_ignore_ascii_case(b"close");
                    said.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
        }
        Ok(said)
    }

    /// How the body is framed, and whether by one header alone (a `Transfer-Encoding` beside a
    /// `Content-Length` is taken, and the connection closed after it: RFC 9112 §6.3).
    pub fn framing(&self, status: StatusCode) -> (Framing, bool) {
        if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            return (Framing::Length(0), true);
        }
        match (self.coding, self.length) {
            (Some(coding), length) => {
                let last = coding.rsplit(|b| *b == b',').next().unwrap_or_default().trim_ascii();
                if last.eq_ignore_ascii_case(b"chunked") {
                    (Framing::Chunked(Chunked::start()), length.is_none())
                } else {
                    // Any other final coding: the body runs to the connection's end.
                    (Framing::Close, false)
                }
            }
            (None, Some(length)) => (Framing::Length(length), true),
            (None, None) => (Framing::Close, true),
        }
    }

    /// How a request's body is framed (RFC 9112 §6.3): chunked when `Transfer-Encoding` ends
    /// with it, else `Content-Length`, else none. Stricter than for an answer, since a request
    /// framed two ways is how requests are smuggled past a proxy: both headers, or a final
    /// coding other than chunked, or any coding on HTTP/1.0, is refused.
    pub fn request_framing(&self, version: Version) -> Result<Framing, Malformed> {
        match (self.coding, self.length) {
            (Some(_), Some(_)) => Err(Malformed("both transfer-encoding and content-length")),
            (Some(_), None) if version == Version::HTTP_10 => Err(Malformed("transfer-encoding on HTTP/1.0")),
            (Some(coding), None) => {
                let last = coding.rsplit(|b| *b == b',').next().unwrap_or_default().trim_ascii();
                if last.eq_ignore_ascii_case(b"chunked") {
                    Ok(Framing::Chunked(Chunked::start()))
                } else {
                    Err(Malformed("a transfer-encoding that does not end with chunked"))
                }
            }
            (None, length) => Ok(Framing::Length(length.unwrap_or(0))),
        }
    }

    /// HTTP/1.1 keeps the connection unless the answer says `close`; HTTP/1.0 only if it says
    /// `keep-alive`.
    pub fn keeps_alive(&self, version: Version) -> bool {
        if version == Version::HTTP_10 { self.keep_alive } else { !self.close }
    }
}

/// How a body ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// This many bytes are left.
    Length(u64),
    Chunked(Chunked),
    /// At the connection's end.
    Close,
}

/// A chunked body's decoding: where it is, and the extensions it has read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunked {
    at: At,
    extensions: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum At {
    /// At a chunk-size line.
    Size,
    /// In a chunk's data, this many bytes left.
    Data(u64),
    /// At the CRLF after a chunk's data.
    DataEnd,
    /// In the trailer section, this many bytes of it read.
    Trailers(usize),
    Done,
}

/// What decoding the buffered bytes gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    Data(Bytes),
    /// Nothing yet: read more.
    More,
    End,
}

impl Framing {
    /// Decodes the next piece of the body from `buf`, taking what it consumes off it.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, Malformed> {
        match self {
            Framing::Length(0) => Ok(Decoded::End),
            Framing::Length(left) => Ok(take(buf, left).map_or(Decoded::More, Decoded::Data)),
            Framing::Close if buf.is_empty() => Ok(Decoded::More),
            Framing::Close => Ok(Decoded::Data(buf.split().freeze())),
            Framing::Chunked(chunked) => chunked.decode(buf),
        }
    }

    /// How many more bytes are known to be coming, to size a read.
    pub fn wants(&self) -> usize {
        match self {
            Framing::Length(left) | Framing::Chunked(Chunked { at: At::Data(left), .. }) => {
                usize::try_from(*left).unwrap_or(MAX_READ)
            }
            _ => READ_SIZE,
        }
    }
}

/// Up to `left` bytes off the front of `buf`, `None` when it is empty.
fn take(buf: &mut BytesMut, left: &mut u64) -> Option<Bytes> {
    if buf.is_empty() {
        return None;
    }
    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
    *left -= n as u64;
    Some(buf.split_to(n).freeze())
}

impl Chunked {
    /// At the body's first chunk.
    pub fn start() -> Chunked {
        Chunked { at: At::Size, extensions: 0 }
    }

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, Malformed> {
        loop {
            match &mut self.at {
                At::Size => {
                    let Some(line) = line(buf, MAX_CHUNK_LINE, "a chunk-size line is too long")? else {
                        return Ok(Decoded::More);
                    };
                    let (size, extension) = chunk_size(&line)?;
                    self.extensions += extension;
                    if self.extensions > MAX_EXTENSIONS {
                        return Err(Malformed("too many chunk extensions"));
                    }
                    self.at = if size == 0 { At::Trailers(0) } else { At::Data(size) };
                }
                At::Data(left) => {
                    let Some(data) = take(buf, left) else { return Ok(Decoded::More) };
                    if *left == 0 {
                        self.at = At::DataEnd;
                    }
                    return Ok(Decoded::Data(data));
                }
                At::DataEnd => match buf.get(..2) {
                    None if buf.first().is_none_or(|b| *b == b'\r') => return Ok(Decoded::More),
                    Some(b"\r\n") => {
                        buf.advance(2);
                        self.at = At::Size;
                    }
                    _ => return Err(Malformed("a chunk is not followed by CRLF")),
                },
                At::Trailers(read) => {
                    let room = MAX_TRAILERS.saturating_sub(*read);
                    let Some(field) = line(buf, room, "the trailers are too large")? else {
                        return Ok(Decoded::More);
                    };
                    if field.is_empty() {
                        self.at = At::Done;
                    } else {
                        *read += field.len() + 2;
                    }
                }
                At::Done => return Ok(Decoded::End),
            }
        }
    }
}

/// A CRLF-ended line off the front of `buf` (without its CRLF), `None` while it has no end
/// within `max` bytes.
fn line(buf: &mut BytesMut, max: usize, too_long: &'static str) -> Result<Option<Bytes>, Malformed> {
    match memchr::memchr(b'\n', buf) {
        Some(end) if end == 0 || buf.get(end - 1) != Some(&b'\r') => Err(Malformed("a line not ended by CRLF")),
        Some(end) if end > max => Err(Malformed(too_long)),
        Some(end) => {
            let line = buf.split_to(end + 1).freeze();
            Ok(Some(line.slice(..end - 1)))
        }
        None if buf.len() > max => Err(Malformed(too_long)),
        None => Ok(None),
    }
}

/// A chunk-size line's size (RFC 9112 §7.1: hexadecimal digits, then optional whitespace
/// before a `;` extension), and how many bytes its extension takes. Anything else (whitespace
/// before the digits, a bare CR, a sign) is refused, as a stricter peer would read it
/// differently.
fn chunk_size(line: &[u8]) -> Result<(u64, usize), Malformed> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err(Malformed("a chunk size"));
    }
    let rest = line.get(digits..).unwrap_or_default();
    let spaces = rest.iter().take_while(|b| matches!(b, b' ' | b'\t')).count();
    let extension = rest.get(spaces..).unwrap_or_default();
    if !(extension.is_empty() || extension.first() == Some(&b';')) {
        return Err(Malformed("a chunk size"));
    }
    let mut size = 0u64;
    for digit in line.get(..digits).unwrap_or_default() {
        let value = (*digit as char).to_digit(16).ok_or(Malformed("a chunk size"))?;
        size = size * 16 + u64::from(value);
    }
    Ok((size, extension.len()))
}

/// Reads what `io` has into `buf`, with room for `want` bytes (at least [`READ_SIZE`], at most
/// [`MAX_READ`]; reserved only when the buffer lacks it).
#[inline]
pub fn poll_fill<T: tokio::io::AsyncRead + Unpin>(
    io: &mut T,
    buf: &mut BytesMut,
    cx: &mut std::task::Context<'_>,
    want: usize,
) -> std::task::Poll<std::io::Result<usize>> {
    let room = want.clamp(READ_SIZE, MAX_READ);
    if buf.capacity() - buf.len() < room {
        buf.reserve(room);
    }
    tokio_util::io::poll_read_buf(std::pin::Pin::new(io), cx, buf)
}

/// Fills `slices` for a gathered write of `parts` from byte `from` on (a write that went out
/// in part resumes where it stopped); how many it filled.
#[inline]
pub fn gather<'a>(
    slices: &mut [std::io::IoSlice<'a>],
    from: usize,
    parts: impl IntoIterator<Item = &'a [u8]>,
) -> usize {
    let mut skip = from;
    let mut count = 0;
    for part in parts {
        if skip >= part.len() {
            skip -= part.len();
            continue;
        }
        let Some(slot) = slices.get_mut(count) else { break };
        *slot = std::io::IoSlice::new(part.get(skip..).unwrap_or_default());
        skip = 0;
        count += 1;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(framing: &mut Framing, buf: &mut BytesMut) -> Result<(Vec<u8>, bool), Malformed> {
        let mut out = Vec::new();
        loop {
            match framing.decode(buf)? {
                Decoded::Data(data) => out.extend_from_slice(&data),
                Decoded::More => return Ok((out, false)),
                Decoded::End => return Ok((out, true)),
            }
        }
    }

    fn request_framing(fields: &[(&str, &str)], version: Version) -> Result<Framing, Malformed> {
        let fields: Vec<httparse::Header<'_>> =
            fields.iter().map(|(name, value)| httparse::Header { name, value: value.as_bytes() }).collect();
        Said::of(&fields)?.request_framing(version)
    }

    #[test]
    fn a_request_is_framed_one_way_or_refused() {
        let v11 = Version::HTTP_11;
        assert_eq!(request_framing(&[], v11), Ok(Framing::Length(0)), "no body");
        assert_eq!(request_framing(&[("Content-Length", "12")], v11), Ok(Framing::Length(12)));
        assert_eq!(
            request_framing(&[("transfer-encoding", "gzip, CHUNKED")], v11),
            Ok(Framing::Chunked(Chunked::start()))
        );
        for bad in [
            vec![("transfer-encoding", "chunked"), ("content-length", "5")],
            vec![("transfer-encoding", "chunked, gzip")],
            vec![("content-length", "5"), ("content-length", "6")],
            vec![("content-length", "+5")],
        ] {
            assert!(request_framing(&bad, v11).is_err(), "{bad:?}");
        }
        assert!(request_framing(&[("transfer-encoding", "chunked")], Version::HTTP_10).is_err());
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let mut framing = Framing::Chunked(Chunked::start());
        let mut buf = BytesMut::from("5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n");
        let (out, ended) = decode_all(&mut framing, &mut buf).unwrap();
        assert_eq!((out.as_slice(), ended), (&b"hello world"[..], true));
        assert!(buf.is_empty());
        for bad in [
            "zz\r\nhello\r\n",
            "5\r\nhelloXY",
            "5\nhello\r\n",
            "1234567890abcdef0\r\n",
            "\r\n",
            " 5\r\nhello\r\n",
            "5\r\r\nhello\r\n",
            "+5\r\nhello\r\n",
            "5 x\r\nhello\r\n",
        ] {
            let mut framing = Framing::Chunked(Chunked::start());
            assert!(decode_all(&mut framing, &mut BytesMut::from(bad)).is_err(), "{bad:?}");
        }
        let mut framing = Framing::Chunked(Chunked::start());
        let endless = "f".repeat(MAX_CHUNK_LINE + 10);
        assert!(decode_all(&mut framing, &mut BytesMut::from(endless.as_str())).is_err(), "a size line without end");
        let mut framing = Framing::Chunked(Chunked::start());
        let mut spaced = BytesMut::from("5 \t;a=b\r\nhello\r\n0\r\n\r\n");
        assert_eq!(decode_all(&mut framing, &mut spaced).unwrap(), (b"hello".to_vec(), true), "whitespace before `;`");
        // Long extensions on one-byte chunks: refused once they pass the body's bound.
        let extension = format!("1;{}\r\nx\r\n", "e".repeat(1000));
        let mut framing = Framing::Chunked(Chunked::start());
        let mut many = BytesMut::from(extension.repeat(MAX_EXTENSIONS / 1000 + 2).as_str());
        assert_eq!(decode_all(&mut framing, &mut many), Err(Malformed("too many chunk extensions")));
    }

    #[test]
    fn a_length_body_ends_at_its_length_and_leaves_what_follows() {
        let mut framing = Framing::Length(3);
        let mut buf = BytesMut::from("abcdef");
        assert_eq!(decode_all(&mut framing, &mut buf).unwrap(), (b"abc".to_vec(), true));
        assert_eq!(&buf[..], b"def", "left for the caller to see (the connection is then not reused)");
    }

    proptest! {
        /// Any body, chunked any way and read in any pieces, decodes to itself and ends once.
        #[test]
        fn chunked_decoding_is_the_inverse_of_chunking(
            body in proptest::collection::vec(any::<u8>(), 0..3000),
            chunk in 1usize..700,
            read in 1usize..500,
            ext in any::<bool>(),
        ) {
            let mut wire = Vec::new();
            for piece in body.chunks(chunk) {
                wire.extend_from_slice(format!("{:x}{}\r\n", piece.len(), if ext { ";e=1" } else { "" }).as_bytes());
                wire.extend_from_slice(piece);
                wire.extend_from_slice(b"\r\n");
            }
            wire.extend_from_slice(b"0\r\ntrailer: t\r\n\r\n");
            let mut framing = Framing::Chunked(Chunked::start());
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            let mut ended = false;
            for piece in wire.chunks(read) {
                buf.extend_from_slice(piece);
                let (data, end) = decode_all(&mut framing, &mut buf).unwrap();
                prop_assert!(!ended || data.is_empty());
                out.extend_from_slice(&data);
                ended |= end;
            }
            prop_assert!(ended);
            prop_assert_eq!(out, body);
            prop_assert!(buf.is_empty());
        }

    }
}
