//! Calls to provider endpoints. Two pooled keep-alive clients: one whose DNS resolver refuses
//! private, loopback and link-local answers (every target without `allow_private`: the
//! call-time half of the SSRF check, which also defeats DNS rebinding), and one for targets that
//! are allowed private addresses. Redirects are never followed. The caller's own headers are
//! never forwarded: each upstream request is built from scratch.
//!
//! Not reqwest: it parses every request's URL twice more (its redirect layer and its response)
//! even with redirects off, which profiling under load measured at about 4 % of the proxy's
//! CPU; nothing else of reqwest was needed here. hyper-util's connector resolves, connects and
//! makes TLS (rustls, aws-lc-rs, the platform's certificate verifier, as reqwest had it); the
//! connections are pooled by [`pool`] and spoken to by [`wire`], Shield's own HTTP/1.1 exchange
//! (why not hyper-util's pooled client, nor hyper's client connection: see there).

mod pool;
mod wire;

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyDataStream, BodyExt};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use shield_core::outcome::Class;
use shield_core::spliced::Spliced;
use shield_core::url_safety::{private_reason, url_private_reason};
use url::Url;

use crate::provider::{Answer, Decoded, Provider, StreamDecoder};

/// Upstream answers larger than this are not completions we will relay.
const MAX_UPSTREAM_BODY: usize = 32 * 1024 * 1024;

/// The resolver's refusal, found again in the error chain to classify the attempt `unsafe_url`.
#[derive(Debug, thiserror::Error)]
#[error("{host} resolves to {ip}, which is {why}")]
struct UnsafeAddress {
    host: String,
    ip: std::net::IpAddr,
    why: &'static str,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The system resolver, refusing names that resolve to a private address.
#[derive(Clone)]
struct GuardedResolver;

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some((ip, why)) = addrs.iter().find_map(|a| private_reason(a.ip()).map(|why| (a.ip(), why))) {
                return Err(Box::new(UnsafeAddress { host, ip, why }) as BoxError);
            }
            Ok(addrs.into_iter())
        })
    }
}

/// How long an idle upstream connection is kept for reuse.
pub const POOL_IDLE: Duration = Duration::from_secs(4);

type Upstream<R> = std::sync::Arc<pool::Pool<HttpsConnector<HttpConnector<R>>>>;

#[allow(
    clippy::expect_used,
    reason = "startup (the app factory): without a platform certificate store no TLS provider can be called at all"
)]
fn client<R>(resolver: R) -> Upstream<R>
where
    R: tower_service::Service<Name> + Clone + Send + Sync + 'static,
    R::Response: Iterator<Item = SocketAddr>,
    R::Error: Into<BoxError>,
    R::Future: Send,
{
    let mut http = HttpConnector::new_with_resolver(resolver);
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_platform_verifier(rustls::crypto::aws_lc_rs::default_provider())
        .expect("the platform's certificate verifier is available")
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    // Idle below the 5 s keep-alive of uvicorn (vLLM, most Python model servers) and actix:
    // reusing a connection the server is closing at that moment resets the request (seen as
    // `connect` failures under load). Busy targets keep their connections warm anyway.
    std::sync::Arc::new(pool::Pool::new(https, POOL_IDLE))
}

/// Cheap to clone: the clients share their connection pools.
#[derive(Clone)]
pub struct Egress {
    guarded: Upstream<GuardedResolver>,
    private_ok: Upstream<GaiResolver>,
}

impl Default for Egress {
    fn default() -> Self {
        Egress { guarded: client(GuardedResolver), private_ok: client(GaiResolver::new()) }
    }
}

/// Why an attempt failed. `body` is the upstream's error body, kept to explain a
/// non-failover answer to the caller.
#[derive(Debug)]
pub struct Failure {
    pub class: Class,
    pub status: Option<u16>,
    pub body: Option<Vec<u8>>,
    /// A 429/402's reset hint (`Retry-After`, `x-ratelimit-reset-*`), in milliseconds.
    pub reset_hint_ms: Option<u64>,
}

impl Failure {
    pub fn of(class: Class) -> Failure {
        Failure { class, status: None, body: None, reset_hint_ms: None }
    }
}

/// What one non-streaming attempt produced: a 2xx answer (normalised by the target's
/// provider adapter), or a failure.
pub type Attempted = Result<(u16, Answer), Failure>;

/// The upstream's stream events after the first one, framed by its provider.
pub type Events = crate::provider::Frames;

/// A stream that reached its first usable event: everything up to the commit point.
pub struct Opened {
    pub status: u16,
    /// The normalised chunks of the first event that yielded any (the commit point's).
    pub first: Vec<crate::provider::Chunk>,
    pub rest: Events,
    /// The provider's decoder, which goes on with `rest`.
    pub decoder: Box<dyn StreamDecoder>,
    /// Malformed events dropped before the first chunk.
    pub malformed: u32,
}

/// Why a call could not be made or completed: the transport's error, or the guard's refusal.
type CallError = pool::SendError;

/// A call's URL with its `http::Uri` parsed once. A target's endpoint is built once per
/// snapshot version ([`crate::tenant::TenantConfig`]); parsing it again on every call (and
/// cloning its `Url`) cost 0.9 % of a small request's instructions (issue 33: 99,541 → 98,649).
#[derive(Debug)]
pub struct CallUrl {
    pub url: Url,
    /// `None` when the URL cannot be an HTTP URI (such a call is refused as unsafe).
    uri: Option<Uri>,
}

impl CallUrl {
    pub fn new(url: Url) -> CallUrl {
        let uri = url.as_str().parse().ok();
        CallUrl { url, uri }
    }
}

impl std::ops::Deref for CallUrl {
    type Target = Url;

    fn deref(&self) -> &Url {
        &self.url
    }
}

impl Egress {
    /// Sends a POST of `body` (JSON) to `url`, through the client `allow_private` selects.
    fn post(
        &self,
        url: &CallUrl,
        allow_private: bool,
        headers: HeaderMap,
        body: Spliced,
    ) -> Result<impl std::future::Future<Output = Result<pool::Answered, CallError>> + use<>, Failure> {
        if !allow_private && url_private_reason(url).is_some() {
            return Err(Failure::of(Class::UnsafeUrl));
        }
        let uri = url.uri.clone().ok_or(Failure::of(Class::UnsafeUrl))?;
        let request = build(Method::POST, uri, headers, body);
        Ok(if allow_private {
            let pool = self.private_ok.clone();
            futures_util::future::Either::Left(async move { pool.send(request).await })
        } else {
            let pool = self.guarded.clone();
            futures_util::future::Either::Right(async move { pool.send(request).await })
        })
    }

    /// One upstream call, bounded by `timeout` from send to the last body byte; `provider`
    /// reads the answer.
    pub async fn call(
        &self,
        provider: &dyn Provider,
        url: &CallUrl,
        allow_private: bool,
        headers: HeaderMap,
        body: Spliced,
        timeout: Duration,
    ) -> Attempted {
        let sent = self.post(url, allow_private, headers, body)?;
        let exchange = async {
            let pool::Answered { head, body } = sent.await.map_err(|e| Failure::of(transport_class(&e)))?;
            let status = head.status.as_u16();
            let bytes = read_body(body, MAX_UPSTREAM_BODY).await.map_err(|_| Failure::of(Class::Connect))?;
            Ok::<_, Failure>((status, head, bytes))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => Err(Failure::of(Class::Timeout)),
            Ok(Err(failure)) => Err(failure),
            Ok(Ok((status, _, None))) => {
                Err(Failure { class: Class::BadResponse, status: Some(status), body: None, reset_hint_ms: None })
            }
            Ok(Ok((status, _, Some(bytes)))) if (200..300).contains(&status) => match provider.answer(bytes) {
                Some(answer) => Ok((status, answer)),
                None => {
                    Err(Failure { class: Class::BadResponse, status: Some(status), body: None, reset_hint_ms: None })
                }
            },
            Ok(Ok((status, head, Some(bytes)))) => {
                Err(provider.failure(status, &head.headers().unwrap_or_default(), bytes))
            }
        }
    }

    /// Opens a streamed call and waits, within `first_byte`, for its first usable event: the
    /// last moment this attempt can still fail over (the commit point is the first byte the
    /// client gets). A status error, a stream that errors, closes or sends an error event
    /// before any chunk, or silence past `first_byte`, is a failure.
    pub async fn open_stream(
        &self,
        provider: &dyn Provider,
        url: &CallUrl,
        allow_private: bool,
        headers: HeaderMap,
        body: Spliced,
        first_byte: Duration,
    ) -> Result<Opened, Failure> {
        let sent = self.post(url, allow_private, headers, body)?;
        let opening = async {
            let pool::Answered { head, body } = sent.await.map_err(|e| Failure::of(transport_class(&e)))?;
            let status = head.status.as_u16();
            if !(200..300).contains(&status) {
                // The error body, for the class and the caller's message; 1 MiB is plenty.
                let bytes = read_body(body, 1 << 20).await.ok().flatten().unwrap_or_default();
                return Err(provider.failure(status, &head.headers().unwrap_or_default(), bytes));
            }
            let bytes = BodyDataStream::new(body).map(|chunk| chunk.map_err(|err| err.to_string()));
            let mut events: Events = provider.frames(Box::pin(bytes));
            let mut decoder = provider.decoder();
            let mut first = Vec::new();
            let mut malformed = 0;
            loop {
                let failed = |class| Err(Failure { class, status: Some(status), body: None, reset_hint_ms: None });
                let event = match events.next().await {
                    None => return failed(Class::BadResponse),
                    Some(Err(_)) => return failed(Class::Connect),
                    Some(Ok(event)) => event,
                };
                match decoder.decode(&event.event, &event.data, &mut first) {
                    // Finished before any content: not an answer.
                    Decoded::Done => return failed(Class::BadResponse),
                    Decoded::Malformed => malformed += 1,
                    Decoded::Error(class, body) => {
                        return Err(Failure { class, status: Some(status), body: Some(body), reset_hint_ms: None });
                    }
                    Decoded::Continue if first.is_empty() => {}
                    Decoded::Continue => return Ok(Opened { status, first, rest: events, decoder, malformed }),
                }
            }
        };
        tokio::time::timeout(first_byte, opening).await.unwrap_or(Err(Failure::of(Class::Timeout)))
    }

    /// A POST whose answer a provider's own step reads (a credential exchange, say): the status
    /// and the body (at most 1 MiB), within `timeout`, under the same SSRF checks as calls.
    pub async fn exchange(
        &self,
        url: &Url,
        allow_private: bool,
        headers: HeaderMap,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), Failure> {
        let sent = self.post(&CallUrl::new(url.clone()), allow_private, headers, body.into())?;
        let exchange = async {
            let answered = sent.await.map_err(|e| Failure::of(transport_class(&e)))?;
            let status = answered.head.status.as_u16();
            let bytes = read_body(answered.body, 1 << 20).await.map_err(|_| Failure::of(Class::Connect))?;
            Ok((status, bytes.ok_or(Failure::of(Class::BadResponse))?))
        };
        tokio::time::timeout(timeout, exchange).await.unwrap_or(Err(Failure::of(Class::Timeout)))
    }

    /// The default path: the body as sent, the answer's head now and its body as it arrives.
    pub async fn relay(
        &self,
        url: Url,
        headers: HeaderMap,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(http::response::Parts, BodyDataStream<pool::Tracked>), String> {
        let uri = url.as_str().parse().map_err(|_| "the URL is not valid for HTTP")?;
        let request = build(Method::POST, uri, headers, Spliced::from(body));
        match tokio::time::timeout(timeout, self.private_ok.send(request)).await {
            Err(_) => Err("timed out".into()),
            Ok(Err(err)) => Err(describe(&err)),
            Ok(Ok(pool::Answered { head, body })) => {
                let head = head.into_parts().map_err(|_| "the upstream's answer head is not valid HTTP")?;
                Ok((head, BodyDataStream::new(body)))
            }
        }
    }

    pub async fn get_json(&self, url: Url, timeout: Duration) -> Option<serde_json::Value> {
        let request = build(Method::GET, url.as_str().parse().ok()?, HeaderMap::new(), Spliced::default());
        let fetch = async {
            let answered = self.private_ok.send(request).await.ok()?;
            let bytes = read_body(answered.body, 16 << 20).await.ok()??;
            serde_json::from_slice(&bytes).ok()
        };
        tokio::time::timeout(timeout, fetch).await.ok()?
    }
}

/// An upstream request built from scratch: `headers` and a JSON content type unless they name
/// another, nothing of the caller's.
fn build(method: Method, uri: Uri, headers: HeaderMap, body: Spliced) -> Request<Spliced> {
    let mut request = Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    request.headers_mut().entry(CONTENT_TYPE).or_insert(HeaderValue::from_static("application/json"));
    request
}

/// The whole body, or `None` past `limit` bytes; `Err` when the connection broke.
async fn read_body(mut body: pool::Tracked, limit: usize) -> Result<Option<Vec<u8>>, wire::Error> {
    use hyper::body::Body;
    let hint = body.size_hint().exact().unwrap_or(4096).min(1 << 20) as usize;
    let mut bytes = Vec::with_capacity(hint);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if bytes.len() + data.len() > limit {
                return Ok(None);
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(Some(bytes))
}

fn transport_class(err: &CallError) -> Class {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if e.downcast_ref::<UnsafeAddress>().is_some() {
            return Class::UnsafeUrl;
        }
        source = e.source();
    }
    // Timeouts are the caller's (`tokio::time::timeout`); everything else failed to connect
    // or broke.
    Class::Connect
}

/// A transport error in words, without URLs (they may carry a deployment name) or keys.
fn describe(err: &CallError) -> String {
    if err.is_connect() { "connection failed".into() } else { "the connection broke".into() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;
    const OPENAI: &dyn Provider = crate::provider::OPENAI;

    #[tokio::test]
    async fn the_guarded_resolver_refuses_private_answers() {
        use tower_service::Service;
        let refused = GuardedResolver.call(Name::from_str("localhost").unwrap()).await;
        let err = refused.expect_err("localhost resolves to loopback");
        assert!(err.to_string().contains("loopback"), "{err}");
    }

    #[tokio::test]
    async fn a_name_resolving_to_a_private_address_is_unsafe_at_call_time() {
        // A name (not an IP literal) that resolves to loopback: the call-time DNS check, which
        // is what defeats rebinding, must classify the attempt `unsafe_url` without connecting.
        let egress = Egress::default();
        let call = |url: &str, allow_private| {
            let url = CallUrl::new(Url::parse(url).unwrap());
            let egress = &egress;
            async move {
                egress
                    .call(OPENAI, &url, allow_private, HeaderMap::new(), b"{}".to_vec().into(), Duration::from_secs(5))
                    .await
            }
        };
        let failure = call("http://localhost:9/v1", false).await.expect_err("refused");
        assert_eq!(failure.class, Class::UnsafeUrl);
        let failure = call("http://127.0.0.1:9/v1", true).await.expect_err("nothing listens on port 9");
        assert_eq!(failure.class, Class::Connect, "with allow_private the same host is merely closed");
    }

    #[tokio::test]
    async fn a_url_that_is_no_http_uri_is_refused_without_a_connection() {
        // A `Url` the `http` crate cannot take as a URI (a scheme with no authority) is kept
        // with no URI, and its call refused as unsafe, as when the URI was parsed per call.
        let url = CallUrl::new(Url::parse("unix:/run/upstream.sock").unwrap());
        assert!(url.uri.is_none());
        let called = Egress::default()
            .call(OPENAI, &url, true, HeaderMap::new(), Vec::new().into(), Duration::from_secs(5))
            .await;
        match called {
            Err(failure) => assert_eq!(failure.class, Class::UnsafeUrl),
            Ok(_) => panic!("a URL with no URI was called"),
        }
    }

    #[tokio::test]
    async fn ip_literals_are_checked_before_any_connection() {
        let url = CallUrl::new(Url::parse("http://10.255.255.1/v1/chat/completions").unwrap());
        match Egress::default()
            .call(OPENAI, &url, false, HeaderMap::new(), Vec::new().into(), Duration::from_secs(5))
            .await
        {
            Err(failure) => assert_eq!(failure.class, Class::UnsafeUrl),
            Ok(_) => panic!("a private literal was called"),
        }
    }
}
