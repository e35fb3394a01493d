//! One client connection, served in HTTP/1.1 from the connection's own task: a request's head
//! parsed by httparse, its body decoded as the handler reads it (from the same socket and
//! buffer, no channel between them), the answer written in one gathered write (the head and a
//! whole body) or as chunks as a stream yields them.
//!
//! Hand-rolled rather than hyper's server connection (issue 33), as the upstream hop was
//! ([`crate::egress::wire`]): callgrind put hyper's dispatcher, its buffered reads and writes
//! and the body's channel at ~12,000 of a small request's ~86,000 instructions; this loop
//! does the same work in ~3,200 fewer (−3.7 %), ~7,500 fewer for a 148 KB agent request. The parsing that
//! must be right is still a crate's (httparse), and framing is shared with the upstream hop
//! ([`crate::http1`]); what is written here is the connection's loop.
//!
//! What a client meets:
//! * keep-alive (HTTP/1.1 unless `Connection: close`; HTTP/1.0 only with `keep-alive`), and
//!   requests sent before the last was answered (pipelined) are answered in order;
//! * a head over [`MAX_HEAD`] bytes or [`MAX_HEADERS`] fields is refused with 431, a
//!   malformed one (or one framed two ways, the way requests are smuggled) with 400, and the
//!   connection closed; a connection silent for the idle time between requests is closed;
//! * `Expect: 100-continue`: `100 Continue` goes out when the handler first reads the body, so a
//!   request refused before that (a bad key, a body over the limit) never invites it;
//! * a body the handler left unread is read and dropped after the answer (within
//!   [`DRAIN_BYTES`] and [`DRAIN_TIME`]) so the connection serves on, and a client still
//!   writing it reads the refusal rather than a reset; past those bounds the connection is
//!   closed after the answer, lingering so that the answer is not lost to a reset;
//! * a client that closes its side (or half-closes it) once its request is read is taken as
//!   gone: its pending answer and the upstream call behind it are dropped, unless it sent
//!   further requests first (those are answered, in order).

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::ops::Range;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, HeaderMap, HeaderName, HeaderValue, TRANSFER_ENCODING};
use http::{Method, StatusCode, Uri, Version};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::listen::Stop;
use super::response::Body;
use super::{Payload, Response};
use crate::http1::{Decoded, Framing, MAX_HEADERS, MAX_READ, Malformed, READ_SIZE, Said, poll_fill};

/// The largest request head accepted (start line and headers).
pub const MAX_HEAD: usize = 64 * 1024;
/// How much of a body the handler left unread is read and dropped, at most, and for how long.
pub const DRAIN_BYTES: u64 = 32 * 1024 * 1024;
pub const DRAIN_TIME: Duration = Duration::from_secs(5);
/// A body of a declared length up to this is gathered whole in the connection's buffer,
/// reserved once its first bytes have arrived, and handed to the handler in one piece: read in
/// pieces it was gathered again by the handler, a copy of the whole body (a 148 KB agent
/// request: ~5 µs of CPU). Larger ones go in pieces, so that a connection's buffer is bounded.
const WHOLE_BODY: u64 = 1024 * 1024;
/// How long a connection closed with input unread waits for the client to finish sending.
const LINGER: Duration = Duration::from_secs(2);
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The connection's socket and what was read from it but not yet taken, shared by its loop and
/// the body of the request being served (both on the connection's task; neither holds it
/// across an await).
pub(super) struct Wire {
    io: TcpStream,
    buf: BytesMut,
    body: BodyState,
}

/// Where the body of the request being served is.
struct BodyState {
    framing: Framing,
    ended: bool,
    /// It could not be read (malformed, or the client closed inside it).
    failed: bool,
    /// `100 Continue` is owed before the body is read: this many bytes of it are left to write.
    continue_left: usize,
}

/// Why a request's body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the client closed the connection before the body ended")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the body's framing is not valid HTTP/1.1: {0}")]
    Malformed(Malformed),
}

/// A request's body, read from its connection as the handler polls it.
pub(super) struct Reader {
    wire: Rc<RefCell<Wire>>,
}

impl Reader {
    pub(super) fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        self.wire.borrow_mut().poll_body(cx, true)
    }
}

impl Wire {
    /// The next piece of the request's body: `None` at its end (or once it failed). `gather`:
    /// a body of a declared length up to [`WHOLE_BODY`] comes in one piece (for the handler;
    /// a body read only to be dropped is not gathered).
    fn poll_body(&mut self, cx: &mut Context<'_>, gather: bool) -> Poll<Option<Result<Bytes, BodyError>>> {
        let Wire { io, buf, body } = self;
        if body.ended || body.failed {
            return Poll::Ready(None);
        }
        while body.continue_left > 0 {
            let from = CONTINUE.len() - body.continue_left;
            match ready!(Pin::new(&mut *io).poll_write(cx, CONTINUE.get(from..).unwrap_or_default())) {
                Ok(n) if n > 0 => body.continue_left -= n,
                Ok(_) => return body.fail(BodyError::Closed),
                Err(err) => return body.fail(err.into()),
            }
        }
        loop {
            if let Framing::Length(left) = body.framing
                && gather
                && left <= WHOLE_BODY
                && (buf.len() as u64) < left
            {
                // Gathered whole: read until all of it is in the buffer.
                // Reserved once the body has begun to arrive: a client that declares a length
                // and sends nothing holds no more than a read's worth.
                let left = usize::try_from(left).unwrap_or(usize::MAX);
                if buf.is_empty() {
                    buf.reserve(READ_SIZE);
                } else if buf.capacity() < left {
                    buf.reserve(left - buf.len());
                }
                match ready!(tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, buf)) {
                    Ok(0) => return body.fail(BodyError::Closed),
                    Ok(_) => continue,
                    Err(err) => return body.fail(err.into()),
                }
            }
            match body.framing.decode(buf) {
                Ok(Decoded::Data(data)) => {
                    body.ended = body.framing == Framing::Length(0);
                    return Poll::Ready(Some(Ok(data)));
                }
                Ok(Decoded::End) => {
                    body.ended = true;
                    return Poll::Ready(None);
                }
                Ok(Decoded::More) => match ready!(poll_fill(io, buf, cx, body.framing.wants())) {
                    Ok(0) => return body.fail(BodyError::Closed),
                    Ok(_) => {}
                    Err(err) => return body.fail(err.into()),
                },
                Err(malformed) => return body.fail(BodyError::Malformed(malformed)),
            }
        }
    }
}

impl BodyState {
    fn none() -> BodyState {
        BodyState { framing: Framing::Length(0), ended: true, failed: false, continue_left: 0 }
    }

    fn fail(&mut self, error: BodyError) -> Poll<Option<Result<Bytes, BodyError>>> {
        self.failed = true;
        Poll::Ready(Some(Err(error)))
    }
}

/// A request's head, as the handler and the connection's loop need it.
struct Arrived {
    parts: http::request::Parts,
    framing: Framing,
    keep_alive: bool,
    expects_continue: bool,
}

/// Why a request's head was refused.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    TooLarge,
    Malformed(&'static str),
}

impl From<Malformed> for Refused {
    fn from(Malformed(what): Malformed) -> Refused {
        Refused::Malformed(what)
    }
}

/// A complete request head at the start of `buf` (taken off it), `None` while more must be
/// read.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Arrived>, Refused> {
    // Uninitialised: an initialised array is 3 KB written per request for a handful of fields.
    let mut fields = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let length =
        match httparse::ParserConfig::default().parse_request_with_uninit_headers(&mut request, buf, &mut fields) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(Refused::TooLarge),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(Refused::TooLarge),
            Err(_) => return Err(Refused::Malformed("the request head does not parse")),
        };
    if length > MAX_HEAD {
        return Err(Refused::TooLarge);
    }
    let version = if request.version == Some(0) { Version::HTTP_10 } else { Version::HTTP_11 };
    let said = Said::of(request.headers)?;
    let framing = said.request_framing(version)?;
    let keep_alive = said.keeps_alive(version);
    let method = Method::from_bytes(request.method.unwrap_or_default().as_bytes())
        .map_err(|_| Refused::Malformed("the request method"))?;
    // The fields are kept as slices of the head's own bytes (no copy per value): their places
    // are noted while the parse borrows the buffer, and taken once the head is split off it.
    let base = buf.as_ptr() as usize;
    let place = |s: &[u8]| {
        let start = (s.as_ptr() as usize).saturating_sub(base);
        start..start + s.len()
    };
    let target = place(request.path.unwrap_or_default().as_bytes());
    let mut expects_continue = false;
    let mut places: Vec<(Range<usize>, Range<usize>)> = Vec::with_capacity(request.headers.len());
    for field in request.headers.iter() {
        if field.name.eq_ignore_ascii_case("expect") {
            expects_continue |= field.value.eq_ignore_ascii_case(b"100-continue");
        }
        places.push((place(field.name.as_bytes()), place(field.value)));
    }
    let raw = buf.split_to(length).freeze();
    let uri = Uri::from_maybe_shared(raw.slice(target)).map_err(|_| Refused::Malformed("the request target"))?;
    let mut headers = HeaderMap::with_capacity(places.len());
    for (name, value) in places {
        let name = HeaderName::from_bytes(raw.get(name).unwrap_or_default())
            .map_err(|_| Refused::Malformed("a header name"))?;
        let value =
            HeaderValue::from_maybe_shared(raw.slice(value)).map_err(|_| Refused::Malformed("a header value"))?;
        headers.append(name, value);
    }
    let mut parts = http::Request::new(()).into_parts().0;
    parts.method = method;
    parts.uri = uri;
    parts.version = version;
    parts.headers = headers;
    Ok(Some(Arrived { parts, framing, keep_alive, expects_continue: expects_continue && version == Version::HTTP_11 }))
}

/// Serves `io` until the client closes it, it falls idle, an answer cannot be written, or the
/// server stops (between requests; a request in flight is answered first).
pub(super) async fn serve<H, F>(
    io: TcpStream,
    peer: SocketAddr,
    handler: &H,
    idle: Duration,
    mut stopped: watch::Receiver<Option<Stop>>,
) where
    H: Fn(http::Request<Payload>, SocketAddr) -> F,
    F: Future<Output = Response>,
{
    let wire = Rc::new(RefCell::new(Wire { io, buf: BytesMut::new(), body: BodyState::none() }));
    loop {
        let head = tokio::select! {
            biased;
            head = tokio::time::timeout(idle, next_head(&wire)) => head,
            // A stopping server closes a connection between requests (a head already
            // buffered whole is served first: the branch above is polled first).
            _ = stopped.wait_for(Option::is_some) => return,
        };
        let arrived = match head {
            Err(_) | Ok(Ok(None)) => return,
            Ok(Ok(Some(arrived))) => arrived,
            Ok(Err(refused)) => {
                let _ = write_all(&wire, &[&refusal(&refused)]).await;
                return linger(&wire).await;
            }
        };
        let asked = Asked { head: arrived.parts.method == Method::HEAD, version: arrived.parts.version };
        let declared = match arrived.framing {
            Framing::Length(length) => Some(length),
            _ => None,
        };
        {
            let mut wire = wire.borrow_mut();
            let ended = arrived.framing == Framing::Length(0);
            let continue_left = if arrived.expects_continue && !ended { CONTINUE.len() } else { 0 };
            wire.body = BodyState { framing: arrived.framing, ended, failed: false, continue_left };
        }
        let payload = Payload::new(Reader { wire: wire.clone() }, declared);
        let request = http::Request::from_parts(arrived.parts, payload);
        let answer = handler(request, peer);
        let response = tokio::select! {
            biased;
            response = answer => response,
            () = client_gone(&wire) => return,
        };
        // Whether the connection can serve another request once this answer is written: its
        // body read to the end, or small enough to be read and dropped now.
        let (unread, serves_on) = {
            let wire = wire.borrow();
            let body = &wire.body;
            let unread = !body.ended;
            let drainable = !body.failed
                && body.continue_left == 0
                && match body.framing {
                    Framing::Length(left) => left <= DRAIN_BYTES,
                    _ => true,
                };
            (unread, arrived.keep_alive && (!unread || drainable) && stopped.borrow().is_none())
        };
        // A `100 Continue` begun but not all written is finished first: the answer must not
        // follow a fragment of it.
        let begun = wire.borrow().body.continue_left;
        if (1..CONTINUE.len()).contains(&begun)
            && write_all(&wire, &[CONTINUE.get(CONTINUE.len() - begun..).unwrap_or_default()]).await.is_err()
        {
            return;
        }
        let closes = match respond(&wire, response, &asked, !serves_on).await {
            Ok(closes) => closes,
            Err(()) => return,
        };
        if closes {
            if unread {
                linger(&wire).await;
            }
            return;
        }
        if unread && !drain(&wire).await {
            // Past the bounds: the client may still be sending; the answer is already out.
            return linger(&wire).await;
        }
    }
}

/// The next request's head: `None` when the client closed the connection between requests.
async fn next_head(wire: &RefCell<Wire>) -> Result<Option<Arrived>, Refused> {
    poll_fn(|cx| {
        let mut wire = wire.borrow_mut();
        let Wire { io, buf, .. } = &mut *wire;
        loop {
            if let Some(arrived) = parse_head(buf)? {
                return Poll::Ready(Ok(Some(arrived)));
            }
            match ready!(poll_fill(io, buf, cx, READ_SIZE)) {
                Ok(0) if buf.is_empty() => return Poll::Ready(Ok(None)),
                Ok(0) => return Poll::Ready(Err(Refused::Malformed("the connection closed inside a request head"))),
                Ok(_) => {}
                Err(_) => return Poll::Ready(Ok(None)),
            }
        }
    })
    .await
}

/// Completes when the client closes its side of the connection (or it fails) while its answer
/// is pending. Reads only once the request's body has been read to its end (before that, the
/// handler reads the socket); what arrives meanwhile is the next request's, kept for it.
fn client_gone(wire: &RefCell<Wire>) -> impl Future<Output = ()> + '_ {
    poll_fn(move |cx| {
        let mut wire = wire.borrow_mut();
        let Wire { io, buf, body } = &mut *wire;
        if !body.ended || body.failed {
            return Poll::Pending;
        }
        while buf.len() < MAX_HEAD {
            match ready!(poll_fill(io, buf, cx, READ_SIZE)) {
                // A client that sent its next requests and then closed its side waits for
                // their answers (the next head is read from what it sent).
                Ok(0) if !buf.is_empty() => return Poll::Pending,
                Ok(0) | Err(_) => return Poll::Ready(()),
                Ok(_) => {}
            }
        }
        Poll::Pending
    })
}

/// What the request asked that shapes its answer's framing.
struct Asked {
    head: bool,
    version: Version,
}

/// Writes `response`: its head, then its body, whole or as its stream yields it (chunked, or
/// to the connection's end for an HTTP/1.0 client). `close` says the connection ends after it;
/// what it returns, whether it does (an HTTP/1.0 client's stream ends with the connection).
async fn respond(wire: &RefCell<Wire>, response: Response, asked: &Asked, close: bool) -> Result<bool, ()> {
    let (parts, body) = response.into_inner().into_parts();
    let bodiless = asked.head
        || parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(if asked.version == Version::HTTP_10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
    head.extend_from_slice(parts.status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    write_fields(&mut head, &parts.headers);
    match body {
        Body::Whole(bytes) => {
            let bytes = bytes.unwrap_or_default();
            if parts.status != StatusCode::NO_CONTENT && parts.status != StatusCode::NOT_MODIFIED {
                head.extend_from_slice(b"content-length: ");
                head.extend_from_slice(itoa::Buffer::new().format(bytes.len()).as_bytes());
                head.extend_from_slice(b"\r\n");
            }
            end_head(&mut head, asked, close);
            let body = if bodiless { Bytes::new() } else { bytes };
            write_all(wire, &[&head, &body]).await.map(|()| close)
        }
        Body::Streamed(mut stream) => {
            // An HTTP/1.0 client reads the stream to the connection's end.
            let chunked = asked.version == Version::HTTP_11;
            if chunked && !bodiless {
                head.extend_from_slice(b"transfer-encoding: chunked\r\n");
            }
            let close = close || (!chunked && !bodiless);
            end_head(&mut head, asked, close);
            write_all(wire, &[&head]).await?;
            if bodiless {
                return Ok(close);
            }
            loop {
                let next = tokio::select! {
                    biased;
                    next = stream.next() => next,
                    // The client went: the stream (and the upstream call it reads) is dropped.
                    () = client_gone(wire) => return Err(()),
                };
                match next {
                    Some(Ok(chunk)) if chunk.is_empty() => {}
                    Some(Ok(chunk)) if chunked => {
                        let size = format!("{:x}\r\n", chunk.len());
                        write_all(wire, &[size.as_bytes(), &chunk, b"\r\n"]).await?;
                    }
                    Some(Ok(chunk)) => write_all(wire, &[&chunk]).await?,
                    // A stream that fails ends without its last chunk: the client sees it cut.
                    Some(Err(_)) => return Err(()),
                    None if chunked => return write_all(wire, &[b"0\r\n\r\n"]).await.map(|()| close),
                    // The body ends with the connection: its write side is shut so the client
                    // reads the end.
                    None => {
                        let _ = poll_fn(|cx| Pin::new(&mut wire.borrow_mut().io).poll_shutdown(cx)).await;
                        return Ok(true);
                    }
                }
            }
        }
    }
}

/// The handler's header fields, but for those that frame the message: those are the
/// connection's to write. `Date` is added when the handler did not set one.
fn write_fields(head: &mut Vec<u8>, headers: &HeaderMap) {
    for (name, value) in headers {
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == CONNECTION {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if !headers.contains_key(DATE) {
        head.extend_from_slice(b"date: ");
        date::write(head);
        head.extend_from_slice(b"\r\n");
    }
}

fn end_head(head: &mut Vec<u8>, asked: &Asked, close: bool) {
    if close {
        head.extend_from_slice(b"connection: close\r\n");
    } else if asked.version == Version::HTTP_10 {
        head.extend_from_slice(b"connection: keep-alive\r\n");
    }
    head.extend_from_slice(b"\r\n");
}

/// A refused head's answer, in the OpenAI error shape Shield answers in when it cannot yet tell
/// the caller's (the head is what would tell it). The connection closes after it.
fn refusal(refused: &Refused) -> Vec<u8> {
    let (status, message) = match refused {
        Refused::TooLarge => (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!("the request head is over {MAX_HEAD} bytes or {MAX_HEADERS} fields"),
        ),
        Refused::Malformed(what) => (StatusCode::BAD_REQUEST, format!("the request is not valid HTTP/1.1: {what}")),
    };
    let body = serde_json::json!({"error": {
        "message": message, "type": "invalid_request_error", "code": "bad_request", "param": null,
    }})
    .to_string();
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\ndate: ",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    date::write(&mut answer);
    answer.extend_from_slice(b"\r\n\r\n");
    answer.extend_from_slice(body.as_bytes());
    answer
}

/// Writes every part, in gathered writes.
async fn write_all(wire: &RefCell<Wire>, parts: &[&[u8]]) -> Result<(), ()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut written = 0usize;
    poll_fn(|cx| {
        let mut wire = wire.borrow_mut();
        while written < total {
            let mut slices = [IoSlice::new(&[]); 4];
            let count = crate::http1::gather(&mut slices, written, parts.iter().copied());
            match ready!(Pin::new(&mut wire.io).poll_write_vectored(cx, slices.get(..count).unwrap_or_default())) {
                Ok(n) if n > 0 => written += n,
                _ => return Poll::Ready(Err(())),
            }
        }
        Poll::Ready(Ok(()))
    })
    .await
}

/// Reads the rest of a body the handler left unread and drops it, within [`DRAIN_BYTES`] and
/// [`DRAIN_TIME`]: whether it ended, and the connection can serve on.
async fn drain(wire: &RefCell<Wire>) -> bool {
    let mut drained = 0u64;
    let read = poll_fn(|cx| {
        let mut wire = wire.borrow_mut();
        loop {
            match ready!(wire.poll_body(cx, false)) {
                Some(Ok(data)) => {
                    drained += data.len() as u64;
                    if drained > DRAIN_BYTES {
                        return Poll::Ready(false);
                    }
                }
                Some(Err(_)) => return Poll::Ready(false),
                None => return Poll::Ready(true),
            }
        }
    });
    tokio::time::timeout(DRAIN_TIME, read).await.unwrap_or(false)
}

/// Closes a connection whose client may still be sending: the write side first, then what
/// arrives is read and dropped until the client closes or [`LINGER`] passes, so that the
/// answer already written is not lost to the reset a close with unread input sends.
async fn linger(wire: &RefCell<Wire>) {
    let shut = poll_fn(|cx| Pin::new(&mut wire.borrow_mut().io).poll_shutdown(cx)).await;
    if shut.is_err() {
        return;
    }
    let read = poll_fn(|cx| {
        let mut wire = wire.borrow_mut();
        let Wire { io, buf, .. } = &mut *wire;
        loop {
            buf.clear();
            match ready!(poll_fill(io, buf, cx, MAX_READ)) {
                Ok(0) | Err(_) => return Poll::Ready(()),
                Ok(_) => {}
            }
        }
    });
    let _ = tokio::time::timeout(LINGER, read).await;
}

/// `Date`'s value, formatted once a second per thread.
mod date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static NOW: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
    }

    pub fn write(out: &mut Vec<u8>) {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        NOW.with_borrow_mut(|(at, text)| {
            if *at != second || text.is_empty() {
                *at = second;
                *text = httpdate::fmt_http_date(now);
            }
            out.extend_from_slice(text.as_bytes());
        });
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// Answers `{method} {path} {body bytes}`; `/hold` reads the body and never answers (until
    /// dropped, which it records); `/refuse` answers 401 without reading the body; `/stream`
    /// answers in three pieces.
    fn handler(
        dropped: Rc<Cell<bool>>,
    ) -> impl Fn(http::Request<Payload>, SocketAddr) -> Pin<Box<dyn Future<Output = Response>>> {
        move |request, _| {
            let dropped = dropped.clone();
            Box::pin(async move {
                let (head, mut body) = request.into_parts();
                let path = head.uri.path().to_string();
                if path == "/refuse" {
                    return Response::build(StatusCode::UNAUTHORIZED).body("refused");
                }
                let (mut read, mut pieces) = (0, 0);
                while let Some(piece) = body.frame().await {
                    match piece {
                        Ok(piece) => (read, pieces) = (read + piece.len(), pieces + 1),
                        Err(err) => return Response::build(StatusCode::BAD_REQUEST).body(err.to_string()),
                    }
                }
                match path.as_str() {
                    "/hold" => {
                        struct Flag(Rc<Cell<bool>>);
                        impl Drop for Flag {
                            fn drop(&mut self) {
                                self.0.set(true);
                            }
                        }
                        let _flag = Flag(dropped);
                        std::future::pending().await
                    }
                    "/stream" => Response::ok().streaming(futures_util::stream::iter(
                        ["one ", "two ", "three"].map(|s| Ok::<_, std::io::Error>(Bytes::from(s))),
                    )),
                    "/slow" => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Response::ok().body(format!("{} {path} {read}", head.method))
                    }
                    "/pieces" => Response::ok().body(format!("{read} in {pieces}")),
                    _ => Response::ok().body(format!("{} {path} {read}", head.method)),
                }
            })
        }
    }

    /// Serves one connection with [`handler`] while `client` talks to it; what `client` returns.
    async fn talk<C, Fut, T>(client: C) -> (T, bool)
    where
        C: FnOnce(TcpStream) -> Fut,
        Fut: Future<Output = T>,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_stop, stopped) = watch::channel(None);
        let dropped = Rc::new(Cell::new(false));
        let handler = handler(dropped.clone());
        let server = async {
            let (io, peer) = listener.accept().await.unwrap();
            serve(io, peer, &handler, Duration::from_secs(5), stopped).await;
        };
        let client = async { client(TcpStream::connect(addr).await.unwrap()).await };
        let ((), out) = tokio::join!(server, client);
        (out, dropped.get())
    }

    /// Everything the server sends until it closes the connection.
    async fn to_the_end(mut stream: TcpStream, send: &[u8]) -> String {
        stream.write_all(send).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Reads until `text` has arrived `times` times.
    async fn until(stream: &mut TcpStream, text: &str, times: usize) -> String {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while String::from_utf8_lossy(&out).matches(text).count() < times {
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await.unwrap().unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&out));
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn requests_on_one_connection_are_answered_in_order_even_pipelined() {
        let (out, _) = talk(|mut c| async move {
            c.write_all(b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello").await.unwrap();
            let first = until(&mut c, "hello", 0).await + &until(&mut c, "POST /a 5", 1).await;
            // Two at once, the second chunked, then a close-asking third.
            c.write_all(
                b"GET /b HTTP/1.1\r\nhost: x\r\n\r\nPOST /c HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nt: 1\r\n\r\n",
            )
            .await
            .unwrap();
            let second = until(&mut c, "POST /c 5", 1).await;
            let last = to_the_end(c, b"GET /d HTTP/1.1\r\nconnection: close\r\n\r\n").await;
            (first, second, last)
        })
        .await;
        let (first, second, last) = out;
        assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{first}");
        assert!(first.contains("content-length: 9\r\n") && first.contains("\r\ndate: "), "{first}");
        let b = second.find("GET /b 0").unwrap();
        assert!(b < second.find("POST /c 5").unwrap(), "in order: {second}");
        assert!(last.contains("connection: close\r\n") && last.ends_with("GET /d 0"), "{last}");
    }

    #[tokio::test]
    async fn bad_heads_are_refused_with_a_named_reason_and_the_connection_closed() {
        let cases: [(Vec<u8>, &str, &str); 4] = [
            (b"POST / HTTP/1.1\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(), "400", "both"),
            (b"POST / HTTP/1.1\r\ncontent-length: x\r\n\r\n".to_vec(), "400", "content-length"),
            (b"GET /\x01 HTTP/1.1\r\n\r\n".to_vec(), "400", "does not parse"),
            (
                format!("GET / HTTP/1.1\r\n{}\r\n", "x-long: yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\r\n".repeat(2000))
                    .into_bytes(),
                "431",
                "over 65536 bytes",
            ),
        ];
        for (send, status, reason) in cases {
            let (answer, _) = talk(|c| async move { to_the_end(c, &send).await }).await;
            assert!(answer.starts_with(&format!("HTTP/1.1 {status} ")), "{answer}");
            assert!(answer.contains("connection: close") && answer.contains(reason), "{answer}");
            assert!(answer.contains(r#""type":"invalid_request_error""#), "{answer}");
        }
    }

    #[tokio::test]
    async fn continue_is_sent_only_when_the_body_is_read() {
        let (out, _) = talk(|mut c| async move {
            c.write_all(b"POST /a HTTP/1.1\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n").await.unwrap();
            let invited = until(&mut c, "100 Continue\r\n\r\n", 1).await;
            c.write_all(b"abc").await.unwrap();
            let answered = until(&mut c, "POST /a 3", 1).await;
            // Refused before its body is read: no invitation, and the connection ends.
            let refused =
                to_the_end(c, b"POST /refuse HTTP/1.1\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n").await;
            (invited, answered, refused)
        })
        .await;
        assert!(out.0.starts_with("HTTP/1.1 100 Continue\r\n\r\n"), "{}", out.0);
        assert!(out.1.contains("200 OK"), "{}", out.1);
        assert!(out.2.starts_with("HTTP/1.1 401") && !out.2.contains("100 Continue"), "{}", out.2);
        assert!(out.2.contains("connection: close"), "{}", out.2);
    }

    #[tokio::test]
    async fn an_unread_body_is_drained_and_the_connection_serves_on() {
        let (out, _) = talk(|mut c| async move {
            let body = vec![b'x'; 300_000];
            let head = format!("POST /refuse HTTP/1.1\r\ncontent-length: {}\r\n\r\n", body.len());
            c.write_all(head.as_bytes()).await.unwrap();
            c.write_all(&body).await.unwrap();
            c.write_all(b"GET /next HTTP/1.1\r\n\r\n").await.unwrap();
            until(&mut c, "GET /next 0", 1).await
        })
        .await;
        assert!(out.starts_with("HTTP/1.1 401") && !out.contains("connection: close"), "{out}");
    }

    #[tokio::test]
    async fn a_body_up_to_a_megabyte_reaches_the_handler_in_one_piece() {
        let (out, _) = talk(|mut c| async move {
            let mut answers = Vec::new();
            for size in [300_000usize, 3_000_000] {
                let head = format!("POST /pieces HTTP/1.1\r\ncontent-length: {size}\r\n\r\n");
                c.write_all(head.as_bytes()).await.unwrap();
                // Sent in parts, as a client's writes arrive.
                for part in vec![b'x'; size].chunks(100_000) {
                    c.write_all(part).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                answers.push(until(&mut c, &format!("{size} in "), 1).await);
            }
            answers
        })
        .await;
        assert!(out[0].ends_with("300000 in 1"), "{}", out[0]);
        assert!(!out[1].ends_with("3000000 in 1"), "a larger body goes in pieces: {}", out[1]);
    }

    #[tokio::test]
    async fn a_client_that_closes_its_side_drops_its_pending_answer() {
        let (_, dropped) = talk(|mut c| async move {
            c.write_all(b"POST /hold HTTP/1.1\r\ncontent-length: 2\r\n\r\nhi").await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            c.shutdown().await.unwrap();
            let mut rest = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut rest)).await;
        })
        .await;
        assert!(dropped, "the handler's future was dropped");
    }

    #[tokio::test]
    async fn requests_sent_before_a_close_of_the_clients_side_are_all_answered() {
        let (out, dropped) = talk(|mut c| async move {
            c.write_all(b"POST /slow HTTP/1.1\r\ncontent-length: 1\r\n\r\nxGET /b HTTP/1.1\r\n\r\n").await.unwrap();
            c.shutdown().await.unwrap();
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
            String::from_utf8_lossy(&out).into_owned()
        })
        .await;
        assert!(out.contains("POST /slow 1") && out.ends_with("GET /b 0"), "{out}");
        assert!(!dropped);
    }

    #[tokio::test]
    async fn streams_are_chunked_for_http_1_1_and_run_to_the_close_for_1_0() {
        let (chunked, _) = talk(|mut c| async move {
            c.write_all(b"GET /stream HTTP/1.1\r\n\r\n").await.unwrap();
            until(&mut c, "0\r\n\r\n", 1).await
        })
        .await;
        assert!(chunked.contains("transfer-encoding: chunked\r\n"), "{chunked}");
        assert!(chunked.ends_with("\r\n\r\n4\r\none \r\n4\r\ntwo \r\n5\r\nthree\r\n0\r\n\r\n"), "{chunked}");
        let (plain, _) = talk(|c| async move { to_the_end(c, b"GET /stream HTTP/1.0\r\n\r\n").await }).await;
        assert!(plain.starts_with("HTTP/1.0 200 OK\r\n") && plain.ends_with("\r\n\r\none two three"), "{plain}");
        assert!(!plain.contains("transfer-encoding"), "{plain}");
        let (head, _) =
            talk(|c| async move { to_the_end(c, b"HEAD /x HTTP/1.1\r\nconnection: close\r\n\r\n").await }).await;
        assert!(head.contains("content-length: 9\r\n") && head.ends_with("\r\n\r\n"), "no body for HEAD: {head}");
    }

    #[tokio::test]
    async fn a_malformed_chunked_body_is_the_handlers_error_and_ends_the_connection() {
        let (out, _) = talk(|c| async move {
            to_the_end(c, b"POST /a HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n").await
        })
        .await;
        assert!(out.starts_with("HTTP/1.1 400") && out.contains("a chunk size"), "{out}");
        assert!(out.contains("connection: close"), "{out}");
    }
}
