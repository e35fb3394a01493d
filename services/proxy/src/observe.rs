//! What each upstream attempt leaves behind for operators: one OpenTelemetry CLIENT span
//! (`chat {model}`, a child of the request's SERVER span, its context sent upstream as
//! `traceparent`) and the GenAI client metrics (token usage by type, operation duration, time
//! to first chunk), following the GenAI semantic conventions v1.41 ([`shield_telemetry::genai`]).
//!
//! An [`AttemptTrace`] is started just before the attempt's request is built and finished
//! when the attempt's outcome is known: a failure, a non-streamed answer, or — for a stream —
//! its end, so the span covers the whole stream. One dropped unfinished (the client went away)
//! ends as `cancelled`. Metrics are recorded whether or not tracing is on; spans only when it
//! is. Prompts and answers go on spans only with `SHIELD_TRACE_CONTENT=1`, and then with every
//! secret the guardrails' detector knows replaced.

use std::sync::{Arc, LazyLock};
use std::time::Instant;

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;
use shield_core::exchange::Stop;
use shield_core::outcome::Class;
use shield_core::target::{Flavor, Target};
use shield_core::usage::TokenUsage;
use shield_telemetry::genai;

use crate::body::ChatRequest;
use crate::metrics::{GenAiSeries, Metrics};

/// The proxy's tracer (instrumentation scope `shield-proxy`), when tracing is on.
pub fn tracer() -> Option<&'static SdkTracer> {
    static TRACER: LazyLock<Option<SdkTracer>> = LazyLock::new(|| shield_telemetry::tracer("shield-proxy"));
    TRACER.as_ref()
}

/// `SHIELD_TRACE_CONTENT=1`: prompts and answers on attempt spans (secrets redacted).
pub fn capture_content() -> bool {
    static ON: LazyLock<bool> =
        LazyLock::new(|| std::env::var("SHIELD_TRACE_CONTENT").is_ok_and(|v| matches!(v.trim(), "1" | "true" | "on")));
    *ON
}

/// `gen_ai.provider.name` of a target: the conventions' names for the API it speaks.
pub fn provider_name(target: &Target) -> &'static str {
    match target.flavor {
        Flavor::Openai => "openai",
        Flavor::Azure => "azure.ai.openai",
        Flavor::Anthropic => "anthropic",
        Flavor::Gemini => "gcp.gemini",
        Flavor::Bedrock => "aws.bedrock",
        Flavor::Vertex => "gcp.vertex_ai",
    }
}

/// Where an attempt's observations go: the request's SERVER span and the metrics.
#[derive(Clone, Copy)]
pub struct Observer<'a> {
    pub parent: Option<&'a Context>,
    pub metrics: &'a Arc<Metrics>,
    pub tenant: &'a str,
    pub route: &'a str,
}

/// One upstream attempt's span and metric labels, from its start to its outcome.
pub struct AttemptTrace {
    span: Option<Context>,
    metrics: Arc<Metrics>,
    series: Arc<GenAiSeries>,
    started: Instant,
    first_chunk: Option<f64>,
    finished: bool,
}

/// What a successful attempt answered.
pub struct Answered<'a> {
    pub model: &'a str,
    pub id: &'a str,
    pub stop: Option<Stop>,
    pub usage: Option<TokenUsage>,
    /// The answer's text, for `SHIELD_TRACE_CONTENT`.
    pub text: Option<&'a str>,
}

impl AttemptTrace {
    /// Starts attempt `n` at `target`; `retry`: the previous attempt was at the same target.
    pub fn start(
        observer: Observer<'_>,
        target: &Target,
        n: u32,
        retry: bool,
        stream: bool,
        request: &ChatRequest,
        endpoint: Option<&url::Url>,
    ) -> AttemptTrace {
        let provider = provider_name(target);
        let span = match (tracer(), observer.parent) {
            (Some(tracer), Some(parent)) => {
                let attempt = Start { target, provider, n, retry, stream, endpoint };
                Some(start_span(tracer, parent, attempt, request))
            }
            _ => None,
        };
        AttemptTrace {
            span,
            metrics: observer.metrics.clone(),
            series: observer.metrics.gen_ai_series([
                observer.tenant,
                observer.route,
                &target.id,
                provider,
                &target.model,
            ]),
            started: Instant::now(),
            first_chunk: None,
            finished: false,
        }
    }

    /// The span's context, to send upstream as `traceparent`.
    pub fn context(&self) -> Option<&Context> {
        self.span.as_ref()
    }

    /// A stream's first usable event arrived (its commit point).
    pub fn first_chunk(&mut self) {
        let seconds = self.started.elapsed().as_secs_f64();
        self.first_chunk = Some(seconds);
        if let Some(cx) = &self.span {
            cx.span().set_attribute(KeyValue::new(genai::RESPONSE_TIME_TO_FIRST_CHUNK, seconds));
        }
    }

    /// The attempt failed with `class` (`committed`: after the caller saw output).
    pub fn failed(mut self, class: Class, status: Option<u16>, committed: bool) {
        self.finish_failed(class.as_str(), status, committed);
    }

    fn finish_failed(&mut self, error: &str, status: Option<u16>, committed: bool) {
        self.finished = true;
        let seconds = self.started.elapsed().as_secs_f64();
        self.metrics.gen_ai_attempt(&self.series, seconds, self.first_chunk, Some(error), None);
        if let Some(cx) = self.span.take() {
            let span = cx.span();
            let mut attributes = vec![
                KeyValue::new(genai::ERROR_TYPE, error.to_string()),
                KeyValue::new("shield.failure_class", error.to_string()),
                KeyValue::new("shield.committed", committed),
            ];
            if let Some(status) = status {
                attributes.push(KeyValue::new("http.response.status_code", i64::from(status)));
            }
            span.set_attributes(attributes);
            span.set_status(Status::error(error.to_string()));
            span.end();
        }
    }

    /// The attempt answered (a stream: it ended cleanly).
    pub fn answered(mut self, answer: Answered<'_>) {
        self.finished = true;
        let seconds = self.started.elapsed().as_secs_f64();
        self.metrics.gen_ai_attempt(&self.series, seconds, self.first_chunk, None, answer.usage.as_ref());
        let Some(cx) = self.span.take() else { return };
        let span = cx.span();
        let mut attributes = vec![KeyValue::new("shield.committed", true)];
        if !answer.model.is_empty() {
            attributes.push(KeyValue::new(genai::RESPONSE_MODEL, answer.model.to_string()));
        }
        if !answer.id.is_empty() {
            attributes.push(KeyValue::new(genai::RESPONSE_ID, answer.id.to_string()));
        }
        if let Some(stop) = answer.stop {
            let reason = crate::chat::wire::finish_reason(stop).to_string();
            attributes.push(KeyValue::new(
                genai::RESPONSE_FINISH_REASONS,
                opentelemetry::Value::Array(vec![opentelemetry::StringValue::from(reason)].into()),
            ));
        }
        if let Some(usage) = answer.usage {
            attributes.extend([
                KeyValue::new(genai::USAGE_INPUT_TOKENS, saturating_i64(usage.input)),
                KeyValue::new(genai::USAGE_OUTPUT_TOKENS, saturating_i64(usage.output)),
                KeyValue::new(genai::USAGE_CACHE_READ_INPUT_TOKENS, saturating_i64(usage.cache_read)),
                KeyValue::new(genai::USAGE_CACHE_CREATION_INPUT_TOKENS, saturating_i64(usage.cache_write)),
            ]);
        }
        if let (true, Some(text)) = (capture_content(), answer.text) {
            let messages = serde_json::json!([{"role": "assistant", "parts": [{"type": "text", "content": shield_core::detect::redact_secrets(text)}]}]);
            attributes.push(KeyValue::new(genai::OUTPUT_MESSAGES, messages.to_string()));
        }
        span.set_attributes(attributes);
        span.end();
    }
}

impl Drop for AttemptTrace {
    fn drop(&mut self) {
        if !self.finished {
            // The call was dropped before its outcome: the client went away.
            self.finish_failed("cancelled", None, self.first_chunk.is_some());
        }
    }
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// What an attempt's span starts with.
struct Start<'a> {
    target: &'a Target,
    provider: &'static str,
    n: u32,
    retry: bool,
    stream: bool,
    /// The target's parsed base URL (`server.address`, `server.port`).
    endpoint: Option<&'a url::Url>,
}

fn start_span(tracer: &SdkTracer, parent: &Context, attempt: Start<'_>, request: &ChatRequest) -> Context {
    let Start { target, provider, n, retry, stream, endpoint } = attempt;
    let mut attributes = vec![
        KeyValue::new(genai::OPERATION_NAME, genai::CHAT),
        KeyValue::new(genai::PROVIDER_NAME, provider),
        KeyValue::new(genai::REQUEST_MODEL, target.model.clone()),
        KeyValue::new("shield.target", target.id.clone()),
        KeyValue::new("shield.attempt", i64::from(n)),
        KeyValue::new("shield.retry", retry),
    ];
    if stream {
        attributes.push(KeyValue::new(genai::REQUEST_STREAM, true));
    }
    if let Some(url) = endpoint {
        if let Some(host) = url.host_str() {
            attributes.push(KeyValue::new(genai::SERVER_ADDRESS, host.to_string()));
        }
        if let Some(port) = url.port_or_known_default() {
            attributes.push(KeyValue::new(genai::SERVER_PORT, i64::from(port)));
        }
    }
    if let Some(max) = request.max_output_tokens() {
        attributes.push(KeyValue::new(genai::REQUEST_MAX_TOKENS, saturating_i64(max)));
    }
    if let Some(t) = request.exchange.temperature {
        attributes.push(KeyValue::new(genai::REQUEST_TEMPERATURE, t));
    }
    if let Some(p) = request.exchange.top_p {
        attributes.push(KeyValue::new(genai::REQUEST_TOP_P, p));
    }
    if capture_content() {
        let prompt = shield_core::detect::redact_secrets(&request.prompt_text());
        let messages = serde_json::json!([{"role": "user", "parts": [{"type": "text", "content": prompt}]}]);
        attributes.push(KeyValue::new(genai::INPUT_MESSAGES, messages.to_string()));
    }
    let span = tracer
        .span_builder(format!("{} {}", genai::CHAT, target.model))
        .with_kind(SpanKind::Client)
        .with_attributes(attributes)
        .start_with_context(tracer, parent);
    parent.with_span(span)
}
