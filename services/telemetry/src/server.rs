//! SERVER spans for Shield's services (the admin's actix-web, the proxy's hyper server) (HTTP semantic conventions): started when a
//! request arrives — continuing the caller's `traceparent` — named `{method}` until routing
//! has matched a pattern, then `{method} {http.route}` (`POST /v1/chat/completions`). A 5xx
//! sets the span's status to error; a 4xx leaves it unset (the caller's fault, not the
//! server's). The span ends when the last holder of its context lets go of it: for a
//! streamed answer, when the stream ends.

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

/// Starts the SERVER span of an inbound request (an actix-web service: the admin).
pub fn start(tracer: &SdkTracer, req: &actix_web::dev::ServiceRequest) -> Context {
    let agent = req.headers().get("user-agent").and_then(|v| v.to_str().ok());
    let parent = crate::parent_from(req.headers());
    span(tracer, parent, req.method().as_str(), req.path(), agent, req.peer_addr())
}

/// Starts the SERVER span of an inbound request, from its head (the proxy's hyper server).
pub fn start_head(tracer: &SdkTracer, head: &http::request::Parts, peer: Option<std::net::SocketAddr>) -> Context {
    let agent = head.headers.get("user-agent").and_then(|v| v.to_str().ok());
    let parent = crate::parent_from_headers(&head.headers);
    span(tracer, parent, head.method.as_str(), head.uri.path(), agent, peer)
}

fn span(
    tracer: &SdkTracer,
    parent: Context,
    method: &str,
    path: &str,
    agent: Option<&str>,
    peer: Option<std::net::SocketAddr>,
) -> Context {
    let method = method_name(method);
    let mut attributes = vec![
        KeyValue::new("http.request.method", method.clone()),
        KeyValue::new("url.path", path.to_string()),
        // Shield's services listen on plain HTTP; TLS ends in front of them.
        KeyValue::new("url.scheme", "http"),
    ];
    if let Some(agent) = agent {
        attributes.push(KeyValue::new("user_agent.original", agent.chars().take(256).collect::<String>()));
    }
    if let Some(peer) = peer {
        attributes.push(KeyValue::new("network.peer.address", peer.ip().to_string()));
    }
    let span = tracer
        .span_builder(method)
        .with_kind(SpanKind::Server)
        .with_attributes(attributes)
        .start_with_context(tracer, &parent);
    parent.with_span(span)
}

/// A method's name without an allocation for the usual ones.
fn method_name(method: &str) -> std::borrow::Cow<'static, str> {
    match method {
        "GET" => "GET".into(),
        "POST" => "POST".into(),
        "PUT" => "PUT".into(),
        "DELETE" => "DELETE".into(),
        "HEAD" => "HEAD".into(),
        "PATCH" => "PATCH".into(),
        "OPTIONS" => "OPTIONS".into(),
        _ => method.to_string().into(),
    }
}

/// The answer's status and the matched route pattern, once the handler has answered.
pub fn responded(cx: &Context, method: &str, pattern: Option<&str>, status: u16) {
    let span = cx.span();
    if let Some(pattern) = pattern {
        span.update_name(format!("{method} {pattern}"));
        span.set_attribute(KeyValue::new("http.route", pattern.to_string()));
    }
    span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status)));
    if status >= 500 {
        span.set_attribute(KeyValue::new(crate::genai::ERROR_TYPE, status.to_string()));
        span.set_status(Status::error(format!("answered {status}")));
    }
}

/// The trace id of a span context, for log lines (`None` when tracing is off).
pub fn trace_id(cx: &Context) -> Option<String> {
    let span = cx.span();
    let context = span.span_context();
    context.is_valid().then(|| context.trace_id().to_string())
}

/// Middleware tracing every request of a service (`from_fn(server::traced)`), under the
/// instrumentation scope `shield-admin`: a SERVER span from arrival to the answer. Probes
/// (`/healthz`, `/readyz`) and scrapes (`/metrics`) are not traced.
pub async fn traced(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    static TRACER: std::sync::LazyLock<Option<SdkTracer>> = std::sync::LazyLock::new(|| crate::tracer("shield-admin"));
    let Some(tracer) = TRACER.as_ref().filter(|_| !matches!(req.path(), "/healthz" | "/readyz" | "/metrics")) else {
        return next.call(req).await;
    };
    let cx = start(tracer, &req);
    let method = req.method().as_str().to_string();
    let result = next.call(req).await;
    match &result {
        Ok(response) => {
            let pattern = response.request().match_pattern();
            responded(&cx, &method, pattern.as_deref(), response.status().as_u16());
        }
        Err(err) => responded(&cx, &method, None, err.as_response_error().status_code().as_u16()),
    }
    cx.span().end();
    result
}
