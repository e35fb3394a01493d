//! Prometheus metrics of the data plane (`GET /metrics`). Every label value comes from a closed
//! set (halts, failure classes, breaker states) or from the tenant's own ids, which the 100
//! route / 50 target limits bound; `SHIELD_METRICS_TENANT_LABELS=0` drops tenant, route and
//! target labels for very large fleets. No key, credential or prompt is ever a label. A metric
//! with a label a tenant names is a [`family::Family`], whose series are told apart by their
//! whole label values (prometheus's own vectors are not: see there).

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};
use std::sync::{Arc, OnceLock};

use shield_core::run::Attempt;

mod family;
use family::{Registered, Series};

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
    requests: Registered<IntCounter, 4>,
    failovers: Registered<IntCounter, 3>,
    upstream_seconds: Registered<Histogram, 3>,
    /// `shield_gateway_added_seconds` for non-streamed and streamed calls: its only two
    /// series, resolved once instead of by label on every call.
    added_seconds: [Histogram; 2],
    circuit_state: Registered<IntGauge, 2>,
    stream_broken: Registered<IntCounter, 3>,
    malformed_events: IntCounter,
    rate_limited: Registered<IntCounter, 4>,
    snapshot_age: Registered<IntGauge, 1>,
    pub usage_buffer_dropped: IntCounter,
    /// Every request by how it ended (issue 31), written by [`crate::context::Trail`].
    http_requests: Registered<IntCounter, 4>,
    /// GenAI client metrics (semantic conventions v1.41), per upstream attempt.
    gen_ai_tokens: Registered<Histogram, 7>,
    gen_ai_duration: Registered<Histogram, 7>,
    gen_ai_first_chunk: Registered<Histogram, 6>,
    /// Spans dropped by the trace exporter, by why; spans exported.
    trace_dropped: IntCounterVec,
    trace_exported: IntCounter,
    trace_counts: parking_lot::Mutex<()>,
    guardrail_units: IntCounterVec,
    /// The GenAI series of each label set met, resolved once (see [`GenAiSeries`]).
    gen_ai_series: family::ByLabels<Arc<GenAiSeries>, 5>,
}

/// The GenAI series of one upstream (tenant, route, target, provider, model), resolved when an
/// attempt starts and kept for the next: `with_label_values` hashes every label byte by byte
/// and takes the vector's lock on each call, three times per answered attempt, and an attempt
/// held its five labels as owned strings until its end (issue 33: ~2 % of a small request's
/// instructions). The set of label values is the one Prometheus keeps a series for anyway. Each
/// series is resolved when first observed, as `with_label_values` made it, so `/metrics` shows
/// the same series as before (no first-chunk series for an upstream that never streamed).
pub struct GenAiSeries {
    /// The label values as written (tenant, route and target empty when tenant labels are off).
    labels: [Box<str>; 5],
    /// The duration of an attempt that answered (`error.type` empty). Each `None` only if its
    /// series could not be made ([`family::Family::series`]; its names are checked at start).
    answered: OnceLock<Option<Histogram>>,
    first_chunk: OnceLock<Option<Histogram>>,
    /// Input and output tokens.
    tokens: OnceLock<Option<(Histogram, Histogram)>>,
}

impl GenAiSeries {
    /// The labels of the vectors' six common ones: tenant, route, target, the operation,
    /// provider and model.
    fn common(&self) -> [&str; 6] {
        let [tenant, route, target, provider, model] = &self.labels;
        [tenant, route, target, "chat", provider, model]
    }
}

/// `gen_ai.client.token.usage` buckets: powers of 4 from 1 to 4^13 (the conventions').
const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
    67108864.0,
];
/// `gen_ai.client.operation.duration` buckets: 0.01 s doubling to 81.92 s (the conventions').
const GEN_AI_SECONDS: [f64; 14] =
    [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];

const GEN_AI_LABELS: [&str; 6] =
    ["tenant", "route", "target", "gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"];
const GEN_AI_DURATION_LABELS: [&str; 7] = [
    "tenant",
    "route",
    "target",
    "gen_ai_operation_name",
    "gen_ai_provider_name",
    "gen_ai_request_model",
    "error_type",
];
const GEN_AI_TOKEN_LABELS: [&str; 7] = [
    "tenant",
    "route",
    "target",
    "gen_ai_operation_name",
    "gen_ai_provider_name",
    "gen_ai_request_model",
    "gen_ai_token_type",
];

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
        let histogram_of = |name: &str, help: &str, buckets: &[f64], labels: &[&str]| {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)
                .expect("valid metric");
            registry.register(Box::new(h.clone())).expect("unique metric");
            h
        };
        let histogram = |name: &str, help: &str, labels: &[&str]| histogram_of(name, help, &LATENCY_BUCKETS, labels);
        // A label a tenant names (tenant, route, target, model): a family of its own (see
        // [`family`]); the vectors above keep closed sets only.
        fn family<M: Series, const N: usize>(
            registry: &Registry,
            opts: M::Opts,
            labels: [&'static str; N],
        ) -> Registered<M, N> {
            family::Family::new(opts, labels).and_then(|f| Registered::new(f, registry)).expect("valid, unique metric")
        }
        let named = |name: &str, help: &str| Opts::new(name, help);
        let timed = |name: &str, help: &str, buckets: &[f64]| HistogramOpts::new(name, help).buckets(buckets.to_vec());
        let single = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        Metrics {
            requests: family(
                &registry,
                named("shield_requests_total", "Routed requests by how the run ended (halt)."),
                ["tenant", "route", "target", "halt"],
            ),
            failovers: family(
                &registry,
                named(
                    "shield_failovers_total",
                    "Failed attempts after which another target was tried, by failure class.",
                ),
                ["tenant", "route", "class"],
            ),
            upstream_seconds: family(
                &registry,
                timed("shield_upstream_seconds", "Time of each upstream attempt.", &LATENCY_BUCKETS),
                ["tenant", "target", "outcome"],
            ),
            added_seconds: {
                let added = histogram(
                    "shield_gateway_added_seconds",
                    "Time Shield added to a routed call beyond its upstream attempts.",
                    &["stream"],
                );
                [added.with_label_values(&["false"]), added.with_label_values(&["true"])]
            },
            circuit_state: family(
                &registry,
                named("shield_circuit_state", "This process's breaker: 0 closed, 1 half-open, 2 open."),
                ["tenant", "target"],
            ),
            stream_broken: family(
                &registry,
                named("shield_stream_broken_total", "Streams that failed after the commit point."),
                ["tenant", "route", "target"],
            ),
            malformed_events: single("shield_malformed_events_total", "Malformed upstream stream events dropped."),
            rate_limited: family(
                &registry,
                named(
                    "shield_rate_limited_total",
                    "Requests refused by a rate limit before routing, by whose limit (key, tenant, route) and what ran out.",
                ),
                ["tenant", "route", "scope", "kind"],
            ),
            snapshot_age: family(
                &registry,
                named("shield_config_snapshot_age_seconds", "Age of the cached configuration snapshot."),
                ["tenant"],
            ),
            usage_buffer_dropped: single(
                "shield_usage_buffer_dropped_total",
                "Usage rows dropped because the buffer was full.",
            ),
            http_requests: family(
                &registry,
                named(
                    "shield_http_requests_total",
                    "Every request to the proxy by how it ended (ending), its endpoint pattern and status.",
                ),
                ["tenant", "endpoint", "status", "ending"],
            ),
            gen_ai_tokens: family(
                &registry,
                timed(
                    "gen_ai_client_token_usage",
                    "Tokens per upstream attempt, by type (GenAI semantic conventions v1.41).",
                    &TOKEN_BUCKETS,
                ),
                GEN_AI_TOKEN_LABELS,
            ),
            gen_ai_duration: family(
                &registry,
                timed(
                    "gen_ai_client_operation_duration_seconds",
                    "Duration of each upstream attempt, streams to their end (GenAI semantic conventions v1.41).",
                    &GEN_AI_SECONDS,
                ),
                GEN_AI_DURATION_LABELS,
            ),
            gen_ai_first_chunk: family(
                &registry,
                timed(
                    "gen_ai_client_operation_time_to_first_chunk_seconds",
                    "Time to the first chunk of a streamed upstream attempt (GenAI semantic conventions v1.41).",
                    &GEN_AI_SECONDS,
                ),
                GEN_AI_LABELS,
            ),
            trace_dropped: counter(
                "shield_trace_spans_dropped_total",
                "Spans dropped instead of exported: the queue was full, or the collector refused, failed or timed out.",
                &["reason"],
            ),
            trace_exported: single("shield_trace_spans_exported_total", "Spans the trace collector accepted."),
            trace_counts: parking_lot::Mutex::new(()),
            guardrail_units: counter(
                "shield_guardrail_units_total",
                "Input guardrail units (system parts and messages): scanned, or reused from the tenant's memo of texts judged before.",
                &["result"],
            ),
            gen_ai_series: family::ByLabels::default(),
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
        self.requests.with([t, r, self.id(target.unwrap_or("")), halt], IntCounter::inc);
        for (i, attempt) in attempts.iter().enumerate() {
            let seconds = attempt.ms as f64 / 1000.0;
            self.upstream_seconds.with([t, self.id(&attempt.target), attempt.outcome], |h| h.observe(seconds));
            if let (Some(class), true) = (attempt.class, shield_core::run::failed_over(attempts, i)) {
                self.failovers.with([t, r, class.as_str()], IntCounter::inc);
            }
        }
        if let Some(histogram) = self.added_seconds.get(usize::from(stream)) {
            histogram.observe(added.as_secs_f64());
        }
    }

    pub fn stream_ended(&self, tenant: &str, route: &str, target: &str, broken: bool, malformed: u32) {
        if broken {
            self.stream_broken.with([self.id(tenant), self.id(route), self.id(target)], IntCounter::inc);
        }
        self.malformed_events.inc_by(u64::from(malformed));
    }

    pub fn rate_limited(&self, tenant: &str, route: &str, scope: &str, kind: &str) {
        self.rate_limited.with([self.id(tenant), self.id(route), scope, kind], IntCounter::inc);
    }

    pub fn circuit(&self, tenant: &str, target: &str, state: &str) {
        let value = match state {
            "open" => 2,
            "half_open" => 1,
            _ => 0,
        };
        self.circuit_state.with([self.id(tenant), self.id(target)], |gauge| gauge.set(value));
    }

    pub fn snapshot_age(&self, tenant: &str, seconds: i64) {
        self.snapshot_age.with([self.id(tenant)], |gauge| gauge.set(seconds.max(0)));
    }

    /// One request's end: its endpoint pattern, status and how it ended.
    pub fn http_request(&self, tenant: &str, endpoint: &str, status: u16, ending: &str) {
        let mut digits = itoa::Buffer::new();
        self.http_requests.with([self.id(tenant), endpoint, digits.format(status), ending], IntCounter::inc);
    }

    /// The GenAI series of an upstream attempt (`labels`: tenant, route, target, provider,
    /// model), found by the labels' hash, or resolved and kept the first time they are met.
    pub fn gen_ai_series(&self, labels: [&str; 5]) -> Arc<GenAiSeries> {
        let [tenant, route, target, provider, model] = labels;
        let labels = [self.id(tenant), self.id(route), self.id(target), provider, model];
        let fresh = || {
            Arc::new(GenAiSeries {
                labels: labels.map(Box::from),
                answered: OnceLock::new(),
                first_chunk: OnceLock::new(),
                tokens: OnceLock::new(),
            })
        };
        self.gen_ai_series.with(labels, || Some(fresh()), Arc::clone).unwrap_or_else(fresh)
    }

    /// One upstream attempt of `series`: its duration, time to first chunk (streams), error
    /// type (failures) and tokens (answers).
    pub fn gen_ai_attempt(
        &self,
        series: &GenAiSeries,
        seconds: f64,
        first_chunk: Option<f64>,
        error: Option<&str>,
        usage: Option<&shield_core::usage::TokenUsage>,
    ) {
        let common = series.common();
        let [a, b, c, d, e, f] = common;
        match error {
            None => {
                let answered = series.answered.get_or_init(|| self.gen_ai_duration.series([a, b, c, d, e, f, ""]));
                answered.iter().for_each(|histogram| histogram.observe(seconds));
            }
            Some(error) => self.gen_ai_duration.with([a, b, c, d, e, f, error], |h| h.observe(seconds)),
        }
        if let Some(first) = first_chunk {
            let first_chunk = series.first_chunk.get_or_init(|| self.gen_ai_first_chunk.series(common));
            first_chunk.iter().for_each(|histogram| histogram.observe(first));
        }
        if let Some(usage) = usage {
            let tokens = series.tokens.get_or_init(|| {
                let [input, output] =
                    ["input", "output"].map(|kind| self.gen_ai_tokens.series([a, b, c, d, e, f, kind]));
                input.zip(output)
            });
            if let Some((input, output)) = tokens {
                input.observe(usage.input as f64);
                output.observe(usage.output as f64);
            }
        }
    }

    /// The trace exporter's counts, brought up to date (at scrape time).
    pub fn trace_counts(&self) {
        let _one_at_a_time = self.trace_counts.lock();
        let ((full, failed), exported) = (shield_telemetry::dropped_spans(), shield_telemetry::exported_spans());
        for (reason, now) in [("queue_full", full), ("export_failed", failed)] {
            let counter = self.trace_dropped.with_label_values(&[reason]);
            counter.inc_by(now.saturating_sub(counter.get()));
        }
        self.trace_exported.inc_by(exported.saturating_sub(self.trace_exported.get()));
    }

    /// The input guardrails' memo counts, brought up to date (at scrape time).
    pub fn guardrail_counts(&self, counts: &shield_core::verdicts::Counts) {
        let _one_at_a_time = self.trace_counts.lock();
        for (result, now) in [("reused", &counts.reused), ("scanned", &counts.scanned)] {
            let counter = self.guardrail_units.with_label_values(&[result]);
            counter.inc_by(now.load(std::sync::atomic::Ordering::Relaxed).saturating_sub(counter.get()));
        }
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use shield_core::usage::TokenUsage;

    use super::*;

    fn count(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> u64 {
        let families = metrics.registry.gather();
        let Some(family) = families.iter().find(|f| f.name() == name) else { return 0 };
        family
            .get_metric()
            .iter()
            .filter(|m| labels.iter().all(|(k, v)| m.get_label().iter().any(|l| l.name() == *k && l.value() == *v)))
            .map(|m| m.get_histogram().get_sample_count())
            .sum()
    }

    #[test]
    fn an_attempts_series_are_its_labels_and_resolved_once() {
        let metrics = Metrics::new(true);
        let a = metrics.gen_ai_series(["t1", "r", "g", "openai", "m"]);
        let again = metrics.gen_ai_series(["t1", "r", "g", "openai", "m"]);
        assert!(Arc::ptr_eq(&a, &again), "the same labels find the series kept");
        let other = metrics.gen_ai_series(["t2", "r", "g", "openai", "m"]);
        assert!(!Arc::ptr_eq(&a, &other));
        let usage = TokenUsage { input: 7, output: 3, ..Default::default() };
        metrics.gen_ai_attempt(&a, 0.5, Some(0.1), None, Some(&usage));
        metrics.gen_ai_attempt(&again, 0.5, None, Some("timeout"), None);
        metrics.gen_ai_attempt(&other, 0.5, None, None, None);
        let duration = "gen_ai_client_operation_duration_seconds";
        let t1 = [("tenant", "t1"), ("gen_ai_provider_name", "openai"), ("gen_ai_request_model", "m")];
        assert_eq!(count(&metrics, duration, &[t1[0], ("error_type", "")]), 1);
        assert_eq!(count(&metrics, duration, &[t1[0], ("error_type", "timeout")]), 1);
        assert_eq!(count(&metrics, duration, &[("tenant", "t2")]), 1);
        assert_eq!(count(&metrics, "gen_ai_client_operation_time_to_first_chunk_seconds", &t1), 1);
        let tokens = "gen_ai_client_token_usage";
        assert_eq!(count(&metrics, tokens, &[t1[0], ("gen_ai_token_type", "input")]), 1);
        assert_eq!(count(&metrics, tokens, &[t1[0], ("gen_ai_token_type", "output")]), 1);
    }

    /// A routed call's counter, its attempts' histogram and its HTTP end land in the series of
    /// their labels: labels that differ anywhere, or only in where one ends and the next begins
    /// (tenant `tr` with route `` against tenant `t` with route `r`, which prometheus's own
    /// vectors took for one series), are other series; none shows before it is recorded on.
    #[test]
    fn series_are_their_whole_labels() {
        let metrics = Metrics::new(true);
        let counter = |name: &str, labels: &[(&str, &str)]| {
            let families = metrics.registry.gather();
            let family = families.iter().find(|f| f.name() == name);
            let matching = |m: &&prometheus::proto::Metric| {
                labels.iter().all(|(k, v)| m.get_label().iter().any(|l| l.name() == *k && l.value() == *v))
            };
            family.map_or(0.0, |f| f.get_metric().iter().filter(matching).map(|m| m.get_counter().value()).sum())
        };
        let attempts = [Attempt {
            n: 1,
            target: "g1".into(),
            model: "m".into(),
            outcome: "ok",
            class: None,
            status: Some(200),
            ms: 5,
            committed: false,
            retry: false,
            resumed: false,
        }];
        let call = |tenant, route, halt| Observed {
            tenant,
            route,
            target: Some("g1"),
            halt,
            attempts: &attempts,
            added: std::time::Duration::ZERO,
            stream: false,
        };
        for _ in 0..3 {
            metrics.routed(call("t", "r", "answered"));
        }
        metrics.routed(call("t", "r2", "answered"));
        metrics.routed(call("tr", "", "answered"));
        let requests = "shield_requests_total";
        assert_eq!(counter(requests, &[("tenant", "t"), ("route", "r"), ("halt", "answered")]), 3.0);
        assert_eq!(counter(requests, &[("tenant", "t"), ("route", "r2")]), 1.0);
        assert_eq!(counter(requests, &[("tenant", "tr"), ("route", "")]), 1.0);
        let upstream = "shield_upstream_seconds";
        assert_eq!(count(&metrics, upstream, &[("tenant", "t"), ("target", "g1"), ("outcome", "ok")]), 4);
        assert_eq!(count(&metrics, upstream, &[("tenant", "tr")]), 1);
        assert_eq!(counter(requests, &[("halt", "exhausted")]), 0.0, "not shown before it is recorded on");
        metrics.http_request("t", "/v1/chat/completions", 200, "complete");
        metrics.http_request("t", "/v1/chat/completions", 200, "complete");
        metrics.http_request("t", "/v1/chat/completions", 429, "refused");
        let http = "shield_http_requests_total";
        assert_eq!(counter(http, &[("status", "200"), ("ending", "complete")]), 2.0);
        assert_eq!(counter(http, &[("status", "429"), ("ending", "refused")]), 1.0);
        metrics.circuit("ab", "c", "open");
        metrics.circuit("a", "bc", "half_open");
        let a = metrics.gen_ai_series(["ab", "c", "g", "openai", "m"]);
        let b = metrics.gen_ai_series(["a", "bc", "g", "openai", "m"]);
        metrics.gen_ai_attempt(&a, 0.5, None, None, None);
        metrics.gen_ai_attempt(&b, 0.5, None, Some("timeout"), None);
        metrics.gen_ai_attempt(&b, 0.5, None, Some("timeout"), None);
        let duration = "gen_ai_client_operation_duration_seconds";
        assert_eq!(count(&metrics, duration, &[("tenant", "ab"), ("route", "c")]), 1);
        assert_eq!(count(&metrics, duration, &[("tenant", "a"), ("route", "bc"), ("error_type", "timeout")]), 2);
        // The text as the vectors wrote it: labels by name, one line per series.
        let text = metrics.render();
        for line in [
            "# TYPE shield_requests_total counter",
            r#"shield_requests_total{halt="answered",route="r",target="g1",tenant="t"} 3"#,
            r#"shield_requests_total{halt="answered",route="",target="g1",tenant="tr"} 1"#,
            "# TYPE shield_circuit_state gauge",
            r#"shield_circuit_state{target="c",tenant="ab"} 2"#,
            r#"shield_circuit_state{target="bc",tenant="a"} 1"#,
            "# TYPE shield_upstream_seconds histogram",
            r#"shield_upstream_seconds_bucket{outcome="ok",target="g1",tenant="t",le="0.005"} 4"#,
            r#"shield_upstream_seconds_count{outcome="ok",target="g1",tenant="t"} 4"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    /// `/metrics` shows the series it showed when each was resolved on its first observation.
    #[test]
    fn a_series_shows_once_observed() {
        let metrics = Metrics::new(true);
        let failing = metrics.gen_ai_series(["t1", "r", "g", "openai", "m"]);
        metrics.gen_ai_attempt(&failing, 0.5, None, Some("connect"), None);
        let series = |name: &str| {
            let families = metrics.registry.gather();
            families.iter().find(|f| f.name() == name).map_or(0, |f| f.get_metric().len())
        };
        assert_eq!(series("gen_ai_client_operation_duration_seconds"), 1, "the failure's series only");
        assert_eq!(series("gen_ai_client_operation_time_to_first_chunk_seconds"), 0, "never streamed");
        assert_eq!(series("gen_ai_client_token_usage"), 0, "never answered");
        let usage = TokenUsage { input: 1, output: 1, ..Default::default() };
        metrics.gen_ai_attempt(&failing, 0.5, None, None, Some(&usage));
        assert_eq!(series("gen_ai_client_operation_duration_seconds"), 2);
        assert_eq!(series("gen_ai_client_token_usage"), 2);
        assert_eq!(series("gen_ai_client_operation_time_to_first_chunk_seconds"), 0);
    }

    #[test]
    fn without_tenant_labels_every_tenant_shares_one_series() {
        let metrics = Metrics::new(false);
        let (a, b) = (
            metrics.gen_ai_series(["t1", "r1", "g", "openai", "m"]),
            metrics.gen_ai_series(["t2", "r2", "h", "openai", "m"]),
        );
        assert!(Arc::ptr_eq(&a, &b));
        metrics.gen_ai_attempt(&a, 0.5, None, Some("connect"), None);
        let duration = "gen_ai_client_operation_duration_seconds";
        assert_eq!(count(&metrics, duration, &[("tenant", ""), ("error_type", "connect")]), 1);
    }
}
