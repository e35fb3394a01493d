//! Prometheus metrics of the data plane (`GET /metrics`). Every label value comes from a closed
//! set (halts, failure classes, breaker states) or from the tenant's own ids, which the 100
//! route / 50 target limits bound; `SHIELD_METRICS_TENANT_LABELS=0` drops tenant, route and
//! target labels for very large fleets. No key, credential or prompt is ever a label.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use shield_core::run::Attempt;

/// What [`Metrics::routed`] records of one call.
pub struct Observed<'a> {
    pub tenant: &'a str,
    pub route: &'a str,
    pub target: Option<&'a str>,
    pub halt: &'a str,
    pub attempts: &'a [Attempt],
    /// The time Shield added: from the request's arrival to the answer (or a stream's commit
    /// point), less the time spent upstream.
    pub added: std::time::Duration,
    pub stream: bool,
}

pub struct Metrics {
    registry: Registry,
    tenant_labels: bool,
    requests: IntCounterVec,
    failovers: IntCounterVec,
    upstream_seconds: HistogramVec,
    /// `shield_gateway_added_seconds` for non-streamed and streamed calls: its only two
    /// series, resolved once instead of by label on every call.
    added_seconds: [Histogram; 2],
    circuit_state: IntGaugeVec,
    stream_broken: IntCounterVec,
    malformed_events: IntCounter,
    rate_limited: IntCounterVec,
    snapshot_age: IntGaugeVec,
    pub usage_buffer_dropped: IntCounter,
}

const LATENCY_BUCKETS: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0];

impl Metrics {
    #[allow(
        clippy::expect_used,
        reason = "startup: static metric definitions registered once; a bad one fails every test"
    )]
    pub fn new(tenant_labels: bool) -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()), labels)
                .expect("valid metric");
            registry.register(Box::new(h.clone())).expect("unique metric");
            h
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry.register(Box::new(g.clone())).expect("unique metric");
            g
        };
        let single = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        Metrics {
            requests: counter(
                "shield_requests_total",
                "Routed requests by how the run ended (halt).",
                &["tenant", "route", "target", "halt"],
            ),
            failovers: counter(
                "shield_failovers_total",
                "Failed attempts after which another target was tried, by failure class.",
                &["tenant", "route", "class"],
            ),
            upstream_seconds: histogram(
                "shield_upstream_seconds",
                "Time of each upstream attempt.",
                &["tenant", "target", "outcome"],
            ),
            added_seconds: {
                let added = histogram(
                    "shield_gateway_added_seconds",
                    "Time Shield added to a routed call beyond its upstream attempts.",
                    &["stream"],
                );
                [added.with_label_values(&["false"]), added.with_label_values(&["true"])]
            },
            circuit_state: gauge(
                "shield_circuit_state",
                "This process's breaker: 0 closed, 1 half-open, 2 open.",
                &["tenant", "target"],
            ),
            stream_broken: counter(
                "shield_stream_broken_total",
                "Streams that failed after the commit point.",
                &["tenant", "route", "target"],
            ),
            malformed_events: single("shield_malformed_events_total", "Malformed upstream stream events dropped."),
            rate_limited: counter(
                "shield_rate_limited_total",
                "Requests refused by a rate limit before routing, by whose limit (key, tenant, route) and what ran out.",
                &["tenant", "route", "scope", "kind"],
            ),
            snapshot_age: gauge(
                "shield_config_snapshot_age_seconds",
                "Age of the cached configuration snapshot.",
                &["tenant"],
            ),
            usage_buffer_dropped: single(
                "shield_usage_buffer_dropped_total",
                "Usage rows dropped because the buffer was full.",
            ),
            registry,
            tenant_labels,
        }
    }

    fn id<'a>(&self, value: &'a str) -> &'a str {
        if self.tenant_labels { value } else { "" }
    }

    /// One routed call: its halt, its attempts and the time Shield added.
    pub fn routed(&self, call: Observed<'_>) {
        let Observed { tenant, route, target, halt, attempts, added, stream } = call;
        let (t, r) = (self.id(tenant), self.id(route));
        self.requests.with_label_values(&[t, r, self.id(target.unwrap_or("")), halt]).inc();
        for (i, attempt) in attempts.iter().enumerate() {
            self.upstream_seconds
                .with_label_values(&[t, self.id(&attempt.target), attempt.outcome])
                .observe(attempt.ms as f64 / 1000.0);
            if let (Some(class), true) = (attempt.class, shield_core::run::failed_over(attempts, i)) {
                self.failovers.with_label_values(&[t, r, class.as_str()]).inc();
            }
        }
        if let Some(histogram) = self.added_seconds.get(usize::from(stream)) {
            histogram.observe(added.as_secs_f64());
        }
    }

    pub fn stream_ended(&self, tenant: &str, route: &str, target: &str, broken: bool, malformed: u32) {
        if broken {
            self.stream_broken.with_label_values(&[self.id(tenant), self.id(route), self.id(target)]).inc();
        }
        self.malformed_events.inc_by(u64::from(malformed));
    }

    pub fn rate_limited(&self, tenant: &str, route: &str, scope: &str, kind: &str) {
        self.rate_limited.with_label_values(&[self.id(tenant), self.id(route), scope, kind]).inc();
    }

    pub fn circuit(&self, tenant: &str, target: &str, state: &str) {
        let value = match state {
            "open" => 2,
            "half_open" => 1,
            _ => 0,
        };
        self.circuit_state.with_label_values(&[self.id(tenant), self.id(target)]).set(value);
    }

    pub fn snapshot_age(&self, tenant: &str, seconds: i64) {
        self.snapshot_age.with_label_values(&[self.id(tenant)]).set(seconds.max(0));
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
