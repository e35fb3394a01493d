//! One request context, one end. A routed request carries a [`RequestContext`] from the
//! moment its route is known to its end; [`RequestContext::end`] consumes it and writes, once,
//! everything recorded about the request — the usage row, the metrics and the provenance
//! line — whichever way it ended: answered, refused (deny rule, budget, output guardrail),
//! every attempt failed, the deadline, a stream completed, broken or abandoned by its client.
//! Nothing else in the request path writes usage or routing metrics.
//!
//! Never logs a prompt, a header value or a credential: ids, classes and timings only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shield_core::plan::Excluded;
use shield_core::run::{Attempt, Halt};

use crate::limits::Admission;
use crate::metrics::{Metrics, Observed};
use crate::usage::{Answered, UsageBuffer};

/// A routed request, from its arrival to its end.
pub struct RequestContext {
    tenant: String,
    route: String,
    arrived: Instant,
    stream: bool,
    usage: Arc<UsageBuffer>,
    metrics: Arc<Metrics>,
    /// The rate limits it was admitted under: token reservations settle at the end.
    admission: Option<Arc<Admission>>,
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
        tenant: &str,
        route: &str,
        arrived: Instant,
        stream: bool,
        usage: Arc<UsageBuffer>,
        metrics: Arc<Metrics>,
    ) -> RequestContext {
        RequestContext {
            tenant: tenant.to_string(),
            route: route.to_string(),
            arrived,
            stream,
            usage,
            metrics,
            admission: None,
        }
    }

    /// The request was admitted under these rate limits.
    pub fn admitted(mut self, admission: Option<Arc<Admission>>) -> RequestContext {
        self.admission = admission;
        self
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn route(&self) -> &str {
        &self.route
    }

    /// The request's one end: usage, metrics and the provenance record.
    pub fn end(self, ending: Ending<'_>) {
        let Ending { halt, target, attempts, excluded, answered, answered_at, upstream, malformed_events } = ending;
        let stream_broken = answered.iter().any(|a| a.stream_broken);
        self.usage.record(&self.tenant, &self.route, attempts, &answered);
        if let Some(admission) = &self.admission {
            // Issue 18: token limits settle to the reported usage of every answer produced.
            admission.settle(answered.iter().map(|a| a.input_tokens + a.output_tokens).sum());
        }
        let until = answered_at.unwrap_or_else(Instant::now);
        self.metrics.routed(Observed {
            tenant: &self.tenant,
            route: &self.route,
            target,
            halt: halt.as_str(),
            attempts,
            added: until.saturating_duration_since(self.arrived).saturating_sub(upstream),
            stream: self.stream,
        });
        if self.stream {
            self.metrics.stream_ended(&self.tenant, &self.route, target.unwrap_or(""), stream_broken, malformed_events);
        }
        // The provenance record, one line per request. Debug level keeps the hot path free of
        // it unless asked for (`RUST_LOG=shield_proxy::context=debug`).
        if tracing::enabled!(tracing::Level::DEBUG) {
            let tokens: Vec<(u64, u64, i64)> =
                answered.iter().map(|a| (a.input_tokens, a.output_tokens, a.cost_micros)).collect();
            tracing::debug!(
                tenant = %self.tenant, route = %self.route, target = target.unwrap_or(""), halt = halt.as_str(),
                stream = self.stream, tokens = ?tokens, malformed_events,
                attempts = %serde_json::to_string(attempts).unwrap_or_default(),
                excluded = %serde_json::to_string(excluded).unwrap_or_default(), "request ended"
            );
        }
    }
}
