//! The proxy's endpoints and the arrival layer in front of them: each request gets its id
//! (`X-Request-Id` on every answer, Anthropic's `request-id` on answers in its shape), its
//! [`Trail`](crate::context::Trail) and log span, then the endpoint its method and path name
//! ([`Endpoint`]), or a 404 in OpenAI's error shape.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, HeaderValue};
use http::{Method, StatusCode};
use serde_json::json;

use crate::server::{Payload, Request, Response};
use crate::{ProxyState, chat, context, egress, error, messages, models, native, responses};

/// What this service is (the address `shield up` prints); callers use `/v1/...`. `HEAD /`
/// answers too: Claude Code probes it before its first request.
fn index() -> Response {
    Response::ok().json(json!({
        "service": "shield-proxy",
        "endpoints": ["/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/shield/chat/completions", "/v1/models", "/v1/models/{id}"],
        "health": ["/healthz", "/readyz"],
        "metrics": "/metrics",
    }))
}

fn healthz() -> Response {
    Response::ok().json(json!({"status": "ok"}))
}

/// Ready once Redis has answered at least once (config source reachable or cache warm).
fn readyz(state: &ProxyState) -> Response {
    if state.caches.is_ready() {
        Response::ok().json(json!({"status": "ready"}))
    } else {
        Response::build(StatusCode::SERVICE_UNAVAILABLE)
            .json(json!({"status": "unavailable", "reason": "Redis has not answered yet"}))
    }
}

/// Prometheus text format. Gauges of state (circuits, snapshot ages) are read at scrape time.
fn metrics_text(state: &ProxyState) -> Response {
    for (tenant, rows) in state.health.rows("") {
        for (target, row) in rows {
            state.metrics.circuit(&tenant, &target, &row.state);
        }
    }
    state.metrics.trace_counts();
    state.metrics.guardrail_counts(&state.verdicts.counts);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    for (tenant, published_at) in state.caches.snapshot_times() {
        state.metrics.snapshot_age(&tenant, now - published_at);
    }
    Response::ok().content_type("text/plain; version=0.0.4").body(state.metrics.render())
}

fn not_found() -> Response {
    Response::build(StatusCode::NOT_FOUND).json(error::openai_error(
        "no such endpoint",
        "invalid_request_error",
        "not_found",
        serde_json::Value::Null,
    ))
}

/// A request id: the caller's `X-Request-Id` when it is short and printable, else a fresh one
/// (a per-process random prefix and a counter: unique, and free of syscalls per request).
fn request_id(inbound: Option<&HeaderValue>) -> HeaderValue {
    if let Some(value) = inbound
        .filter(|v| (1..=128).contains(&v.len()) && v.to_str().is_ok_and(|s| s.bytes().all(|b| b.is_ascii_graphic())))
    {
        return value.clone();
    }
    static PREFIX: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| uuid::Uuid::new_v4().as_u64_pair().0);
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // 32 hex digits into a fixed buffer: `format!` with padded hex cost more than the rest of
    // the id's work on every answer (issue 19).
    let mut words = [0u8; 16];
    words[..8].copy_from_slice(&PREFIX.to_be_bytes());
    words[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    let mut id = [0u8; 32];
    let _ = hex::encode_to_slice(words, &mut id);
    HeaderValue::from_bytes(&id).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// Paths with no access record and no span: probes, scrapes and the service's index, which
/// orchestrators call every few seconds.
fn unobserved(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics" | "/" | "/api/hello")
}

/// Anthropic's name for the request id, on answers in its shape (its SDKs read it).
const ANTHROPIC_REQUEST_ID: HeaderName = HeaderName::from_static("request-id");
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Whether the answer is in Anthropic's shape: `/v1/messages…`, and the model list when the
/// caller sent `anthropic-version`.
fn anthropic_shaped(path: &str, headers: &http::HeaderMap) -> bool {
    path.starts_with("/v1/messages") || (path.starts_with("/v1/models") && models::wants_anthropic(headers))
}

/// The proxy's endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    ChatCompletions,
    Messages,
    CountTokens,
    Native,
    Responses,
    ResponsesUpgrade,
    RetrieveResponse,
    RemoveResponse,
    InputItems,
    Models,
    Model,
    Index,
    Hello,
    Healthz,
    Readyz,
    Metrics,
}

impl Endpoint {
    /// The endpoint a method and path name, and the path's `{id}` (percent-decoded).
    fn of(method: &Method, path: &str) -> Option<(Endpoint, Option<String>)> {
        let id = |segment: &str| {
            (!segment.is_empty() && !segment.contains('/'))
                .then(|| percent_encoding::percent_decode_str(segment).decode_utf8().ok().map(|s| s.into_owned()))
                .flatten()
        };
        let get_or_head = *method == Method::GET || *method == Method::HEAD;
        let endpoint = match (method, path) {
            (&Method::POST, "/v1/chat/completions") => Endpoint::ChatCompletions,
            (&Method::POST, "/v1/messages") => Endpoint::Messages,
            (&Method::POST, "/v1/messages/count_tokens") => Endpoint::CountTokens,
            (&Method::POST, "/v1/shield/chat/completions") => Endpoint::Native,
            (&Method::POST, "/v1/responses") => Endpoint::Responses,
            (&Method::GET, "/v1/responses") => Endpoint::ResponsesUpgrade,
            (&Method::GET, "/v1/models") => Endpoint::Models,
            (_, "/") if get_or_head => Endpoint::Index,
            (_, "/api/hello") if get_or_head => Endpoint::Hello,
            (&Method::GET, "/healthz") => Endpoint::Healthz,
            (&Method::GET, "/readyz") => Endpoint::Readyz,
            (&Method::GET, "/metrics") => Endpoint::Metrics,
            (&Method::GET, _) => {
                if let Some(rest) = path.strip_prefix("/v1/models/") {
                    return Some((Endpoint::Model, Some(id(rest)?)));
                }
                let rest = path.strip_prefix("/v1/responses/")?;
                return match rest.strip_suffix("/input_items") {
                    Some(response) => Some((Endpoint::InputItems, Some(id(response)?))),
                    None => Some((Endpoint::RetrieveResponse, Some(id(rest)?))),
                };
            }
            (&Method::DELETE, _) => {
                let rest = path.strip_prefix("/v1/responses/")?;
                return Some((Endpoint::RemoveResponse, Some(id(rest)?)));
            }
            _ => return None,
        };
        Some((endpoint, None))
    }

    /// The route pattern, as metrics and spans name it (`http.route`).
    fn pattern(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Messages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::Native => "/v1/shield/chat/completions",
            Endpoint::Responses | Endpoint::ResponsesUpgrade => "/v1/responses",
            Endpoint::RetrieveResponse | Endpoint::RemoveResponse => "/v1/responses/{id}",
            Endpoint::InputItems => "/v1/responses/{id}/input_items",
            Endpoint::Models => "/v1/models",
            Endpoint::Model => "/v1/models/{id}",
            Endpoint::Index => "/",
            Endpoint::Hello => "/api/hello",
            Endpoint::Healthz => "/healthz",
            Endpoint::Readyz => "/readyz",
            Endpoint::Metrics => "/metrics",
        }
    }
}

/// One worker's handler: the shared state and the worker's own egress.
pub struct App {
    pub state: Arc<ProxyState>,
    /// One HTTP client per worker thread: its pooled upstream connections live on the
    /// worker's own runtime, so an attempt never crosses threads.
    pub egress: Arc<egress::Egress>,
}

impl App {
    /// The arrival layer, outermost: the request id (`X-Request-Id` on every answer), the
    /// request's trail (issue 31), its log span; then the endpoint.
    pub async fn handle(&self, req: http::Request<Payload>, peer: std::net::SocketAddr) -> Response {
        use tracing::Instrument;
        let (head, body) = req.into_parts();
        let id = request_id(head.headers.get(REQUEST_ID));
        let path = head.uri.path();
        let anthropic = anthropic_shaped(path, &head.headers);
        let endpoint = Endpoint::of(&head.method, path);
        let pattern = endpoint.as_ref().map(|(e, _)| e.pattern());
        // The request's context from its arrival (issue 31): probes and scrapes have none.
        let trail = (!unobserved(path))
            .then(|| Arc::new(context::Trail::arrive(&head, Some(peer), id.clone(), self.state.metrics.clone())));
        // Every log line of the request carries its id and trace id (issue 31).
        let trace_id = trail.as_ref().and_then(|t| t.trace_id());
        let span = tracing::info_span!(
            "request",
            request_id = id.to_str().unwrap_or_default(),
            trace_id = trace_id.as_deref()
        );
        let req = Request::new(head, id.clone(), trail.clone());
        let mut response = self.call(endpoint, req, body).instrument(span).await;
        if anthropic {
            response.headers_mut().insert(ANTHROPIC_REQUEST_ID, id.clone());
        }
        response.headers_mut().insert(REQUEST_ID, id);
        if let Some(trail) = trail {
            // A streamed answer holds its own reference until the stream ends.
            trail.responded(response.status().as_u16(), pattern);
        }
        response
    }

    /// The endpoint's answer, as a boxed future: an endpoint's future is ~10 KB (the whole
    /// pipeline's state), and the connection's loop moves the request's future as it serves it, which
    /// copied all of it on every request (callgrind: ~10,700 bytes a request).
    fn call(&self, endpoint: Option<(Endpoint, Option<String>)>, req: Request, body: Payload) -> Answer {
        let (state, egress) = (self.state.clone(), self.egress.clone());
        let Some((endpoint, id)) = endpoint else { return ready(not_found()) };
        let id = id.unwrap_or_default();
        match endpoint {
            Endpoint::ChatCompletions => Box::pin(chat::chat_completions(req, body, state, egress)),
            Endpoint::Messages => Box::pin(messages::messages(req, body, state, egress)),
            Endpoint::CountTokens => Box::pin(messages::count_tokens(req, body, state)),
            Endpoint::Native => Box::pin(native::chat(req, body, state, egress)),
            Endpoint::Responses => Box::pin(responses::responses(req, body, state, egress)),
            Endpoint::ResponsesUpgrade => Box::pin(responses::upgrade(req)),
            Endpoint::RetrieveResponse => Box::pin(responses::retrieve(req, id, state)),
            Endpoint::RemoveResponse => Box::pin(responses::remove(req, id, state)),
            Endpoint::InputItems => Box::pin(responses::input_items(req, id, state)),
            Endpoint::Models => Box::pin(models::list(req, state, egress)),
            Endpoint::Model => Box::pin(models::get(req, id, state, egress)),
            Endpoint::Index => ready(index()),
            // Claude Code's connectivity probe (`HEAD /api/hello`, sent unless its
            // non-essential traffic is turned off): the client sees a reachable gateway.
            Endpoint::Hello => ready(Response::ok().finish()),
            Endpoint::Healthz => ready(healthz()),
            Endpoint::Readyz => ready(readyz(&state)),
            Endpoint::Metrics => ready(metrics_text(&state)),
        }
    }
}

/// An endpoint's answer, to come.
type Answer = std::pin::Pin<Box<dyn std::future::Future<Output = Response>>>;

fn ready(response: Response) -> Answer {
    Box::pin(std::future::ready(response))
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoints_are_named_by_method_and_path() {
        use super::{Endpoint as E, Method};
        let of = |method: Method, path: &str| super::Endpoint::of(&method, path);
        let id = |e: E, id: &str| Some((e, Some(id.to_string())));
        assert_eq!(of(Method::POST, "/v1/chat/completions"), Some((E::ChatCompletions, None)));
        assert_eq!(of(Method::GET, "/v1/chat/completions"), None, "a known path, another method");
        assert_eq!(of(Method::POST, "/v1/chat/completions/"), None);
        assert_eq!(of(Method::POST, "/v1/messages/count_tokens"), Some((E::CountTokens, None)));
        assert_eq!(of(Method::GET, "/v1/models/gpt%2D4o"), id(E::Model, "gpt-4o"));
        assert_eq!(of(Method::GET, "/v1/models/a/b"), None);
        assert_eq!(of(Method::GET, "/v1/models/"), None);
        assert_eq!(of(Method::GET, "/v1/responses/resp_1"), id(E::RetrieveResponse, "resp_1"));
        assert_eq!(of(Method::GET, "/v1/responses/resp_1/input_items"), id(E::InputItems, "resp_1"));
        assert_eq!(of(Method::GET, "/v1/responses//input_items"), None);
        assert_eq!(of(Method::GET, "/v1/responses/a/b"), None);
        assert_eq!(of(Method::DELETE, "/v1/responses/resp_1"), id(E::RemoveResponse, "resp_1"));
        assert_eq!(of(Method::GET, "/v1/responses"), Some((E::ResponsesUpgrade, None)));
        assert_eq!(of(Method::HEAD, "/"), Some((E::Index, None)));
        assert_eq!(of(Method::HEAD, "/api/hello"), Some((E::Hello, None)));
        assert_eq!(of(Method::HEAD, "/healthz"), None);
        assert_eq!(of(Method::PUT, "/v1/responses/resp_1"), None);
    }

    #[test]
    fn fresh_request_ids_are_32_hex_digits_and_distinct() {
        let (a, b) = (super::request_id(None), super::request_id(None));
        for id in [&a, &b] {
            let text = id.to_str().unwrap();
            assert_eq!(text.len(), 32, "{text}");
            assert!(text.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{text}");
        }
        assert_ne!(a, b);
        assert_eq!(a.as_bytes()[..16], b.as_bytes()[..16], "one process prefix");
        let (na, nb) = (
            u64::from_str_radix(&a.to_str().unwrap()[16..], 16).unwrap(),
            u64::from_str_radix(&b.to_str().unwrap()[16..], 16).unwrap(),
        );
        assert!(nb > na, "a counter");
        let inbound = http::HeaderValue::from_static("caller-id-1");
        assert_eq!(super::request_id(Some(&inbound)), inbound);
    }
}
