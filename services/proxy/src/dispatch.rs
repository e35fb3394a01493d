//! The attempt loop: plan → for each step of the run, ask the target's breaker → build the
//! target's request (credential, hop, body) → call → classify → record. Selection and halting
//! are shield-core's pure functions; this module performs the calls, each bounded by the
//! target's timeout and the route's remaining deadline, and keeps this process's health view.
//!
//! One loop serves both shapes of call: a non-streaming attempt succeeds with a completion; a
//! streaming attempt succeeds when its first usable event arrives (the commit point), after
//! which [`crate::relay`] owns the stream and records how it ended.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{ACCEPT, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use shield_core::breaker::Permit;
use shield_core::outcome::Class;
use shield_core::plan::{Excluded, Exclusion, Facts, plan};
use shield_core::route::Route;
use shield_core::run::{Attempt, Halt, Run, Step};
use shield_core::target::{AuthMode, Target};
use shield_core::usage::{BudgetState, TokenUsage};

use crate::body::ChatRequest;
use crate::egress::{CallUrl, Egress, Failure, Opened};
use crate::health::Health;
use crate::observe::{Answered, AttemptTrace, Observer};
use crate::provider::{self, Completion, Credential, Provider};
use crate::tenant::TenantConfig;

pub const HOP_HEADER: &str = "x-shield-hop";
/// [`HOP_HEADER`] as a name parsed once (a custom name's `from_static` is not free at run time).
pub const HOP: HeaderName = HeaderName::from_static(HOP_HEADER);

/// What a routed call came to (before any stream is relayed).
pub struct Routed {
    pub route: String,
    /// The rule that decided: `{index, description}`.
    pub rule: Option<Value>,
    pub attempts: Vec<Attempt>,
    pub excluded: Vec<Excluded>,
    pub halt: Halt,
    pub failovers: usize,
    pub result: RoutedResult,
    /// What the answer cost (micro-USD), once known.
    pub cost_micros: Option<i64>,
    /// The route's budget state for this call.
    pub budget: BudgetState,
    /// Time spent in upstream attempts, exactly (each attempt's `ms` is truncated): what
    /// the gateway-added metric subtracts.
    pub upstream: Duration,
    /// The caller's fields the answering target's adapter had no place for
    /// (`X-Shield-Dropped-Fields`).
    pub dropped: Vec<String>,
}

pub enum RoutedResult {
    /// A completion from `target`, normalised by its provider adapter, with the usage the
    /// provider reported.
    Answer { target: String, model: String, body: Completion, usage: Option<TokenUsage> },
    /// A class that does not fail over, with the upstream's status and error body.
    Refused { target: String, status: u16, body: Option<Vec<u8>> },
    /// Nothing usable: every attempt failed, none was possible, or the deadline passed.
    Unavailable,
    /// A `deny` rule refused the call (nothing was tried), or Shield refused the answer
    /// (output guardrail, tool RBAC): a refusal in the endpoint's shape.
    Refusal { reason: String, target: Option<String> },
}

pub struct Call<'a> {
    pub tenant: &'a TenantConfig,
    pub route: &'a Route,
    pub request: &'a ChatRequest,
    /// The caller's `X-Shield-Upstream-Key`, for passthrough targets only.
    pub upstream_key: Option<&'a str>,
    /// The hop count to send upstream.
    pub next_hop: u32,
    /// The request's id (`X-Request-Id`), forwarded to every upstream attempt.
    pub request_id: Option<&'a HeaderValue>,
    /// What rules read: flagged guardrails, data class, agent, role, prompt size.
    pub facts: Facts,
    /// Where each attempt's span and GenAI metrics go.
    pub observer: Observer<'a>,
}

/// The loop's result: the run so far and, when an attempt succeeded, its product.
struct Loop<T> {
    rule: Option<usize>,
    refused: Option<(Halt, String)>,
    run: Run,
    excluded: Vec<Excluded>,
    success: Option<Success<T>>,
    last_failure: Option<(String, Failure)>,
    /// Time spent in the attempts that failed.
    failed_upstream: Duration,
}

struct Success<T> {
    target: String,
    model: String,
    value: T,
    permit: Permit,
    /// The attempt's span and metrics, finished by whoever knows its outcome.
    trace: AttemptTrace,
    started: Instant,
    /// How long the attempt took (to its answer, or a stream's first event).
    elapsed: Duration,
}

async fn attempts<'t, T, F, Fut>(
    call: &Call<'t>,
    health: &Health,
    rng: &mut impl rand::Rng,
    stream: bool,
    mut attempt: F,
) -> Loop<T>
where
    F: FnMut(&'t Target, Duration, Option<opentelemetry::Context>) -> Fut,
    Fut: Future<Output = Result<(u16, T), Failure>>,
{
    let tenant = call.tenant.snapshot.tenant.as_str();
    let deadline = Instant::now() + Duration::from_secs(u64::from(call.route.failover.deadline_s));
    let view = health.view(tenant, &call.route.targets);
    let facts = Facts {
        has_upstream_key: call.upstream_key.is_some(),
        vault_ready: call.tenant.vault_ready.clone(),
        circuit_open: view.circuit_open,
        exhausted: view.exhausted,
        latency_ms: view.latency_ms,
        ..call.facts.clone()
    };
    let planned = plan(call.route, &call.tenant.snapshot.targets, &facts, rng);
    let (rule, refused) = (planned.rule, planned.refused);
    let mut excluded = planned.excluded;
    let failover = &call.route.failover;
    let mut run =
        Run::new(planned.order, failover.max_attempts, failover.on.clone()).with_retry(failover.retry.clone());
    let mut last_failure = None;
    let mut failed_upstream = Duration::ZERO;
    // The declared window of a target that overflowed: later attempts need a larger one.
    let mut context_floor: Option<u32> = None;
    // When each target last failed: a deferred retry waits out what is left of its backoff.
    let mut failed_at: Vec<(String, Instant)> = Vec::new();
    while let Step::Try(id) = run.step(Instant::now() >= deadline) {
        let Some(target) = call.tenant.target(&id) else { continue };
        if let Some(wait) = run.take_deferred_wait() {
            let since = failed_at.iter().rev().find(|(t, _)| *t == id).map(|(_, at)| at.elapsed()).unwrap_or_default();
            let wait = Duration::from_millis(wait).saturating_sub(since);
            if Instant::now() + wait >= deadline {
                continue;
            }
            tokio::time::sleep(wait).await;
        }
        let window = target.capabilities.as_ref().and_then(|c| c.context_window);
        if context_floor.zip(window).is_some_and(|(floor, w)| w <= floor) {
            excluded.push(Excluded { target: id, reason: Exclusion::ContextWindow });
            continue;
        }
        let permit = health.acquire(tenant, &id);
        if permit == Permit::Refused {
            // Another request holds the half-open probe, or the circuit opened meanwhile.
            excluded.push(Excluded { target: id, reason: Exclusion::CircuitOpen });
            continue;
        }
        let n = run.attempts.len() as u32 + 1;
        let retry = run.attempts.last().is_some_and(|a| a.target == id);
        let endpoint = call.tenant.endpoint(&id).ok().map(|e| &e.url);
        let trace = AttemptTrace::start(call.observer, target, n, retry, stream, call.request, endpoint);
        let started = Instant::now();
        let mut held = crate::health::HeldPermit::new(health, tenant, &id, permit);
        let result = attempt(target, deadline.saturating_duration_since(started), trace.context().cloned()).await;
        let permit = held.take();
        drop(held);
        let elapsed = started.elapsed();
        let ms = elapsed.as_millis() as u64;
        match result {
            Ok((status, value)) => {
                run.record(&target.model, Ok(()), Some(status), ms);
                let success =
                    Success { target: id, model: target.model.clone(), value, permit, trace, started, elapsed };
                return Loop { rule, refused, run, excluded, success: Some(success), last_failure, failed_upstream };
            }
            Err(failure) => {
                trace.failed(failure.class, failure.status, false);
                failed_upstream += elapsed;
                failed_at.push((id.clone(), Instant::now()));
                health.record(tenant, &id, &target.breaker(), permit, Err(failure.class), ms);
                run.record(&target.model, Err(failure.class), failure.status, ms);
                // `failover.retry`: the same target again after its short reset hint or a
                // jittered backoff, within the deadline; the run's next step is that target.
                let remaining = deadline.saturating_duration_since(Instant::now()).as_millis() as u64;
                let jitter = rng.random_range(0.5..1.5);
                if let Some(wait) = run.retry_after(failure.class, failure.reset_hint_ms, jitter, remaining) {
                    tracing::debug!(tenant, target = %id, wait_ms = wait, class = failure.class.as_str(), "retrying");
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    last_failure = Some((id, failure));
                    continue;
                }
                // Seed 002: proven exhaustion (or a rate limit that says when it resets) parks
                // the target instead of letting every request hammer it.
                if failure.class.parks(failure.reset_hint_ms.is_some()) {
                    health.park(tenant, &id, failure.reset_hint_ms);
                }
                if failure.class == Class::ContextLength {
                    // Only a larger declared window can help (ROUTING.md `context_length`).
                    context_floor = target.capabilities.as_ref().and_then(|c| c.context_window).or(context_floor);
                }
                last_failure = Some((id, failure));
            }
        }
    }
    Loop { rule, refused, run, excluded, success: None, last_failure, failed_upstream }
}

/// A non-streaming routed call.
pub async fn dispatch(egress: &Egress, health: &Health, call: Call<'_>) -> Routed {
    let mut rng = rand::rng();
    let shared = &call;
    let outcome = attempts(&call, health, &mut rng, false, |target, remaining, trace| {
        let timeout = remaining.min(Duration::from_secs(u64::from(target.timeout_s)));
        async move {
            let (provider, url, headers, body) = prepare(shared, egress, target, false, trace.as_ref()).await?;
            egress.call(provider, &url, target.allow_private, headers, body, timeout).await
        }
    })
    .await;
    let tenant = call.tenant.snapshot.tenant.as_str();
    let mut upstream = outcome.failed_upstream;
    let result = match outcome.success {
        Some(success) => {
            let settings = call.tenant.target(&success.target).map(Target::breaker).unwrap_or_default();
            upstream += success.elapsed;
            let ms = success.elapsed.as_millis() as u64;
            health.record(tenant, &success.target, &settings, success.permit, Ok(()), ms);
            let answer = success.value;
            success.trace.answered(Answered {
                model: &success.model,
                id: &answer.body.answer.id,
                stop: answer.body.answer.stop,
                usage: answer.usage,
                text: Some(&answer.body.answer.visible_text()),
            });
            RoutedResult::Answer {
                target: success.target,
                model: success.model,
                body: answer.body,
                usage: answer.usage,
            }
        }
        None => return unsuccessful(&call, outcome),
    };
    let mut run = outcome.run;
    let halt = halt_of(&mut run);
    let mut routed = routed(&call, outcome.rule, run, outcome.excluded, halt, result, upstream);
    if let RoutedResult::Answer { target, .. } = &routed.result {
        routed.dropped = dropped_by(&call, target);
    }
    routed
}

/// What the adapter of the answering target dropped of the caller's request.
fn dropped_by(call: &Call<'_>, target: &str) -> Vec<String> {
    call.tenant
        .target(target)
        .map(|target| provider::for_target(target).dropped(call.request, target))
        .unwrap_or_default()
}

/// The routing record of a call that produced nothing usable: a denial, a refused request,
/// or every attempt failed.
fn unsuccessful<T>(call: &Call<'_>, outcome: Loop<T>) -> Routed {
    let mut run = outcome.run;
    let (halt, result) = match outcome.refused {
        Some((halt, reason)) => (halt, RoutedResult::Refusal { reason, target: None }),
        None => {
            let result = refused_or_unavailable(&run, outcome.last_failure);
            (halt_of(&mut run), result)
        }
    };
    routed(call, outcome.rule, run, outcome.excluded, halt, result, outcome.failed_upstream)
}

/// The routing record of a finished run.
fn routed(
    call: &Call<'_>,
    rule: Option<usize>,
    run: Run,
    excluded: Vec<Excluded>,
    halt: Halt,
    result: RoutedResult,
    upstream: Duration,
) -> Routed {
    Routed {
        route: call.route.name.clone(),
        rule: rule_record(call, rule),
        failovers: run.failovers(),
        attempts: run.attempts,
        excluded,
        halt,
        result,
        cost_micros: None,
        budget: call.facts.budget,
        upstream,
        dropped: Vec::new(),
    }
}

fn rule_record(call: &Call<'_>, index: Option<usize>) -> Option<Value> {
    let index = index?;
    Some(serde_json::json!({"index": index, "description": call.route.rules.get(index)?.describe()}))
}

/// A streamed call that reached its commit point: the relay takes it from here.
pub struct Committed {
    pub rule: Option<Value>,
    pub budget: BudgetState,
    /// The answering target's price, for the stream's cost.
    pub price: Option<shield_core::target::Price>,
    pub route: String,
    pub tenant: String,
    pub target: String,
    pub model: String,
    pub opened: Opened,
    pub permit: Permit,
    /// The committed attempt's span and metrics: the stream's end finishes it.
    pub trace: Option<AttemptTrace>,
    /// The answering target's breaker settings, for the stream's outcome.
    pub breaker: shield_core::breaker::BreakerSettings,
    /// When the committed attempt started, and when its first usable event arrived (the
    /// commit point).
    pub started: Instant,
    pub committed_at: Instant,
    /// Time spent in the attempts that failed before this one.
    pub failed_upstream: Duration,
    pub run: Run,
    pub excluded: Vec<Excluded>,
    pub idle_timeout: Duration,
    /// The caller's fields the answering target's adapter had no place for.
    pub dropped: Vec<String>,
}

/// A streaming routed call up to the commit point: `Ok` once a target's first usable event
/// arrived, `Err` (answered like a non-streaming failure) when none did.
pub async fn dispatch_stream(egress: &Egress, health: &Health, call: Call<'_>) -> Result<Committed, Routed> {
    let mut rng = rand::rng();
    let shared = &call;
    let outcome = attempts(&call, health, &mut rng, true, |target, remaining, trace| {
        // A model that thinks (or reads documents) first may be silent longer than a first
        // byte normally takes: such requests wait up to the whole call's timeout.
        let first_byte_s = if call.request.reasons() { target.timeout_s } else { target.first_byte_timeout_s() };
        let first_byte = remaining.min(Duration::from_secs(u64::from(first_byte_s)));
        async move {
            let (provider, url, headers, body) = prepare(shared, egress, target, true, trace.as_ref()).await?;
            egress
                .open_stream(provider, &url, target.allow_private, headers, body, first_byte)
                .await
                .map(|opened| (opened.status, opened))
        }
    })
    .await;
    match outcome.success {
        Some(mut success) => {
            success.trace.first_chunk();
            let idle_timeout = call.tenant.target(&success.target).map(|t| t.idle_timeout_s).unwrap_or(15);
            let breaker = call.tenant.target(&success.target).map(Target::breaker).unwrap_or_default();
            Ok(Committed {
                dropped: dropped_by(&call, &success.target),
                rule: rule_record(&call, outcome.rule),
                budget: call.facts.budget,
                price: call.tenant.target(&success.target).and_then(|t| t.price.clone()),
                route: call.route.name.clone(),
                tenant: call.tenant.snapshot.tenant.clone(),
                target: success.target,
                model: success.model,
                opened: success.value,
                permit: success.permit,
                trace: Some(success.trace),
                breaker,
                started: success.started,
                committed_at: Instant::now(),
                failed_upstream: outcome.failed_upstream,
                run: outcome.run,
                excluded: outcome.excluded,
                idle_timeout: Duration::from_secs(u64::from(idle_timeout)),
            })
        }
        None => Err(unsuccessful(&call, outcome)),
    }
}

fn halt_of(run: &mut Run) -> Halt {
    match run.step(false) {
        Step::Stop(halt) => halt,
        Step::Try(_) => Halt::Exhausted,
    }
}

fn refused_or_unavailable(run: &Run, last_failure: Option<(String, Failure)>) -> RoutedResult {
    if run.halt() != Some(Halt::IneligibleFailure) {
        return RoutedResult::Unavailable;
    }
    match last_failure {
        Some((
            target,
            Failure {
                class: Class::ClientError | Class::ContextLength,
                status: Some(status),
                body,
                reset_hint_ms: None,
            },
        )) => RoutedResult::Refused { target, status, body },
        // Seed 002 / issue 27: spent credit on a route that does not opt in to `402` reaches
        // the caller as the payment error it is (402; Anthropic's "credit balance too low"
        // comes as a 400 and is the same fact), never as a 502 an SDK would retry.
        Some((target, Failure { class: Class::CreditExhausted, body, .. })) => {
            RoutedResult::Refused { target, status: 402, body }
        }
        _ => RoutedResult::Unavailable,
    }
}

/// `X-Shield-Hop`'s value: the usual small counts without allocating one per attempt.
pub fn hop_value(hop: u32) -> HeaderValue {
    match hop {
        1 => HeaderValue::from_static("1"),
        2 => HeaderValue::from_static("2"),
        3 => HeaderValue::from_static("3"),
        n => HeaderValue::from(n),
    }
}

/// The target's provider adapter and the URL, headers and body of one attempt at it. Headers
/// are built from scratch: the hop count, the adapter's own, and this target's credential,
/// applied last by the adapter (it sees the final body).
async fn prepare(
    call: &Call<'_>,
    egress: &Egress,
    target: &Target,
    stream: bool,
    trace: Option<&opentelemetry::Context>,
) -> Result<Prepared, Failure> {
    let sent = Sent { upstream_key: call.upstream_key, next_hop: call.next_hop, request_id: call.request_id, trace };
    prepare_for(call.tenant, egress, call.request, sent, target, stream).await
}

/// A target's adapter, and the URL, headers and body of one attempt at it.
pub type Prepared = (&'static dyn Provider, Arc<CallUrl>, HeaderMap, shield_core::spliced::Spliced);

/// [`prepare`] from its parts (a resumed stream re-issues the request after the call's end).
/// What an upstream request carries of the caller's besides the body: the passthrough key, the
/// hop count, the request id.
#[derive(Clone, Copy)]
pub struct Sent<'a> {
    pub upstream_key: Option<&'a str>,
    pub next_hop: u32,
    pub request_id: Option<&'a HeaderValue>,
    /// The attempt's span, sent as `traceparent` (tracing on).
    pub trace: Option<&'a opentelemetry::Context>,
}

/// The request id header, sent upstream so a provider's logs and Shield's name one request.
pub const REQUEST_ID: http::header::HeaderName = http::header::HeaderName::from_static("x-request-id");

pub async fn prepare_for(
    tenant: &TenantConfig,
    egress: &Egress,
    request: &ChatRequest,
    sent: Sent<'_>,
    target: &Target,
    stream: bool,
) -> Result<Prepared, Failure> {
    let Sent { upstream_key, next_hop, request_id, trace } = sent;
    let provider = provider::for_target(target);
    let endpoint = tenant.endpoint(&target.id).map_err(|_| Failure::of(Class::UnsafeUrl))?;
    let url = match provider.call_url(&endpoint.url, stream) {
        std::borrow::Cow::Borrowed(_) => Arc::clone(endpoint),
        std::borrow::Cow::Owned(url) => Arc::new(CallUrl::new(url)),
    };
    let body = provider.body(request, target, stream);
    let mut headers = HeaderMap::with_capacity(4);
    let accept = if stream { "text/event-stream" } else { "application/json" };
    headers.insert(ACCEPT, HeaderValue::from_static(accept));
    headers.insert(HOP, hop_value(next_hop));
    if let Some(id) = request_id {
        headers.insert(REQUEST_ID, id.clone());
    }
    if let Some(trace) = trace {
        shield_telemetry::inject(trace, &mut headers);
    }
    provider.headers(target, request, &mut headers);
    let passthrough;
    let credential = match target.auth.mode {
        AuthMode::None => None,
        AuthMode::Vault => tenant.vault_credential(&target.id),
        AuthMode::Passthrough => {
            passthrough = upstream_key.and_then(|key| Credential::for_target(target, key));
            passthrough.as_ref()
        }
    };
    match (target.auth.mode, credential) {
        (AuthMode::None, _) => {}
        (_, Some(credential)) => {
            // A service account's token is fetched or refreshed here (once for all callers).
            let credential = credential.current(egress, target.allow_private).await?;
            provider.authenticate(&credential, &url, &body, &mut headers);
        }
        (_, None) => return Err(Failure::of(Class::CredentialUnavailable)),
    }
    Ok((provider, url, headers, body))
}
