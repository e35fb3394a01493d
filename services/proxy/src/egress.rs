//! Calls to provider endpoints. Two pooled keep-alive clients: one whose DNS resolver refuses
//! private, loopback and link-local answers (every target without `allow_private`: the
//! call-time half of the SSRF check, which also defeats DNS rebinding), and one for targets that
//! are allowed private addresses. Redirects are never followed. The caller's own headers are
//! never forwarded: each upstream request is built from scratch.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Client, redirect};
use shield_core::outcome::{Class, classify_status, is_completion};
use shield_core::url_safety::{private_reason, url_private_reason};
use url::Url;

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

struct GuardedResolver;

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some((ip, why)) = addrs.iter().find_map(|a| private_reason(a.ip()).map(|why| (a.ip(), why))) {
                return Err(Box::new(UnsafeAddress { host, ip, why }) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// How long an idle upstream connection is kept for reuse.
pub const POOL_IDLE: Duration = Duration::from_secs(4);

fn client(guarded: bool) -> Client {
    let builder = Client::builder()
        .redirect(redirect::Policy::none())
        .no_proxy()
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(512)
        // Below the 5 s keep-alive of uvicorn (vLLM, most Python model servers) and actix:
        // reusing a connection the server is closing at that moment resets the request (seen
        // as `connect` failures under load). Busy targets keep their connections warm anyway.
        .pool_idle_timeout(POOL_IDLE);
    let builder = if guarded { builder.dns_resolver(GuardedResolver) } else { builder };
    builder.build().expect("the HTTP client configuration is static and valid")
}

pub struct Egress {
    guarded: Client,
    private_ok: Client,
}

impl Default for Egress {
    fn default() -> Self {
        Egress { guarded: client(true), private_ok: client(false) }
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

    /// An error answer from the upstream: classified from its status and body, with its reset
    /// hint when it is a rate limit or an exhaustion answer.
    fn answered(status: u16, headers: &reqwest::header::HeaderMap, body: Vec<u8>) -> Failure {
        let reset_hint_ms = matches!(status, 402 | 429).then(|| reset_hint(headers)).flatten();
        Failure { class: classify_status(status, &body), status: Some(status), body: Some(body), reset_hint_ms }
    }
}

fn reset_hint(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    let pairs: Vec<(String, String)> =
        headers.iter().filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string()))).collect();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    shield_core::breaker::reset_hint_ms(&pairs, now)
}

/// What one non-streaming attempt produced: a 2xx chat completion, or a failure.
pub type Answer = Result<(u16, serde_json::Map<String, serde_json::Value>), Failure>;

/// The upstream's SSE events after the first one.
pub type Events = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<eventsource_stream::Event, String>> + Send>>;

/// A stream that reached its first usable event: everything up to the commit point.
pub struct Opened {
    pub status: u16,
    /// The first chunk (valid JSON, not an error).
    pub first: serde_json::Value,
    pub rest: Events,
    /// Malformed events dropped before the first chunk.
    pub malformed: u32,
}

impl Egress {
    fn post(
        &self,
        url: &Url,
        allow_private: bool,
        headers: HeaderMap,
        body: Vec<u8>,
    ) -> Result<reqwest::RequestBuilder, Failure> {
        if !allow_private && url_private_reason(url).is_some() {
            return Err(Failure::of(Class::UnsafeUrl));
        }
        let client = if allow_private { &self.private_ok } else { &self.guarded };
        Ok(client
            .post(url.clone())
            .headers(headers)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(body))
    }

    /// One upstream call, bounded by `timeout` from send to the last body byte.
    pub async fn call(
        &self,
        url: &Url,
        allow_private: bool,
        headers: HeaderMap,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Answer {
        let request = self.post(url, allow_private, headers, body)?;
        let exchange = async {
            let mut response = request.send().await?;
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let mut bytes = Vec::with_capacity(response.content_length().unwrap_or(4096).min(1 << 20) as usize);
            while let Some(chunk) = response.chunk().await? {
                if bytes.len() + chunk.len() > MAX_UPSTREAM_BODY {
                    return Ok((status, headers, None));
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok::<_, reqwest::Error>((status, headers, Some(bytes)))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => Err(Failure::of(Class::Timeout)),
            Ok(Err(err)) => Err(Failure::of(transport_class(&err))),
            Ok(Ok((status, _, None))) => {
                Err(Failure { class: Class::BadResponse, status: Some(status), body: None, reset_hint_ms: None })
            }
            Ok(Ok((status, _, Some(bytes)))) if (200..300).contains(&status) => {
                match serde_json::from_slice::<serde_json::Value>(&bytes) {
                    Ok(serde_json::Value::Object(map)) if is_completion(&map) => Ok((status, map)),
                    _ => Err(Failure {
                        class: Class::BadResponse,
                        status: Some(status),
                        body: None,
                        reset_hint_ms: None,
                    }),
                }
            }
            Ok(Ok((status, headers, Some(bytes)))) => Err(Failure::answered(status, &headers, bytes)),
        }
    }

    /// Opens a streamed call and waits, within `first_byte`, for its first usable event: the
    /// last moment this attempt can still fail over (the commit point is the first byte the
    /// client gets). A status error, a stream that errors, closes or sends an error event
    /// before any chunk, or silence past `first_byte`, is a failure.
    pub async fn open_stream(
        &self,
        url: &Url,
        allow_private: bool,
        headers: HeaderMap,
        body: Vec<u8>,
        first_byte: Duration,
    ) -> Result<Opened, Failure> {
        use eventsource_stream::Eventsource;
        use futures_util::StreamExt;
        let request = self.post(url, allow_private, headers, body)?;
        let opening = async {
            let mut response = request.send().await.map_err(|e| Failure::of(transport_class(&e)))?;
            let status = response.status().as_u16();
            if !(200..300).contains(&status) {
                let mut bytes = Vec::new();
                while let Ok(Some(chunk)) = response.chunk().await {
                    if bytes.len() + chunk.len() > 1 << 20 {
                        break;
                    }
                    bytes.extend_from_slice(&chunk);
                }
                return Err(Failure::answered(status, &response.headers().clone(), bytes));
            }
            let mut events: Events =
                Box::pin(response.bytes_stream().eventsource().map(|e| e.map_err(|err| err.to_string())));
            let mut malformed = 0;
            loop {
                let failed = |class| Err(Failure { class, status: Some(status), body: None, reset_hint_ms: None });
                match events.next().await {
                    None => return failed(Class::BadResponse),
                    Some(Err(_)) => return failed(Class::Connect),
                    Some(Ok(event)) if event.data.trim() == "[DONE]" => return failed(Class::BadResponse),
                    Some(Ok(event)) => match serde_json::from_str::<serde_json::Value>(&event.data) {
                        Err(_) => malformed += 1,
                        Ok(value) if value.get("error").is_some() => {
                            let class = shield_core::outcome::classify_error_event(event.data.as_bytes());
                            return Err(Failure {
                                class,
                                status: Some(status),
                                body: Some(event.data.into_bytes()),
                                reset_hint_ms: None,
                            });
                        }
                        Ok(first) => return Ok(Opened { status, first, rest: events, malformed }),
                    },
                }
            }
        };
        tokio::time::timeout(first_byte, opening).await.unwrap_or(Err(Failure::of(Class::Timeout)))
    }

    /// The default path: the body as sent, the answer as received.
    pub async fn relay(
        &self,
        url: Url,
        headers: HeaderMap,
        body: actix_web::web::Bytes,
        timeout: Duration,
    ) -> Result<reqwest::Response, String> {
        let request = self
            .private_ok
            .post(url)
            .headers(headers)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(body);
        match tokio::time::timeout(timeout, request.send()).await {
            Err(_) => Err("timed out".into()),
            Ok(Err(err)) => Err(describe(&err)),
            Ok(Ok(response)) => Ok(response),
        }
    }

    pub async fn get_json(&self, url: Url, timeout: Duration) -> Option<serde_json::Value> {
        let fetch = async { self.private_ok.get(url).send().await?.json::<serde_json::Value>().await };
        tokio::time::timeout(timeout, fetch).await.ok()?.ok()
    }
}

fn transport_class(err: &reqwest::Error) -> Class {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if e.downcast_ref::<UnsafeAddress>().is_some() {
            return Class::UnsafeUrl;
        }
        source = e.source();
    }
    if err.is_timeout() { Class::Timeout } else { Class::Connect }
}

/// A transport error in words, without URLs (they may carry a deployment name) or keys.
fn describe(err: &reqwest::Error) -> String {
    if err.is_timeout() {
        "timed out".into()
    } else if err.is_connect() {
        "connection failed".into()
    } else {
        "the connection broke".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[tokio::test]
    async fn the_guarded_resolver_refuses_private_answers() {
        use reqwest::dns::Resolve;
        let refused = GuardedResolver.resolve(reqwest::dns::Name::from_str("localhost").unwrap()).await;
        let err = refused.err().expect("localhost resolves to loopback");
        assert!(err.to_string().contains("loopback"), "{err}");
    }

    #[tokio::test]
    async fn a_name_resolving_to_a_private_address_is_unsafe_at_call_time() {
        // A name (not an IP literal) that resolves to loopback: the call-time DNS check, which
        // is what defeats rebinding, must classify the attempt `unsafe_url` without connecting.
        let err = client(true).get("http://localhost:9/v1").send().await.unwrap_err();
        assert_eq!(transport_class(&err), Class::UnsafeUrl);
        let err = client(false).get("http://127.0.0.1:9/v1").send().await.unwrap_err();
        assert_eq!(transport_class(&err), Class::Connect, "with allow_private the same host is merely closed");
    }

    #[tokio::test]
    async fn ip_literals_are_checked_before_any_connection() {
        let url = Url::parse("http://10.255.255.1/v1/chat/completions").unwrap();
        match Egress::default().call(&url, false, HeaderMap::new(), Vec::new(), Duration::from_secs(5)).await {
            Err(failure) => assert_eq!(failure.class, Class::UnsafeUrl),
            Ok(_) => panic!("a private literal was called"),
        }
    }
}
