//! OpenTelemetry traces for Shield's services (issue 31).
//!
//! Off unless an OTLP endpoint is configured with the standard variables
//! (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, used as given, or `OTEL_EXPORTER_OTLP_ENDPOINT`, to
//! which `/v1/traces` is added); `OTEL_SDK_DISABLED=true` turns it off. Spans go out as
//! OTLP/HTTP protobuf; `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`
//! (+`_ARG`), `OTEL_EXPORTER_OTLP_HEADERS` / `_TIMEOUT` and `OTEL_BSP_*` are honoured — the
//! SDK reads them; this crate only adds what the SDK lacks:
//!
//! * [`export::Queue`]: the span queue between the request path and the exporter. The SDK's
//!   batch processor drops spans silently when its queue is full; Shield counts every span it
//!   drops ([`dropped_spans`], on `/metrics`), whether the queue was full or the collector
//!   refused or timed out. Nothing on the request path ever waits for the collector.
//! * W3C trace context in ([`parent_from`]) and out ([`inject`]) without the global
//!   propagator (a no-op unless set, and a lock per use).
//! * [`server`]: SERVER spans for actix-web services, shared by the proxy and the admin API.
//! * [`genai`]: the OpenTelemetry GenAI attribute names Shield emits, in one place.

pub mod export;
pub mod genai;
pub mod server;

use std::sync::OnceLock;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

pub use opentelemetry;

/// The process's tracer provider, once [`init`] found an endpoint.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Keeps tracing on; flushes what is queued (bounded by the export timeout) when dropped at
/// the process's end.
pub struct Telemetry(());

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = PROVIDER.get()
            && let Err(err) = provider.shutdown()
        {
            tracing::warn!(error = %err, "traces could not be flushed at shutdown");
        }
    }
}

/// Where traces go, read from the standard variables: `None` when no OTLP endpoint is set.
pub fn configured_endpoint() -> Option<String> {
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return None;
    }
    set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| format!("{}/v1/traces", base.trim_end_matches('/'))))
}

/// Turns tracing on when an OTLP endpoint is configured. `service` is the `service.name` used
/// when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one. Call once, at
/// start-up, before the services are built; keep the returned guard until the process ends.
pub fn init(service: &str) -> Result<Option<Telemetry>, String> {
    let Some(endpoint) = configured_endpoint() else { return Ok(None) };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|err| format!("the OTLP trace exporter could not be built: {err}"))?;
    let mut resource = Resource::builder().build();
    let named = resource
        .get(&opentelemetry::Key::new("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    if !named {
        resource = Resource::builder().with_service_name(service.to_string()).build();
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(export::Queue::start(exporter, export::QueueConfig::from_env()))
        .with_resource(resource)
        .build();
    PROVIDER.set(provider).map_err(|_| "tracing was initialised twice".to_string())?;
    tracing::info!(endpoint = %redact_endpoint(&endpoint), "sending traces with OTLP/HTTP");
    Ok(Some(Telemetry(())))
}

/// An endpoint for a log line: scheme, host and path, never userinfo or a query.
fn redact_endpoint(endpoint: &str) -> String {
    let (scheme, rest) = endpoint.split_once("://").unwrap_or(("", endpoint));
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    format!("{scheme}://{rest}")
}

/// The tracer of one of Shield's services (its instrumentation scope), when tracing is on.
pub fn tracer(scope: &'static str) -> Option<SdkTracer> {
    PROVIDER.get().map(|provider| provider.tracer(scope))
}

/// Spans dropped instead of exported: the queue was full, or the collector refused, failed
/// or timed out. Exported spans are counted by [`exported_spans`].
pub fn dropped_spans() -> (u64, u64) {
    export::dropped()
}

pub fn exported_spans() -> u64 {
    export::exported()
}

/// The caller's trace context (`traceparent`, `tracestate`), as the parent of a SERVER span.
/// An absent or malformed header yields an empty context: the span starts a new trace.
pub fn parent_from(headers: &actix_web::http::header::HeaderMap) -> Context {
    extract(|key| headers.get(key).and_then(|v| v.to_str().ok()), || headers.keys().map(|k| k.as_str()).collect())
}

/// [`parent_from`] for an `http` header map (the proxy's hyper server).
pub fn parent_from_headers(headers: &http::HeaderMap) -> Context {
    extract(|key| headers.get(key).and_then(|v| v.to_str().ok()), || headers.keys().map(|k| k.as_str()).collect())
}

/// The trace context read through a header map's lookups (actix-web's and `http`'s differ).
fn extract<'a>(get: impl Fn(&str) -> Option<&'a str>, keys: impl Fn() -> Vec<&'a str>) -> Context {
    // The marker ties the lookups' `'a` to the extractor, so that `'a` outlives a borrow of it.
    struct Inbound<'a, G, K>(G, K, std::marker::PhantomData<&'a str>);
    impl<'a, G: Fn(&str) -> Option<&'a str>, K: Fn() -> Vec<&'a str>> Extractor for Inbound<'a, G, K> {
        fn get(&self, key: &str) -> Option<&str> {
            (self.0)(key)
        }
        fn keys(&self) -> Vec<&str> {
            (self.1)()
        }
    }
    TraceContextPropagator::new().extract(&Inbound(get, keys, std::marker::PhantomData))
}

/// Writes `cx`'s span as `traceparent` (and `tracestate`, when it has one) into an upstream
/// request's headers, replacing any the caller sent. Formatted into a fixed buffer: the SDK's
/// propagator formats with `format!` and was the largest single cost of tracing per attempt.
pub fn inject(cx: &Context, headers: &mut http::HeaderMap) {
    use opentelemetry::trace::TraceContextExt;
    let span = cx.span();
    let context = span.span_context();
    if !context.is_valid() {
        return;
    }
    // `00-{trace id, 32 hex}-{span id, 16 hex}-{flags, 2 hex}`
    let mut traceparent = *b"00-00000000000000000000000000000000-0000000000000000-00";
    let parts = [
        (3..35, &context.trace_id().to_bytes()[..]),
        (36..52, &context.span_id().to_bytes()[..]),
        (53..55, &[context.trace_flags().to_u8()][..]),
    ];
    for (range, bytes) in parts {
        if let Some(slot) = traceparent.get_mut(range) {
            let _ = hex::encode_to_slice(bytes, slot);
        }
    }
    if let Ok(value) = http::HeaderValue::from_bytes(&traceparent) {
        headers.insert(TRACEPARENT, value);
    }
    if *context.trace_state() == opentelemetry::trace::TraceState::default() {
        headers.remove(TRACESTATE);
    } else if let Ok(value) = http::HeaderValue::from_str(&context.trace_state().header()) {
        headers.insert(TRACESTATE, value);
    }
}

const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

/// `KeyValue` shorthand for the span builders of the services.
pub fn kv(key: &'static str, value: impl Into<opentelemetry::Value>) -> KeyValue {
    KeyValue::new(key, value)
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};

    #[test]
    fn trace_context_goes_in_and_out() {
        let mut inbound = actix_web::http::header::HeaderMap::new();
        inbound.insert(
            actix_web::http::header::HeaderName::from_static("traceparent"),
            actix_web::http::header::HeaderValue::from_static(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        );
        let cx = super::parent_from(&inbound);
        let span = cx.span().span_context().clone();
        assert!(span.is_remote() && span.is_sampled());
        assert_eq!(span.trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");

        let child = SpanContext::new(
            span.trace_id(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let mut outbound = http::HeaderMap::new();
        outbound.insert("traceparent", http::HeaderValue::from_static("00-caller-caller-01"));
        super::inject(&opentelemetry::Context::new().with_remote_span_context(child), &mut outbound);
        assert_eq!(outbound["traceparent"], "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01");
        assert!(outbound.get("tracestate").is_none());
        let state = TraceState::from_key_value([("vendor", "x1")]).unwrap();
        let with_state = SpanContext::new(
            span.trace_id(),
            SpanId::from_hex("00f067aa0ba902b8").unwrap(),
            TraceFlags::default(),
            false,
            state,
        );
        super::inject(&opentelemetry::Context::new().with_remote_span_context(with_state), &mut outbound);
        assert_eq!(outbound["traceparent"], "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b8-00");
        assert_eq!(outbound["tracestate"], "vendor=x1");

        let garbage = {
            let mut h = actix_web::http::header::HeaderMap::new();
            h.insert(
                actix_web::http::header::HeaderName::from_static("traceparent"),
                actix_web::http::header::HeaderValue::from_static("not-a-trace"),
            );
            h
        };
        assert!(!super::parent_from(&garbage).span().span_context().is_valid());
        let _ = TraceId::INVALID;
    }

    #[test]
    fn endpoints_in_logs_lose_credentials_and_queries() {
        assert_eq!(
            super::redact_endpoint("https://user:pw@otel.example:4318/v1/traces?k=s"),
            "https://otel.example:4318/v1/traces"
        );
    }
}
