//! One worker's upstream connections: HTTP/1.1 keep-alive connections per origin, each used by
//! one call at a time ([`wire`]) and back in its origin's idle list once that call's answer has
//! been read to its end.
//!
//! Hand-rolled rather than hyper-util's pooled client (issue 19: that client spawns a task per
//! request to hand its connection back, keys its pool by a hashed scheme and authority, and
//! builds the request's origin form again per call) and, since issue 33, on Shield's own
//! HTTP/1.1 exchange rather than hyper's connection task ([`wire`] says why). Each worker has its
//! own [`Pool`] (the `Egress` is per worker), so its lock is never contended.
//!
//! What a pooled client must do is kept: an idle connection is checked before it is used (a
//! server that closed it, or sent anything unasked, is noticed without a system call when
//! nothing happened: tokio's readiness), and a request none of which was written goes again on
//! a new connection (never one that may have reached the upstream). Idle connections are
//! dropped after [`POOL_IDLE`](super::POOL_IDLE), counted from the end of their last answer's
//! body, so a server's own keep-alive expiry (5 s for uvicorn and actix) is never raced, and a
//! stream that lasts longer than that leaves its connection as reusable as a short answer
//! (issue 27: timed from the head, every long stream's connection expired as it finished, and
//! each call to a real provider paid a new TLS handshake).

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Request, Uri};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use shield_core::spliced::Spliced;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::BoxError;
use super::wire::{self, Connection, Sent};

/// At most this many idle connections are kept per origin.
const MAX_IDLE_PER_ORIGIN: usize = 512;
/// How often every origin's list is swept for expired connections.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// An origin with no idle connection is forgotten once no call has gone to it for this long.
/// Not sooner: its connections busy with answers go back to it when the answers end (a sweep
/// that forgot an origin whose connections were all busy would close them all).
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// Why a request could not be sent or its answer's head read.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("the URL is not valid for HTTP")]
    Uri,
    #[error("connection failed")]
    Connect(#[source] BoxError),
    #[error("the connection broke")]
    Broken(#[source] wire::Error),
}

impl SendError {
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect(_))
    }
}

/// What the connector makes: TCP, with TLS for `https`.
type Connected = MaybeHttpsStream<TokioIo<TcpStream>>;

/// An upstream connection's transport: plain TCP read and written directly, or TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TokioIo<Connected>>),
}

impl From<Connected> for Stream {
    fn from(connected: Connected) -> Stream {
        match connected {
            MaybeHttpsStream::Http(tcp) => Stream::Plain(tcp.into_inner()),
            tls @ MaybeHttpsStream::Https(_) => Stream::Tls(Box::new(TokioIo::new(tls))),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(tcp) => tcp.is_write_vectored(),
            Stream::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// An idle connection.
struct Pooled {
    connection: Connection<Stream>,
    /// When its last answer's body ended.
    idle_since: Instant,
}

/// The connections of one scheme, host and port.
struct Origin {
    /// Which origin a finished answer's connection goes back to (an origin's place in the
    /// list moves as others are swept).
    id: u64,
    https: bool,
    host: String,
    port: u16,
    /// `Host:` as the request line's absolute form would give it (port only when not the
    /// scheme's default).
    host_header: HeaderValue,
    idle: Vec<Pooled>,
    /// When a call last went to it.
    used: Instant,
}

impl Origin {
    fn is(&self, https: bool, host: &str, port: u16) -> bool {
        self.https == https && self.port == port && self.host == host
    }
}

/// The idle connections by origin, shared by the pool and the answers' bodies that hand their
/// connections back.
struct Idle {
    timeout: Duration,
    origins: Mutex<Origins>,
}

#[derive(Default)]
struct Origins {
    list: Vec<Origin>,
    swept: Option<Instant>,
    next_id: u64,
}

impl Idle {
    /// A connection whose answer has ended, back to its origin's list.
    fn checkin(&self, origin: u64, connection: Connection<Stream>) {
        let mut origins = self.origins.lock();
        if let Some(origin) = origins.list.iter_mut().find(|o| o.id == origin)
            && origin.idle.len() < MAX_IDLE_PER_ORIGIN
        {
            origin.idle.push(Pooled { connection, idle_since: Instant::now() });
        }
    }
}

pub struct Pool<C> {
    connector: C,
    idle: Arc<Idle>,
}

/// The parts of an absolute `http(s)` URI a connection is chosen by.
fn parts(uri: &Uri) -> Option<(bool, &str, u16)> {
    let https = match uri.scheme_str()? {
        "https" => true,
        "http" => false,
        _ => return None,
    };
    let host = uri.host()?;
    Some((https, host, uri.port_u16().unwrap_or(if https { 443 } else { 80 })))
}

impl<C> Pool<C>
where
    C: tower_service::Service<Uri, Response = Connected> + Clone + Send + 'static,
    C::Future: Send,
    C::Error: Into<BoxError>,
{
    pub fn new(connector: C, idle_timeout: Duration) -> Pool<C> {
        Pool { connector, idle: Arc::new(Idle { timeout: idle_timeout, origins: Mutex::default() }) }
    }

    /// Sends `request` (an absolute URI) on a pooled connection to its origin, or a new one,
    /// and returns the answer's head with its body still to read.
    pub async fn send(&self, request: Request<Spliced>) -> Result<Answered, SendError> {
        let (head, body) = request.into_parts();
        let (https, host, port) = parts(&head.uri).ok_or(SendError::Uri)?;
        let (pooled, host_header, origin) = self.checkout(https, host, port, &head.uri)?;
        let target = head.uri.path_and_query().map_or("/", |p| p.as_str());
        let length =
            (!body.is_empty() || !matches!(head.method, http::Method::GET | http::Method::HEAD)).then(|| body.len());
        let request_head = wire::encode_head(&head.method, target, &host_header, &head.headers, length);
        let body = body.into_parts();
        if let Some(mut connection) = pooled {
            match connection.write(&request_head, &body).await {
                Ok(sent) => return self.answer(connection, sent, origin).await,
                // Closed before any of the request went out: it never reached the upstream, so
                // it goes again on a new connection.
                Err(failed) if !failed.wrote_any => {}
                Err(failed) => return Err(SendError::Broken(failed.error)),
            }
        }
        // Boxed: connecting (DNS, TCP, TLS) is a large future and rare on a warm pool.
        let mut connection = Box::pin(self.connect(head.uri.clone())).await?;
        let sent = connection.write(&request_head, &body).await.map_err(|failed| SendError::Broken(failed.error))?;
        self.answer(connection, sent, origin).await
    }

    /// The answer's head, and its body to read from the connection.
    async fn answer(&self, mut connection: Connection<Stream>, sent: Sent, origin: u64) -> Result<Answered, SendError> {
        let mut head = connection.read_head().await.map_err(SendError::Broken)?;
        if let Sent::Interrupted = sent {
            // What was not written leaves the connection in the middle of a request.
            head.keep_alive = false;
        }
        let mut tracked = Tracked { body: wire::Body::new(connection, &head), home: Some((self.idle.clone(), origin)) };
        if tracked.body.is_ended() {
            // Nothing to read: the connection is free now, whether or not anyone polls the body.
            tracked.finish();
        }
        Ok(Answered { head, body: tracked })
    }

    /// A ready idle connection to the origin, if there is one, the origin's `Host:` and its id.
    fn checkout(
        &self,
        https: bool,
        host: &str,
        port: u16,
        uri: &Uri,
    ) -> Result<(Option<Connection<Stream>>, HeaderValue, u64), SendError> {
        let now = Instant::now();
        let timeout = self.idle.timeout;
        let fresh = |pooled: &Pooled| now.saturating_duration_since(pooled.idle_since) < timeout;
        let mut origins = self.idle.origins.lock();
        if origins.swept.is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY) {
            origins.swept = Some(now);
            for origin in &mut origins.list {
                origin.idle.retain(fresh);
            }
            // An answer still being read on a forgotten origin's connection closes that
            // connection at its end.
            origins.list.retain(|o| !o.idle.is_empty() || now.saturating_duration_since(o.used) < FORGET_AFTER);
        }
        if let Some(origin) = origins.list.iter_mut().find(|o| o.is(https, host, port)) {
            origin.used = now;
            // The most recently used one that is still open: the others then expire first.
            while let Some(mut pooled) = origin.idle.pop() {
                if fresh(&pooled) && pooled.connection.is_idle_and_open() {
                    return Ok((Some(pooled.connection), origin.host_header.clone(), origin.id));
                }
            }
            return Ok((None, origin.host_header.clone(), origin.id));
        }
        let host_header = match uri.port() {
            Some(port) => HeaderValue::from_str(&format!("{host}:{port}")),
            None => HeaderValue::from_str(host),
        }
        .map_err(|_| SendError::Uri)?;
        let id = origins.next_id;
        origins.next_id += 1;
        origins.list.push(Origin {
            id,
            https,
            host: host.to_string(),
            port,
            host_header: host_header.clone(),
            idle: Vec::new(),
            used: now,
        });
        Ok((None, host_header, id))
    }

    /// A new connection (TLS for `https`).
    async fn connect(&self, uri: Uri) -> Result<Connection<Stream>, SendError> {
        let mut connector = self.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx)).await.map_err(|e| SendError::Connect(e.into()))?;
        let connected = connector.call(uri).await.map_err(|e| SendError::Connect(e.into()))?;
        Ok(Connection::new(Stream::from(connected)))
    }
}

/// An answer: its head, and its body still to read.
pub struct Answered {
    pub head: wire::Head,
    pub body: Tracked,
}

/// An answer's body, read from its connection; the connection goes back to its origin's idle
/// list when the body has been read to its end (and is closed if the body is dropped before).
pub struct Tracked {
    body: wire::Body<Stream>,
    home: Option<(Arc<Idle>, u64)>,
}

impl Tracked {
    fn finish(&mut self) {
        if let Some(connection) = self.body.reusable()
            && let Some((idle, origin)) = self.home.take()
        {
            idle.checkin(origin, connection);
        }
    }
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = wire::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, wire::Error>>> {
        let polled = self.body.poll_data(cx);
        if self.body.is_ended() {
            self.finish();
        }
        polled.map(|data| data.map(|data| data.map(hyper::body::Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.exact_len() == Some(0)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.body.exact_len() {
            Some(left) => hyper::body::SizeHint::with_exact(left),
            None => hyper::body::SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use hyper_util::client::legacy::connect::dns::GaiResolver;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server that answers each request on a connection with `answer(n)` (n counts requests
    /// over all connections), closing the connection after it when `close_after` says so; it
    /// counts the connections it accepted.
    async fn server(answer: fn(usize) -> Vec<u8>, close_after: fn(usize) -> bool) -> (String, Arc<AtomicUsize>) {
        slow_server(answer, close_after, |_| Duration::ZERO).await
    }

    /// [`server`], answering request n after `delay(n)`.
    async fn slow_server(
        answer: fn(usize) -> Vec<u8>,
        close_after: fn(usize) -> bool,
        delay: fn(usize) -> Duration,
    ) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/x", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(socket, requests.clone(), answer, close_after, delay));
            }
        });
        (url, accepted)
    }

    /// One connection's requests: each one's head, then `content-length` bytes, then its answer.
    async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
        mut socket: S,
        requests: Arc<AtomicUsize>,
        answer: fn(usize) -> Vec<u8>,
        close_after: fn(usize) -> bool,
        delay: fn(usize) -> Duration,
    ) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let (head_end, length) = loop {
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                    break (end + 4, length);
                }
                match socket.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            while buf.len() < head_end + length {
                match socket.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            buf.drain(..head_end + length);
            let n = requests.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay(n)).await;
            if socket.write_all(&answer(n)).await.is_err() || socket.flush().await.is_err() || close_after(n) {
                return;
            }
        }
    }

    #[tokio::test]
    async fn calls_over_tls_are_answered_and_reuse_their_connection() {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let ca = CertificateDer::from_pem_slice(include_bytes!("testdata/ca.pem")).unwrap();
        let cert = CertificateDer::from_pem_slice(include_bytes!("testdata/localhost.pem")).unwrap();
        let key = PrivateKeyDer::from_pem_slice(include_bytes!("testdata/localhost.key")).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://localhost:{}/v1/x", listener.local_addr().unwrap().port());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        fn answer(n: usize) -> Vec<u8> {
            match n {
                0 => ok(0),
                _ => format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n8\r\nanswer {n}\r\n0\r\n\r\n")
                    .into_bytes(),
            }
        }
        tokio::spawn(async move {
            let requests = Arc::new(AtomicUsize::new(0));
            while let Ok((socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let Ok(tls) = acceptor.accept(socket).await else { continue };
                tokio::spawn(serve(tls, requests.clone(), answer, |_| false, |_| Duration::ZERO));
            }
        });
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(client)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let pool = Pool::new(https, Duration::from_secs(4));
        for n in 0..3 {
            let (status, body) = text(pool.send(post(&url, &vec![b'x'; 100_000])).await.unwrap()).await;
            assert_eq!((status, body), (200, format!("answer {n}").into_bytes()));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one TLS connection for three calls");
    }

    fn pool() -> Arc<Pool<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector<GaiResolver>>>>
    {
        super::super::client(GaiResolver::new())
    }

    fn post(url: &str, body: &[u8]) -> Request<Spliced> {
        let mut request = Request::new(Spliced::from(body.to_vec()));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = url.parse().unwrap();
        request
    }

    async fn text(answered: Answered) -> (u16, Vec<u8>) {
        let status = answered.head.status.as_u16();
        (status, answered.body.collect().await.unwrap().to_bytes().to_vec())
    }

    fn ok(n: usize) -> Vec<u8> {
        let body = format!("answer {n}");
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
    }

    #[tokio::test]
    async fn a_connection_is_reused_once_its_answer_is_read() {
        let (url, accepted) = server(ok, |_| false).await;
        let pool = pool();
        for n in 0..3 {
            let (status, body) = text(pool.send(post(&url, b"{}")).await.unwrap()).await;
            assert_eq!((status, body), (200, format!("answer {n}").into_bytes()));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection for three calls");
    }

    #[tokio::test]
    async fn a_connection_busy_through_a_sweep_goes_back_to_its_origin() {
        // The first answer takes longer than a sweep's interval; a second call meanwhile opens
        // a second connection and sweeps the origin's (empty) idle list. Both connections must
        // be there for the next two calls at once.
        let delay = |n| if n == 0 { SWEEP_EVERY + Duration::from_millis(300) } else { Duration::ZERO };
        let (url, accepted) = slow_server(ok, |_| false, delay).await;
        let pool = pool();
        let slow = pool.send(post(&url, b"{}"));
        let later = async {
            tokio::time::sleep(SWEEP_EVERY + Duration::from_millis(100)).await;
            text(pool.send(post(&url, b"{}")).await.unwrap()).await
        };
        let (slow, later) = tokio::join!(async { text(slow.await.unwrap()).await }, later);
        assert_eq!((slow.0, later.0), (200, 200));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        let (c, d) = tokio::join!(pool.send(post(&url, b"{}")), pool.send(post(&url, b"{}")));
        assert_eq!((text(c.unwrap()).await.0, text(d.unwrap()).await.0), (200, 200));
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "both connections reused");
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_not_used_again() {
        let (url, accepted) = server(ok, |_| true).await;
        let pool = pool();
        for n in 0..3 {
            let (status, body) = text(pool.send(post(&url, b"{}")).await.unwrap()).await;
            assert_eq!((status, body), (200, format!("answer {n}").into_bytes()));
            // Let the close arrive, as it would while the connection sat idle.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_answer_with_no_body_frees_its_connection_unread() {
        fn answer(n: usize) -> Vec<u8> {
            if n == 0 { b"HTTP/1.1 204 No Content\r\n\r\n".to_vec() } else { ok(n) }
        }
        let (url, accepted) = server(answer, |_| false).await;
        let pool = pool();
        let answered = pool.send(post(&url, b"{}")).await.unwrap();
        assert_eq!(answered.head.status, 204);
        drop(answered);
        let (status, body) = text(pool.send(post(&url, b"{}")).await.unwrap()).await;
        assert_eq!((status, body), (200, b"answer 1".to_vec()));
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "the 204's connection took the second call");
    }

    #[tokio::test]
    async fn an_answer_not_read_to_its_end_leaves_its_connection_closed() {
        let (url, accepted) = server(ok, |_| false).await;
        let pool = pool();
        drop(pool.send(post(&url, b"{}")).await.unwrap());
        let (status, body) = text(pool.send(post(&url, b"{}")).await.unwrap()).await;
        assert_eq!((status, body), (200, b"answer 1".to_vec()));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn chunked_and_close_framed_answers_are_read_and_only_the_first_reuses() {
        fn answer(n: usize) -> Vec<u8> {
            match n {
                0 => b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n".to_vec(),
                _ => b"HTTP/1.1 200 OK\r\n\r\nto the end".to_vec(),
            }
        }
        let (url, accepted) = server(answer, |n| n >= 1).await;
        let pool = pool();
        assert_eq!(text(pool.send(post(&url, b"{}")).await.unwrap()).await, (200, b"abcde".to_vec()));
        assert_eq!(text(pool.send(post(&url, b"{}")).await.unwrap()).await, (200, b"to the end".to_vec()));
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "the chunked answer's connection took the second call");
        assert_eq!(text(pool.send(post(&url, b"{}")).await.unwrap()).await, (200, b"to the end".to_vec()));
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "a close-framed answer's connection is not reused");
    }

    #[tokio::test]
    async fn an_answer_that_lies_about_its_length_is_an_error() {
        let (url, _) = server(|_| b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort".to_vec(), |_| true).await;
        let response = pool().send(post(&url, b"{}")).await.unwrap();
        let err = response.body.collect().await.expect_err("the body ended early");
        assert!(matches!(err, wire::Error::Closed), "{err}");
    }

    #[tokio::test]
    async fn a_refusal_sent_before_the_body_was_written_is_the_answer() {
        // The server answers 413 on the head alone and never reads the 8 MB body.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/x", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 1024];
            let _ = socket.read(&mut head).await;
            let body = "too large";
            let answer = format!("HTTP/1.1 413 Payload Too Large\r\ncontent-length: {}\r\n\r\n{body}", body.len());
            socket.write_all(answer.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let pool = pool();
        let sent = tokio::time::timeout(Duration::from_secs(3), pool.send(post(&url, &vec![b'x'; 8 << 20])));
        let response = sent.await.expect("answered without waiting for the body to be taken").unwrap();
        assert_eq!(text(response).await, (413, b"too large".to_vec()));
    }

    #[tokio::test]
    async fn a_streamed_answer_arrives_piece_by_piece() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/x", listener.local_addr().unwrap());
        let (next, mut go) = tokio::sync::mpsc::channel::<()>(1);
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 1024];
            let _ = socket.read(&mut head).await;
            socket.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\nfirst\n\r\n").await.unwrap();
            go.recv().await;
            socket.write_all(b"7\r\nsecond\n\r\n0\r\n\r\n").await.unwrap();
        });
        let mut body = pool().send(post(&url, b"{}")).await.unwrap().body;
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"first\n", "the first piece before the server sent the second");
        next.send(()).await.unwrap();
        let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&second[..], b"second\n");
        assert!(body.frame().await.is_none());
    }
}
