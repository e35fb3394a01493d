//! One worker's upstream connections: HTTP/1.1 keep-alive connections per origin, reused
//! while they are idle and ready.
//!
//! Hand-rolled on hyper's connection API rather than hyper-util's pooled client (issue 19):
//! that client spawns a task per request to hand its connection back once the answer is read,
//! keys its pool by a hashed scheme and authority, and builds the request's origin form again
//! per call; in the profile that was several percent of the proxy's CPU per answer. Here a
//! connection goes back to its origin's list as soon as the answer's head arrives, and the
//! next checkout takes one that hyper reports ready again (its answer read to the end). Each
//! actix worker has its own [`Pool`] (the `Egress` is per worker), so its lock is never
//! contended.
//!
//! What the pooled client did that matters is kept: a request that a reused connection closed
//! before it went out is sent again on a new connection (never one that may have reached the
//! upstream); idle connections are dropped after [`POOL_IDLE`](super::POOL_IDLE), so a
//! server's own keep-alive expiry (5 s for uvicorn and actix) is never raced. Idle time counts
//! from when the answer's body was read to its end ([`Tracked`]), not from its head: a stream
//! that lasts longer than the idle timeout leaves a connection as reusable as a short answer
//! (issue 27: timed from the head, every long stream's connection expired as it finished, and
//! each call to a real provider paid a new TLS handshake).

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HOST, HeaderValue};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use parking_lot::Mutex;

use super::BoxError;

pub use super::outbound::Body;

/// At most this many idle connections are kept per origin.
const MAX_IDLE_PER_ORIGIN: usize = 512;
/// How often every origin's list is swept for expired connections.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Why a request could not be sent or its answer's head read.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("the URL is not valid for HTTP")]
    Uri,
    #[error("connection failed")]
    Connect(#[source] BoxError),
    #[error("the connection broke")]
    Broken(#[source] hyper::Error),
}

impl SendError {
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect(_))
    }
}

/// A connection that answered: reusable once hyper reports it ready.
struct Pooled {
    sender: SendRequest<Body>,
    /// When it was last handed a request.
    used: Instant,
    /// When its last answer's body was read to the end ([`Tracked`]): idle since then.
    body_done: Arc<BodyDone>,
}

impl Pooled {
    /// Since when the connection has been idle: the end of its last answer's body, or the
    /// answer's head when the body was never read to its end (an empty body nobody polled).
    fn idle_since(&self) -> Instant {
        self.body_done.at().map_or(self.used, |done| done.max(self.used))
    }
}

/// When an answer's body ended, shared by the body ([`Tracked`]) and its pooled connection.
#[derive(Default)]
struct BodyDone(AtomicU64);

/// The instants [`BodyDone`] stores, as nanoseconds since this.
static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

impl BodyDone {
    fn mark(&self) {
        let nanos = u64::try_from(EPOCH.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1);
        self.0.store(nanos, Ordering::Relaxed);
    }

    fn at(&self) -> Option<Instant> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(*EPOCH + Duration::from_nanos(nanos)),
        }
    }
}

/// An answer's body that notes when it was read to its end, so its connection's idle time
/// starts then.
pub struct Tracked {
    inner: Incoming,
    done: Arc<BodyDone>,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None))
            || (matches!(polled, Poll::Ready(Some(Ok(_)))) && self.inner.is_end_stream())
        {
            self.done.mark();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The connections of one scheme, host and port.
struct Origin {
    https: bool,
    host: String,
    port: u16,
    /// `Host:` as the request line's absolute form would give it (port only when not the
    /// scheme's default).
    host_header: HeaderValue,
    connections: Vec<Pooled>,
}

impl Origin {
    fn is(&self, https: bool, host: &str, port: u16) -> bool {
        self.https == https && self.port == port && self.host == host
    }
}

#[derive(Default)]
struct Origins {
    list: Vec<Origin>,
    swept: Option<Instant>,
}

pub struct Pool<C> {
    connector: C,
    idle_timeout: Duration,
    origins: Mutex<Origins>,
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
    C: tower_service::Service<Uri> + Clone + Send + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    C::Future: Send,
    C::Error: Into<BoxError>,
{
    pub fn new(connector: C, idle_timeout: Duration) -> Pool<C> {
        Pool { connector, idle_timeout, origins: Mutex::default() }
    }

    /// Sends `request` (an absolute URI) on a pooled connection to its origin, or a new one,
    /// and returns the answer's head with its body still to read.
    pub async fn send(&self, mut request: Request<Body>) -> Result<Response<Tracked>, SendError> {
        let uri = request.uri().clone();
        let (https, host, port) = parts(&uri).ok_or(SendError::Uri)?;
        let (pooled, host_header) = self.checkout(https, host, port, &uri)?;
        // Origin form on the request line, the origin in `Host:` (what a proxy-less client sends).
        *request.uri_mut() = match uri.path_and_query() {
            Some(path) => Uri::from(path.clone()),
            None => Uri::from_static("/"),
        };
        request.headers_mut().insert(HOST, host_header);
        if let Some(mut sender) = pooled {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.checkin(https, host, port, sender, response)),
                Err(mut failed) => match failed.take_message() {
                    // The pooled connection closed before the request went out: it never
                    // reached the upstream, so it goes again on a new connection.
                    Some(unsent) => request = unsent,
                    None => return Err(SendError::Broken(failed.into_error())),
                },
            }
        }
        // Boxed: connecting (DNS, TCP, TLS, handshake) is a large future and rare on a warm pool.
        let mut sender = Box::pin(self.connect(uri.clone())).await?;
        let response = sender.send_request(request).await.map_err(SendError::Broken)?;
        Ok(self.checkin(https, host, port, sender, response))
    }

    /// A ready idle connection to the origin, if there is one, and the origin's `Host:`.
    fn checkout(
        &self,
        https: bool,
        host: &str,
        port: u16,
        uri: &Uri,
    ) -> Result<(Option<SendRequest<Body>>, HeaderValue), SendError> {
        let now = Instant::now();
        let mut origins = self.origins.lock();
        if origins.swept.is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY) {
            origins.swept = Some(now);
            for origin in &mut origins.list {
                origin.connections.retain(|c| self.keep(c, now));
            }
            origins.list.retain(|o| !o.connections.is_empty());
        }
        if let Some(origin) = origins.list.iter_mut().find(|o| o.is(https, host, port)) {
            origin.connections.retain(|c| self.keep(c, now));
            // The most recently used ready one: the others then expire first.
            let ready = origin.connections.iter().rposition(|c| c.sender.is_ready());
            let sender = ready.map(|i| origin.connections.swap_remove(i).sender);
            return Ok((sender, origin.host_header.clone()));
        }
        let host_header = match uri.port() {
            Some(port) => HeaderValue::from_str(&format!("{host}:{port}")),
            None => HeaderValue::from_str(host),
        }
        .map_err(|_| SendError::Uri)?;
        origins.list.push(Origin {
            https,
            host: host.to_string(),
            port,
            host_header: host_header.clone(),
            connections: Vec::new(),
        });
        Ok((None, host_header))
    }

    /// Whether a pooled connection stays: open, and either busy with an answer or idle for
    /// less than the idle timeout.
    fn keep(&self, pooled: &Pooled, now: Instant) -> bool {
        let expired =
            pooled.sender.is_ready() && now.saturating_duration_since(pooled.idle_since()) >= self.idle_timeout;
        !pooled.sender.is_closed() && !expired
    }

    /// Back to its origin's list: usable again once its answer has been read. The answer's
    /// body is tracked so the connection's idle time starts at the body's end.
    fn checkin(
        &self,
        https: bool,
        host: &str,
        port: u16,
        sender: SendRequest<Body>,
        response: Response<Incoming>,
    ) -> Response<Tracked> {
        let done = Arc::new(BodyDone::default());
        let mut origins = self.origins.lock();
        if let Some(origin) = origins.list.iter_mut().find(|o| o.is(https, host, port))
            && origin.connections.len() < MAX_IDLE_PER_ORIGIN
        {
            origin.connections.push(Pooled { sender, used: Instant::now(), body_done: done.clone() });
        }
        drop(origins);
        response.map(|inner| Tracked { inner, done })
    }

    /// A new connection (TLS for `https`), its reading and writing driven by a task of its own
    /// on this worker.
    async fn connect(&self, uri: Uri) -> Result<SendRequest<Body>, SendError> {
        let mut connector = self.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx)).await.map_err(|e| SendError::Connect(e.into()))?;
        let io = connector.call(uri).await.map_err(|e| SendError::Connect(e.into()))?;
        let (sender, connection) = http1::Builder::new().handshake(io).await.map_err(SendError::Broken)?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }
}
