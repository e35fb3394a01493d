//! One request context, one end.
//!
//! Every request to the proxy's API gets a [`Trail`] when it arrives, before authentication
//! (the outermost layer makes it): its id, its SERVER span, and — as they become known — the
//! caller's tenant and key, the route, the rule, the targets tried and how it ended. The trail
//! ends once, when the last part of the request lets go of it (the handler's answer, or a
//! streamed answer's end, or the client going away): that end writes the access record
//! (`shield::access`, one line per request), `shield_http_requests_total` and the span's
//! attributes, whatever happened — 401, 400, 413, a limit, a guardrail, the default path,
//! answered, failed, a stream completed or broken.
//!
//! A routed request also carries a [`RequestContext`] from the moment its route is known;
//! [`RequestContext::end`] consumes it and writes, once, what only a routed call has — the
//! usage row, the routing metrics and the provenance line — and tells the trail how it ended.
//! Nothing else in the request path writes usage or routing metrics.
//!
//! Never logs a prompt, a header value or a credential: ids, classes and timings only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shield_core::plan::Excluded;
use shield_core::run::{Attempt, Halt};
use shield_core::snapshot::ApiKeyRecord;

use crate::limits::Admission;
use crate::metrics::{Metrics, Observed};
use crate::usage::{Answered, UsageBuffer};

/// What is known about one request, from its arrival to its end (see the module's doc).
pub struct Trail {
    /// The id as the outermost layer chose it (a shared buffer: no copy per request).
    request_id: http::HeaderValue,
    method: http::Method,
    /// Kept only when the access record is written: decided once, at arrival.
    path: Option<String>,
    arrived: Instant,
    /// The request's SERVER span (tracing on).
    span: Option<opentelemetry::Context>,
    metrics: Arc<Metrics>,
    facts: parking_lot::Mutex<Facts>,
}

#[derive(Default)]
struct Facts {
    /// The caller's key (its tenant and id), shared with the snapshot.
    caller: Option<Arc<ApiKeyRecord>>,
    route: Option<String>,
    rule: Option<String>,
    budget: Option<&'static str>,
    halt: Option<&'static str>,
    target: Option<String>,
    attempts: usize,
    failovers: usize,
    stream: bool,
    /// Set by the path that knew (routed endings, guardrails, the default path); otherwise
    /// read from the status.
    ending: Option<&'static str>,
    status: u16,
    endpoint: Option<&'static str>,
}

impl Trail {
    /// The trail of a request that has just arrived.
    pub fn arrive(
        head: &http::request::Parts,
        peer: Option<std::net::SocketAddr>,
        request_id: http::HeaderValue,
        metrics: Arc<Metrics>,
    ) -> Trail {
        let span = crate::observe::tracer().map(|tracer| shield_telemetry::server::start_head(tracer, head, peer));
        let access = tracing::enabled!(target: "shield::access", tracing::Level::INFO);
        Trail {
            request_id,
            method: head.method.clone(),
            path: access.then(|| head.uri.path().to_string()),
            arrived: Instant::now(),
            span,
            metrics,
            facts: parking_lot::Mutex::default(),
        }
    }

    /// The request's SERVER span, the parent of its attempts' spans.
    pub fn span(&self) -> Option<&opentelemetry::Context> {
        self.span.as_ref()
    }

    /// The trace id, for the request's log lines.
    pub fn trace_id(&self) -> Option<String> {
        self.span.as_ref().and_then(shield_telemetry::server::trace_id)
    }

    /// The caller was authenticated.
    pub fn caller(&self, key: &Arc<ApiKeyRecord>) {
        self.facts.lock().caller = Some(key.clone());
    }

    /// The request named this route (or the default path's model).
    pub fn route(&self, route: &str, stream: bool) {
        let mut facts = self.facts.lock();
        facts.route = Some(route.to_string());
        facts.stream = stream;
    }

    /// How the request ended, when the status alone would not say it.
    pub fn ending(&self, ending: &'static str) {
        self.facts.lock().ending = Some(ending);
    }

    /// The handler answered with `status`; `endpoint`: the matched route pattern.
    pub fn responded(&self, status: u16, endpoint: Option<&'static str>) {
        if let Some(cx) = &self.span {
            shield_telemetry::server::responded(cx, self.method.as_str(), endpoint, status);
        }
        let mut facts = self.facts.lock();
        facts.status = status;
        facts.endpoint = endpoint;
    }

    /// The request id's text.
    fn id(&self) -> &str {
        self.request_id.to_str().unwrap_or_default()
    }

    /// The access record: one `shield::access` line per request.
    fn access_record(&self, path: &str, facts: &Facts, ending: &str, tenant: &str) {
        let duration_ms = self.arrived.elapsed().as_secs_f64() * 1000.0;
        let trace_id = self.trace_id();
        tracing::info!(
            target: "shield::access",
            request_id = self.id(),
            trace_id = trace_id.as_deref().unwrap_or(""),
            method = %self.method,
            path,
            status = facts.status,
            ending,
            tenant,
            key_id = facts.caller.as_ref().map_or("", |k| k.key_id.as_str()),
            route = facts.route.as_deref().unwrap_or(""),
            rule = facts.rule.as_deref().unwrap_or(""),
            target = facts.target.as_deref().unwrap_or(""),
            attempts = facts.attempts,
            failovers = facts.failovers,
            halt = facts.halt.unwrap_or(""),
            stream = facts.stream,
            duration_ms,
            "request"
        );
    }

    /// A routed call's end (from [`RequestContext::end`]).
    fn routed(
        &self,
        halt: Halt,
        target: Option<&str>,
        attempts: &[Attempt],
        rule: Option<String>,
        budget: &'static str,
    ) {
        let mut facts = self.facts.lock();
        facts.halt = Some(halt.as_str());
        facts.target = target.map(str::to_string);
        facts.attempts = attempts.len();
        facts.failovers = attempts.iter().filter(|a| a.outcome == "failed").count();
        facts.rule = rule;
        facts.budget = Some(budget);
        if facts.ending.is_none() {
            facts.ending = Some(ending_of(halt, facts.stream));
        }
    }
}

/// How a routed call ended, by its halt.
fn ending_of(halt: Halt, stream: bool) -> &'static str {
    match halt {
        Halt::Succeeded if stream => "stream_completed",
        Halt::Succeeded => "answered",
        Halt::VisibleOutput => "stream_broken",
        Halt::Cancelled => "client_gone",
        Halt::Deadline => "deadline",
        Halt::Denied => "rule_refused",
        Halt::BudgetBlocked => "budget_blocked",
        Halt::IneligibleFailure => "upstream_refused",
        Halt::Exhausted | Halt::NoEligibleTarget | Halt::AttemptBound => "all_failed",
    }
}

/// How a request that was not routed ended, by its status.
fn ending_of_status(status: u16) -> &'static str {
    match status {
        200..=399 => "served",
        400 => "bad_request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        413 => "too_large",
        429 => "rate_limited",
        508 => "loop_detected",
        503 => "unavailable",
        500..=599 => "upstream_failed",
        _ => "client_error",
    }
}

impl Drop for Trail {
    /// The request's one end: the access record, the metric, the SERVER span.
    fn drop(&mut self) {
        use opentelemetry::KeyValue;
        use opentelemetry::trace::TraceContextExt;
        let facts = std::mem::take(&mut *self.facts.lock());
        // A status of 0: the handler never answered (the client went away before it did).
        let ending =
            facts.ending.unwrap_or(if facts.status == 0 { "client_gone" } else { ending_of_status(facts.status) });
        let endpoint = facts.endpoint.unwrap_or("unmatched");
        let tenant = facts.caller.as_ref().map_or("", |k| k.tenant.as_str());
        self.metrics.http_request(tenant, endpoint, facts.status, ending);
        // Only when the record is written: the trace id's text and the clock cost otherwise.
        if let Some(path) = &self.path {
            self.access_record(path, &facts, ending, tenant);
        }
        if let Some(cx) = self.span.take() {
            let span = cx.span();
            let mut attributes =
                vec![KeyValue::new("shield.request_id", self.id().to_string()), KeyValue::new("shield.ending", ending)];
            let mut add = |key: &'static str, value: Option<String>| {
                if let Some(value) = value {
                    attributes.push(KeyValue::new(key, value));
                }
            };
            add("shield.tenant", facts.caller.as_ref().map(|k| k.tenant.clone()));
            add("shield.key_id", facts.caller.as_ref().map(|k| k.key_id.clone()));
            add("shield.route", facts.route);
            add("shield.rule", facts.rule);
            add("shield.budget", facts.budget.map(str::to_string));
            add("shield.halt", facts.halt.map(str::to_string));
            add("shield.target", facts.target);
            span.set_attributes(attributes);
            span.end();
        }
    }
}

/// A routed request, from its arrival to its end.
pub struct RequestContext {
    /// The caller's key, its tenant and id (usage and spend per key, issue 32): shared with
    /// the snapshot, not copied per request.
    caller: Arc<ApiKeyRecord>,
    route: String,
    arrived: Instant,
    stream: bool,
    usage: Arc<UsageBuffer>,
    metrics: Arc<Metrics>,
    /// The rate limits it was admitted under: token reservations settle at the end.
    admission: Option<Arc<Admission>>,
    /// The request's trail, told how the routed call ended; held until the end (a stream's).
    trail: Option<Arc<Trail>>,
    /// The deciding rule (`{index, description}`) and the budget state, for the trail.
    rule: Option<String>,
    budget: &'static str,
}

/// How a routed request ended.
pub struct Ending<'a> {
    pub halt: Halt,
    /// The target that answered (or was refused by), if any.
    pub target: Option<&'a str>,
    pub attempts: &'a [Attempt],
    pub excluded: &'a [Excluded],
    /// The tokens and cost of each answer produced — also when Shield then refused it, its
    /// stream broke, or a resumed stream replaced it: they were paid for.
    pub answered: Vec<Answered<'a>>,
    /// When the caller started receiving the answer (a stream's commit point); `None`: the end
    /// itself.
    pub answered_at: Option<Instant>,
    /// Time spent in upstream calls before then: what Shield added is the rest.
    pub upstream: Duration,
    /// Streams: malformed upstream events dropped.
    pub malformed_events: u32,
}

impl<'a> Ending<'a> {
    /// An ending with nothing but its halt, what was tried and the time that took upstream.
    pub fn of(halt: Halt, attempts: &'a [Attempt], excluded: &'a [Excluded], upstream: Duration) -> Ending<'a> {
        Ending {
            halt,
            target: None,
            attempts,
            excluded,
            answered: Vec::new(),
            answered_at: None,
            upstream,
            malformed_events: 0,
        }
    }
}

impl RequestContext {
    pub fn new(
        caller: Arc<ApiKeyRecord>,
        route: &str,
        arrived: Instant,
        stream: bool,
        usage: Arc<UsageBuffer>,
        metrics: Arc<Metrics>,
    ) -> RequestContext {
        RequestContext {
            caller,
            route: route.to_string(),
            arrived,
            stream,
            usage,
            metrics,
            admission: None,
            trail: None,
            rule: None,
            budget: "",
        }
    }

    /// The request's trail (from its arrival).
    pub fn with_trail(mut self, trail: Option<Arc<Trail>>) -> RequestContext {
        self.trail = trail;
        self
    }

    /// How the request ended, when its halt would not say it (a guardrail refused a stream).
    pub fn ending(&self, ending: &'static str) {
        if let Some(trail) = &self.trail {
            trail.ending(ending);
        }
    }

    /// The rule that decided and the budget state, once the plan has run.
    pub fn decided(&mut self, rule: Option<&serde_json::Value>, budget: &'static str) {
        self.rule = rule.and_then(|r| r.get("description")).and_then(|d| d.as_str()).map(str::to_string);
        self.budget = budget;
    }

    /// The request was admitted under these rate limits.
    pub fn admitted(mut self, admission: Option<Arc<Admission>>) -> RequestContext {
        self.admission = admission;
        self
    }

    pub fn tenant(&self) -> &str {
        &self.caller.tenant
    }

    pub fn route(&self) -> &str {
        &self.route
    }

    /// The request's one end: usage, metrics and the provenance record.
    pub fn end(self, ending: Ending<'_>) {
        let Ending { halt, target, attempts, excluded, answered, answered_at, upstream, malformed_events } = ending;
        let stream_broken = answered.iter().any(|a| a.stream_broken);
        let tenant = self.tenant();
        self.usage.record(tenant, &self.caller.key_id, &self.route, attempts, &answered);
        if let Some(admission) = &self.admission {
            // Issue 18: token limits settle to the reported usage of every answer produced.
            admission.settle(answered.iter().map(|a| a.input_tokens + a.output_tokens).sum());
        }
        let until = answered_at.unwrap_or_else(Instant::now);
        self.metrics.routed(Observed {
            tenant,
            route: &self.route,
            target,
            halt: halt.as_str(),
            attempts,
            added: until.saturating_duration_since(self.arrived).saturating_sub(upstream),
            stream: self.stream,
        });
        if let Some(trail) = &self.trail {
            trail.routed(halt, target, attempts, self.rule.clone(), self.budget);
        }
        if self.stream {
            self.metrics.stream_ended(tenant, &self.route, target.unwrap_or(""), stream_broken, malformed_events);
        }
        // The provenance record, one line per request. Debug level keeps the hot path free of
        // it unless asked for (`RUST_LOG=shield_proxy::context=debug`).
        if tracing::enabled!(tracing::Level::DEBUG) {
            let tokens: Vec<(u64, u64, i64)> =
                answered.iter().map(|a| (a.input_tokens, a.output_tokens, a.cost_micros)).collect();
            tracing::debug!(
                tenant, route = %self.route, target = target.unwrap_or(""), halt = halt.as_str(),
                stream = self.stream, tokens = ?tokens, malformed_events,
                attempts = %serde_json::to_string(attempts).unwrap_or_default(),
                excluded = %serde_json::to_string(excluded).unwrap_or_default(), "request ended"
            );
        }
    }
}
