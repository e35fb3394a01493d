//! HTTP/1.1 on one upstream connection, driven by the call's own task: the request written in
//! one gathered write (the head, then the body's parts as they are, uncopied), the answer's
//! head parsed by httparse, its body decoded as it is polled (`Content-Length`, chunked, or up
//! to the connection's end).
//!
//! Hand-rolled rather than hyper's client connection (issue 33). hyper drives a connection
//! from a task of its own: every call crossed tasks twice (the request through a channel to the
//! connection's task, its answer's head back through another) and its body through a third,
//! and the heads were built and encoded as general header maps. Callgrind put that at ~21,000
//! of a small request's 98,500 instructions (the connection's task 13,800, sending through it
//! 7,200), the largest single share. What the upstream hop needs is narrow and Shield's own:
//! a `POST` (or `GET`) whose headers Shield built, on a keep-alive connection that is reused
//! only once its answer has been read to the end.
//!
//! The reading is strict where a lenient client would be exploitable: a head over
//! [`MAX_HEAD`] bytes, a malformed or conflicting `Content-Length`, a bad chunk size or a
//! chunk not followed by CRLF is an error, never a guess; an answer framed by both
//! `Transfer-Encoding` and `Content-Length`, by the connection's end, or followed by bytes
//! nobody asked for, leaves its connection unused afterwards.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, HOST, HeaderMap, HeaderName, HeaderValue, TRANSFER_ENCODING};
use http::{Method, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncWrite};

pub use crate::http1::{Decoded, Framing};
use crate::http1::{MAX_HEADERS, Malformed, READ_SIZE, Said};

/// The largest answer head read (status line and headers).
pub const MAX_HEAD: usize = 64 * 1024;
/// The most slices one gathered write passes.
const MAX_SLICES: usize = 64;

/// Why a call could not be completed on its connection.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the upstream closed the connection before its answer ended")]
    Closed,
    #[error("the upstream's answer is not valid HTTP/1.1: {0}")]
    Malformed(&'static str),
}

impl From<Malformed> for Error {
    fn from(Malformed(what): Malformed) -> Error {
        Error::Malformed(what)
    }
}

/// One connection and what has been read from it but not yet consumed.
pub struct Connection<T> {
    io: T,
    buf: BytesMut,
}

/// How a request went out.
pub enum Sent {
    /// All of it.
    Whole,
    /// The upstream began its answer before the body was all written (a refusal, say): the
    /// answer is read, and the connection is not used again.
    Interrupted,
}

/// A request that could not be written, and whether any of it reached the socket (a request
/// none of which did can go again on another connection).
pub struct WriteFailed {
    pub error: Error,
    pub wrote_any: bool,
}

impl<T: AsyncRead + AsyncWrite + Unpin> Connection<T> {
    pub fn new(io: T) -> Connection<T> {
        Connection { io, buf: BytesMut::new() }
    }

    /// Whether an idle connection can take a request: nothing arrived on it, it is not closed
    /// and no error is pending. Asks the socket only when its readiness says something came
    /// (tokio clears it after a short read), so a warm connection costs no system call.
    pub fn is_idle_and_open(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        self.buf.reserve(READ_SIZE);
        matches!(tokio_util::io::poll_read_buf(Pin::new(&mut self.io), &mut cx, &mut self.buf), Poll::Pending)
    }

    /// Writes the request: `head` ([`encode_head`]) and the body's parts in gathered writes.
    /// While the socket cannot take more, what the upstream sends is read: an answer that
    /// begins before the body is all written ends the writing ([`Sent::Interrupted`]).
    pub async fn write(&mut self, head: &[u8], body: &[Bytes]) -> Result<Sent, WriteFailed> {
        let total = head.len() + body.iter().map(Bytes::len).sum::<usize>();
        let mut written = 0usize;
        let sent = std::future::poll_fn(|cx| {
            while written < total {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let count = fill_slices(&mut slices, written, head, body);
                let slices = slices.get(..count).unwrap_or_default();
                match Pin::new(&mut self.io).poll_write_vectored(cx, slices) {
                    Poll::Ready(Ok(0)) => {
                        let error = Error::Io(std::io::ErrorKind::WriteZero.into());
                        return Poll::Ready(Err(WriteFailed { error, wrote_any: written > 0 }));
                    }
                    Poll::Ready(Ok(n)) => written += n,
                    Poll::Ready(Err(err)) => {
                        return Poll::Ready(Err(WriteFailed { error: err.into(), wrote_any: written > 0 }));
                    }
                    Poll::Pending => {
                        // The socket is full: has the upstream answered (or closed) already?
                        self.buf.reserve(READ_SIZE);
                        return match ready!(tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)) {
                            Ok(0) => Poll::Ready(Err(WriteFailed { error: Error::Closed, wrote_any: written > 0 })),
                            Ok(_) => Poll::Ready(Ok(Sent::Interrupted)),
                            Err(err) => Poll::Ready(Err(WriteFailed { error: err.into(), wrote_any: written > 0 })),
                        };
                    }
                }
            }
            Poll::Ready(Ok(Sent::Whole))
        })
        .await?;
        if let Sent::Whole = sent {
            std::future::poll_fn(|cx| Pin::new(&mut self.io).poll_flush(cx))
                .await
                .map_err(|err| WriteFailed { error: err.into(), wrote_any: true })?;
        }
        Ok(sent)
    }

    /// Reads the answer's head (informational `1xx` answers skipped) and how its body is framed.
    pub async fn read_head(&mut self) -> Result<Head, Error> {
        loop {
            if let Some(head) = parse_head(&mut self.buf)? {
                return Ok(head);
            }
            if self.buf.len() >= MAX_HEAD {
                return Err(Error::Malformed("the head is too large"));
            }
            if std::future::poll_fn(|cx| self.poll_fill(cx, READ_SIZE)).await? == 0 {
                return Err(Error::Closed);
            }
        }
    }

    /// Reads what the socket has, with room for `want` bytes ([`crate::http1::poll_fill`]).
    fn poll_fill(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<std::io::Result<usize>> {
        crate::http1::poll_fill(&mut self.io, &mut self.buf, cx, want)
    }
}

/// The gathered write's slices from byte `from` of the head and body on.
fn fill_slices<'a>(slices: &mut [IoSlice<'a>], from: usize, head: &'a [u8], body: &'a [Bytes]) -> usize {
    crate::http1::gather(slices, from, std::iter::once(head).chain(body.iter().map(|b| b.as_ref())))
}

/// A request's head: the request line in origin form, `Host`, Shield's `headers` and the
/// body's length. Framing headers in `headers` are left out: the length is Shield's to say.
pub fn encode_head(
    method: &Method,
    path_and_query: &str,
    host: &HeaderValue,
    headers: &HeaderMap,
    content_length: Option<usize>,
) -> Vec<u8> {
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(method.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(path_and_query.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    head.extend_from_slice(host.as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name == HOST || name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == CONNECTION {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if let Some(length) = content_length {
        head.extend_from_slice(b"content-length: ");
        head.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// An answer's head and how its body is framed.
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    /// The head as received, for its fields when something asks ([`Head::headers`]): a
    /// successful call reads none of them, and building the map cost ~2,000 instructions an
    /// answer.
    raw: Bytes,
    pub framing: Framing,
    /// Whether the connection may carry another request once the body has been read.
    pub keep_alive: bool,
}

impl Head {
    /// The answer's header fields, as a map.
    pub fn headers(&self) -> Result<HeaderMap, Error> {
        let mut fields = [std::mem::MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
        let mut response = httparse::Response::new(&mut []);
        let parsed =
            httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut response, &self.raw, &mut fields);
        if !matches!(parsed, Ok(httparse::Status::Complete(_))) {
            return Err(Error::Malformed("the head does not parse"));
        }
        let mut headers = HeaderMap::with_capacity(response.headers.len());
        for field in response.headers.iter() {
            let name = HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| Error::Malformed("a header name"))?;
            let value = HeaderValue::from_bytes(field.value).map_err(|_| Error::Malformed("a header value"))?;
            headers.append(name, value);
        }
        Ok(headers)
    }

    /// The head as `http`'s response parts.
    pub fn into_parts(self) -> Result<http::response::Parts, Error> {
        let headers = self.headers()?;
        let mut parts = http::Response::new(()).into_parts().0;
        parts.status = self.status;
        parts.version = self.version;
        parts.headers = headers;
        Ok(parts)
    }
}

/// A complete head at the start of `buf` (taken off it), `None` when more must be read.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, Error> {
    loop {
        // Uninitialised: an initialised array is 3 KB written per answer for a handful of fields.
        let mut fields = [std::mem::MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
        let mut response = httparse::Response::new(&mut []);
        let parsed =
            httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut response, buf, &mut fields);
        let length = match parsed {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(Error::Malformed("too many header fields")),
            Err(_) => return Err(Error::Malformed("the head does not parse")),
        };
        let code = response.code.unwrap_or(0);
        if code == 101 {
            return Err(Error::Malformed("an upgrade was not asked for"));
        }
        if (100..200).contains(&code) {
            buf.advance(length);
            continue;
        }
        let status = StatusCode::from_u16(code).map_err(|_| Error::Malformed("the status code"))?;
        let version = if response.version == Some(0) { Version::HTTP_10 } else { Version::HTTP_11 };
        let said = Said::of(response.headers)?;
        let (framing, framed_alone) = said.framing(status);
        let keep_alive = framed_alone && !matches!(framing, Framing::Close) && said.keeps_alive(version);
        let raw = buf.split_to(length).freeze();
        return Ok(Some(Head { status, version, raw, framing, keep_alive }));
    }
}

/// An answer's body, read from its connection as it is polled. Once read to its end, the
/// connection can be had back for another request ([`Body::reusable`]).
pub struct Body<T> {
    /// `None` once it failed (or when the body was complete without it).
    connection: Option<Connection<T>>,
    framing: Framing,
    keep_alive: bool,
    ended: bool,
}

impl<T: AsyncRead + AsyncWrite + Unpin> Body<T> {
    pub fn new(connection: Connection<T>, head: &Head) -> Body<T> {
        let ended = head.framing == Framing::Length(0);
        Body { connection: Some(connection), framing: head.framing.clone(), keep_alive: head.keep_alive, ended }
    }

    /// The connection, once the body has been read to its end, when it can carry another
    /// request: kept alive, framed by one header, and nothing sent after the body.
    pub fn reusable(&mut self) -> Option<Connection<T>> {
        let connection = self.connection.as_ref()?;
        (self.ended && self.keep_alive && connection.buf.is_empty()).then(|| self.connection.take()).flatten()
    }

    /// The next piece of the body: `None` at its end.
    pub fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            let Some(connection) = self.connection.as_mut() else { return Poll::Ready(None) };
            match self.framing.decode(&mut connection.buf) {
                Ok(Decoded::Data(data)) => {
                    // A length-framed body is over with its last byte: its connection can go
                    // back without waiting for a poll that reads nothing.
                    self.ended = self.framing == Framing::Length(0);
                    return Poll::Ready(Some(Ok(data)));
                }
                Ok(Decoded::End) => self.ended = true,
                Ok(Decoded::More) => match ready!(connection.poll_fill(cx, self.framing.wants())) {
                    Ok(0) if self.framing == Framing::Close => self.ended = true,
                    Ok(0) => return self.fail(Error::Closed),
                    Ok(_) => {}
                    Err(err) => return self.fail(err.into()),
                },
                Err(err) => return self.fail(err.into()),
            }
        }
    }

    fn fail(&mut self, error: Error) -> Poll<Option<Result<Bytes, Error>>> {
        self.connection = None;
        Poll::Ready(Some(Err(error)))
    }

    /// Whether the body has been read to its end (from the start, when it has none: a 204,
    /// `Content-Length: 0`).
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// The bytes known to be left, when the body says.
    pub fn exact_len(&self) -> Option<u64> {
        match self.framing {
            Framing::Length(left) => Some(left),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http1::Chunked;
    use proptest::prelude::*;

    fn head(text: &str) -> Result<Option<Head>, Error> {
        parse_head(&mut BytesMut::from(text))
    }

    #[test]
    fn heads_frame_their_bodies() {
        let h =
            head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\nContent-Type: application/json\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.framing.clone(), h.keep_alive), (Framing::Length(12), true));
        assert_eq!(h.headers().unwrap()["content-type"], "application/json");
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked(Chunked::start()), true));
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n").unwrap().unwrap();
        assert_eq!(
            (h.framing, h.keep_alive),
            (Framing::Chunked(Chunked::start()), false),
            "both: chunked, then closed"
        );
        let h = head("HTTP/1.1 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
        let h = head("HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 1\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive);
        let h = head("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive, "HTTP/1.0 closes unless it says keep-alive");
        let h = head("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n").unwrap().unwrap();
        assert!(h.keep_alive);
        let h = head("HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.framing, Framing::Length(0), "a 204 has no body whatever it says");
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\nContent-Length: 7\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.framing, Framing::Length(7), "repeated equal lengths are one length");
        let h = head("HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 5\r\nconnection: Keep-Alive, CLOSE\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(5), false), "names and tokens without case");
        assert!(head("HTTP/1.1 200 OK\r\nContent-Le").unwrap().is_none(), "partial");
    }

    #[test]
    fn informational_answers_are_skipped_and_the_rest_kept() {
        let mut buf = BytesMut::from("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi");
        let h = parse_head(&mut buf).unwrap().unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(&buf[..], b"hi");
    }

    #[test]
    fn lies_and_garbage_are_errors() {
        for bad in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "SSH-2.0-OpenSSH_9.6\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
        ] {
            assert!(matches!(head(bad), Err(Error::Malformed(_))), "{bad:?}");
        }
        let many: String = (0..MAX_HEADERS + 1).map(|i| format!("x-{i}: y\r\n")).collect();
        assert!(matches!(head(&format!("HTTP/1.1 200 OK\r\n{many}\r\n")), Err(Error::Malformed(_))));
    }

    #[test]
    fn request_heads_leave_out_framing_headers_of_the_callers() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static("Bearer k"));
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("999"));
        headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        headers.insert(HOST, HeaderValue::from_static("evil"));
        let head = encode_head(&Method::POST, "/v1/x?y=1", &HeaderValue::from_static("up:8080"), &headers, Some(42));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /v1/x?y=1 HTTP/1.1\r\nhost: up:8080\r\nauthorization: Bearer k\r\ncontent-length: 42\r\n\r\n"
        );
    }

    proptest! {
        /// The gathered write's slices are the head and body from any offset on.
        #[test]
        fn slices_resume_at_any_offset(
            head in proptest::collection::vec(any::<u8>(), 1..50),
            parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..8),
            from in 0usize..400,
        ) {
            let body: Vec<Bytes> = parts.iter().map(|p| Bytes::from(p.clone())).collect();
            let all: Vec<u8> = head.iter().copied().chain(parts.concat()).collect();
            let from = from.min(all.len());
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            let count = fill_slices(&mut slices, from, &head, &body);
            let joined: Vec<u8> = slices[..count].iter().flat_map(|s| s.iter().copied()).collect();
            prop_assert_eq!(joined, all[from..].to_vec());
        }
    }
}
