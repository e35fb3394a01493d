//! The request path every caller shape shares, in the order it runs: loop check →
//! authenticate → (the shape's module reads the body into a chat request) → rate limits →
//! input guardrails (once, before routing) → resolve the tenant's route (or take the default
//! path) → rules and dispatch with failover → output guardrails and tool RBAC (once, on the
//! typed answer returned) → the [`Outcome`], which the shape's module renders. No shape's
//! wire format is known here: answers and streams are typed ([`shield_core::exchange`]).

use std::time::Instant;

use crate::server::Request;
use crate::server::Response;
use crate::server::ResponseBuilder;
use http::StatusCode;
use http::header::{HeaderMap as InboundHeaders, HeaderName, HeaderValue};
use serde_json::Value;
use shield_core::limits::Limits;
use shield_core::money::Usd;
use shield_core::plan::Exclusion;
use shield_core::plan::Facts;
use shield_core::route::Route;
use shield_core::usage::{TokenUsage, budget_state};
use std::sync::Arc;

use crate::auth::authenticate;
use crate::body::ChatRequest;
use crate::client_wire::ClientWire;
use crate::context::{Ending, RequestContext};
use crate::dispatch::{Call, Committed, HOP_HEADER, Routed, RoutedResult, dispatch, dispatch_stream};
use crate::egress::Egress;
use crate::error::ProxyError;
use crate::guard::{self, GuardrailRecord, StreamGuard};
use crate::limits::Admission;
use crate::observe::Observer;
use crate::resume::Resumer;
use crate::tenant::TenantConfig;
use crate::usage::Paid;
use crate::{ProxyState, default_path};

pub const UPSTREAM_KEY_HEADER: &str = "x-shield-upstream-key";
// Shield's answer headers, as names parsed once rather than per answer.
const ROUTE_HEADER: HeaderName = HeaderName::from_static("x-shield-route");
const TARGET_HEADER: HeaderName = HeaderName::from_static("x-shield-target");
const FAILOVERS_HEADER: HeaderName = HeaderName::from_static("x-shield-failovers");
const BUDGET_HEADER: HeaderName = HeaderName::from_static("x-shield-budget");
/// `warn`: the key's monthly budget is 80 % spent (or spent, with `action: warn`).
const KEY_BUDGET_HEADER: HeaderName = HeaderName::from_static("x-shield-key-budget");
/// `warn`: the tenant's operator cap is 80 % spent (or spent, with `action: warn`).
const TENANT_BUDGET_HEADER: HeaderName = HeaderName::from_static("x-shield-tenant-budget");
/// The caller's fields the answering target had no place for, comma-separated.
const DROPPED_HEADER: HeaderName = HeaderName::from_static("x-shield-dropped-fields");
pub const DATA_CLASS_HEADER: &str = "x-shield-data-class";
// Inbound header names as parsed names: looking a non-standard name up by `&str` parses (and
// allocates) it on every request.
const DATA_CLASS: HeaderName = HeaderName::from_static(DATA_CLASS_HEADER);
const UPSTREAM_KEY: HeaderName = HeaderName::from_static(UPSTREAM_KEY_HEADER);
const HOP: HeaderName = HeaderName::from_static(HOP_HEADER);
/// `lowest_cost`'s guess at an answer's size when the request sets no `max_tokens`.
const DEFAULT_OUTPUT_TOKENS: u64 = 256;

/// What an endpoint lets the shared request path do.
#[derive(Clone, Copy)]
pub struct Ingress {
    /// The endpoint can stream.
    pub stream: bool,
    /// A `model` that names no route goes down the default path, to this path under the
    /// default upstream (OpenAI-shaped endpoints only: the default path relays the body as
    /// sent).
    pub default_path: Option<&'static str>,
}

/// What the shared part of the request path came to.
pub enum Outcome {
    /// Already a response: the default path's relay.
    Relayed(Response),
    /// A stream that reached its commit point, for the endpoint to relay in its own shape.
    Stream(Box<StreamStart>),
    /// The input guardrails refused the request before routing.
    InputBlocked { reason: String, guardrails: Vec<GuardrailRecord> },
    /// A routed, non-streaming call (answered, refused or failed).
    Routed { routed: Box<Routed>, guardrails: Vec<GuardrailRecord> },
}

/// What the shared request path came to, and the rate limits it was admitted under.
pub struct Served {
    pub outcome: Outcome,
    pub admission: Option<Arc<Admission>>,
    pub budgets: BudgetWarnings,
}

/// Which monthly budgets are near or past their limit without refusing (issue 32).
#[derive(Clone, Copy, Default)]
pub struct BudgetWarnings {
    pub key: bool,
    pub tenant: bool,
}

impl Served {
    /// The endpoint's response for the outcome, with the `x-ratelimit-*` headers of the
    /// limits that applied (read now: after a non-streamed request has settled its tokens).
    pub fn render(self, render: impl FnOnce(Outcome) -> Response) -> Response {
        let streaming = matches!(self.outcome, Outcome::Stream(_));
        let mut response = render(self.outcome);
        if let Some(admission) = self.admission {
            crate::limits::apply(&mut response, admission.headers(streaming));
        }
        let warn = HeaderValue::from_static("warn");
        for (name, on) in [(KEY_BUDGET_HEADER, self.budgets.key), (TENANT_BUDGET_HEADER, self.budgets.tenant)] {
            if on {
                response.headers_mut().insert(name, warn.clone());
            }
        }
        response
    }
}

/// Rate-limit admission (issue 18), before routing: the key's, the tenant's and the route's
/// limits, counted from memory. A refusal is counted as `rate_limited` (usage when a route
/// was named, and metrics), never as a call.
async fn admit_limits(
    state: &ProxyState,
    caller: &shield_core::snapshot::ApiKeyRecord,
    tenant: Option<&TenantConfig>,
    route: Option<&Route>,
    request: &ChatRequest,
) -> Result<Option<Arc<Admission>>, ProxyError> {
    let none = Limits::default();
    let tenant_limits = tenant.map_or(&none, |t| &t.snapshot.limits);
    let tokens = (
        (request.prompt_chars() as u64).div_ceil(4),
        request.max_output_tokens().unwrap_or(shield_core::limits::DEFAULT_OUTPUT_TOKENS),
    );
    let key = (caller.key_id.as_str(), caller.name.as_str(), &caller.limits);
    let route_limits = route.map(|r| (r.name.as_str(), &r.limits));
    match state.limiter.admit_waiting(&caller.tenant, key, tenant_limits, route_limits, tokens).await {
        Ok(admission) => Ok(admission.map(Arc::new)),
        Err(limited) => {
            let route = route.map_or("", |r| r.name.as_str());
            state.metrics.rate_limited(&caller.tenant, route, limited.scope.as_str(), limited.kind.as_str());
            if !route.is_empty() {
                state.usage.rate_limited(&caller.tenant, &caller.key_id, route);
            }
            Err(ProxyError::RateLimited(Box::new(limited)))
        }
    }
}

/// The loop check and the caller's key, before the body is read: who may be answered at all.
pub async fn admit(req: &Request, state: &ProxyState) -> Result<Caller, ProxyError> {
    let hop = inbound_hop(req.headers(), state.config.max_hops)?;
    let key = authenticate(req, &state.caches).await?;
    if let Some(trail) = req.trail().cloned() {
        trail.caller(&key);
    }
    Ok(Caller { key, hop, arrived: Instant::now() })
}

/// The caller's tenant's memo, for the tool schemas of a body read directly (one of at least
/// [`shield_core::verbatim::WORTH_IT`] bytes): a schema the tenant sent before and that passed
/// the check a tree reading makes is not walked again ([`shield_core::json_read::CheckedSchemas`]).
pub fn schemas_memo(state: &ProxyState, caller: &Caller, body: &[u8]) -> Option<Arc<shield_core::verdicts::Memo>> {
    (body.len() >= shield_core::verbatim::WORTH_IT).then(|| state.verdicts.of(&caller.key.tenant))
}

/// An authenticated caller.
pub struct Caller {
    pub key: std::sync::Arc<shield_core::snapshot::ApiKeyRecord>,
    pub hop: u32,
    pub arrived: Instant,
}

/// Input guardrails → route → dispatch → output guardrails, on the normalised request.
pub async fn pipeline(
    req: &Request,
    caller: Caller,
    raw: bytes::Bytes,
    request: &ChatRequest,
    state: &ProxyState,
    egress: &Egress,
    ingress: Ingress,
) -> Result<Served, ProxyError> {
    let (started, hop, caller) = (caller.arrived, caller.hop, caller.key);
    let trail = req.trail().cloned();
    if let Some(trail) = &trail {
        trail.route(&request.model, request.stream());
    }
    // Issue 32: the key's allow-list before anything about the tenant's routes is looked at,
    // so a refusal reads the same whether or not the route exists.
    if !caller.may_use(&request.model) {
        return Err(ProxyError::PermissionDenied(request.model.clone()));
    }
    let tenant = state.tenant_config(&caller.tenant).await;
    let tenant_arc = tenant.clone();
    let budgets = check_budgets(state, &caller, tenant.as_deref()).inspect_err(|_| {
        if let Some(trail) = &trail {
            trail.ending("budget_blocked");
        }
    })?;

    let routing = tenant.as_deref().filter(|_| state.config.routing_enabled);
    let resolved = routing.and_then(|t| t.enabled_route(&request.model).map(|r| (t, r)));
    if resolved.is_some() {
        request.check_routable()?;
        if request.stream() && !ingress.stream {
            return Err(ProxyError::BadRequest("this endpoint does not stream; send stream: false".into()));
        }
    } else if ingress.default_path.is_none() {
        return Err(ProxyError::ModelNotFound(request.model.clone()));
    }
    let admission = admit_limits(state, &caller, tenant.as_deref(), resolved.map(|(_, r)| r), request).await?;
    let served = |outcome| Served { outcome, admission: admission.clone(), budgets };

    // Seed §5: input guardrails run once, before routing, whatever path the call takes.
    // Issue 33: what the tenant sent before (an agent's resent history) is read back, not rescanned.
    let input = tenant
        .as_deref()
        .map(|t| {
            let guardrails = &t.snapshot.guardrails;
            let memo = (guardrails.detectors() != 0).then(|| state.verdicts.of(&caller.tenant));
            guardrails.check_request(&request.exchange, memo.as_deref())
        })
        .unwrap_or_default();
    let mut guardrails = guard::results_json("input", &input.results);
    if let Some(name) = input.blocked_by {
        // Refused before any upstream: no tokens were used.
        if let Some(admission) = &admission {
            admission.settle(0);
        }
        if let Some(trail) = &trail {
            trail.ending("guardrail_blocked");
        }
        return Ok(served(Outcome::InputBlocked { reason: guard::blocked_reason("input", name), guardrails }));
    }

    let Some((tenant, route)) = resolved else {
        // The default path relays the body as sent and reads no usage: a token reservation
        // stands as the request's count.
        if let Some(admission) = &admission {
            admission.keep_reservation();
        }
        if let Some(trail) = &trail {
            trail.ending("default_path");
        }
        let path = ingress.default_path.unwrap_or("chat/completions");
        let request_id = Some(req.request_id().clone());
        return Box::pin(default_path::forward(state, egress, &request.model, path, raw, hop + 1, request_id))
            .await
            .map(|response| served(Outcome::Relayed(response)));
    };
    let facts = Facts {
        flagged: input.flagged.iter().map(|f| f.to_string()).collect(),
        data_class: req.headers().get(DATA_CLASS).and_then(|v| v.to_str().ok()).map(|v| v.trim().to_string()),
        agent: caller.agent.clone(),
        role: caller.role.clone(),
        prompt_tokens: (request.prompt_chars() as u64).div_ceil(4),
        expected_output_tokens: request.max_output_tokens().unwrap_or(DEFAULT_OUTPUT_TOKENS),
        max_tokens: request.max_output_tokens(),
        uses_tools: request.uses_tools(),
        requires_flavor: (!request.requires_anthropic().is_empty()).then_some(shield_core::target::Flavor::Anthropic),
        // Seed §3.3: the flushed month total plus this process's unflushed spend, the unflushed
        // read first (see `check_budgets`).
        budget: budget_state(route.budget.as_ref(), {
            let unflushed = state.usage.unflushed_spend(&tenant.snapshot.tenant, &route.name);
            Usd(unflushed + state.caches.month_spend(&tenant.snapshot.tenant, &route.name))
        }),
        ..Facts::default()
    };
    let upstream_key = req.headers().get(UPSTREAM_KEY).and_then(|v| v.to_str().ok()).filter(|k| !k.is_empty());
    let request_id = Some(req.request_id().clone());
    let parent = trail.as_ref().and_then(|t| t.span());
    let observer = Observer { parent, metrics: &state.metrics, tenant: &caller.tenant, route: &route.name };
    let call = Call {
        tenant,
        route,
        request,
        upstream_key,
        next_hop: hop + 1,
        request_id: request_id.as_ref(),
        facts,
        observer,
    };
    let mut context = RequestContext::new(
        caller.clone(),
        &route.name,
        started,
        request.stream(),
        state.usage.clone(),
        state.metrics.clone(),
    )
    .admitted(admission.clone())
    .with_trail(trail.clone());

    if request.stream() {
        // Boxed, as the default path below: the streaming and default paths' futures are large,
        // and inline they would enlarge every request's future (issue 19).
        return Ok(served(match Box::pin(dispatch_stream(egress, &state.health, call)).await {
            Ok(committed) => {
                context.decided(committed.rule.as_ref(), committed.budget.as_str());
                let output = StreamGuard::new(tenant.snapshot.guardrails.clone(), caller.role.clone());
                let health = state.health.clone();
                let prompt_chars = request.prompt_chars();
                // Only routes that resume streams keep what a resume needs.
                let resumer = tenant_arc.filter(|_| !route.stream_resume.is_off()).map(|tenant| Resumer {
                    mode: route.stream_resume,
                    egress: egress.clone(),
                    tenant,
                    request: request.clone(),
                    upstream_key: upstream_key.map(str::to_string),
                    request_id: request_id.clone(),
                    next_hop: hop + 1,
                    deadline: started + std::time::Duration::from_secs(u64::from(route.failover.deadline_s)),
                    order: committed.run.order().to_vec(),
                    parent: parent.cloned(),
                    metrics: state.metrics.clone(),
                    route: route.name.clone(),
                });
                let start = StreamStart { committed, health, context, output, prompt_chars, resumer };
                Outcome::Stream(Box::new(start))
            }
            Err(routed) => {
                context.decided(routed.rule.as_ref(), routed.budget.as_str());
                context.end(Ending::of(routed.halt, &routed.attempts, &routed.excluded, routed.upstream));
                if let Some(err) = unservable(&routed, request) {
                    settle_nothing(admission.as_deref());
                    return Err(err);
                }
                Outcome::Routed { routed: Box::new(routed), guardrails }
            }
        }));
    }
    let mut routed = dispatch(egress, &state.health, call).await;
    context.decided(routed.rule.as_ref(), routed.budget.as_str());
    if let Some(err) = unservable(&routed, request) {
        context.end(Ending::of(routed.halt, &routed.attempts, &routed.excluded, routed.upstream));
        settle_nothing(admission.as_deref());
        return Err(err);
    }
    let paid = paid(tenant, request, &routed);
    routed.cost_micros = paid.as_ref().map(|p| p.cost_micros);
    // Seed §5: output guardrails and tool RBAC once, on the answer actually returned.
    if let RoutedResult::Answer { target, body, .. } = &routed.result {
        let (verdict, allowed) = guard::check_answer_parts(
            &tenant.snapshot.guardrails,
            caller.role.as_deref(),
            &body.answer.text(),
            &body.answer.tool_names(),
        );
        guardrails.extend(guard::results_json("output", &verdict.results));
        if let Err(reason) = allowed {
            routed.result = RoutedResult::Refusal { reason, target: Some(target.clone()) };
            if let Some(trail) = &trail {
                trail.ending("guardrail_blocked");
            }
        }
    }
    let target = match &routed.result {
        RoutedResult::Answer { target, .. } | RoutedResult::Refused { target, .. } => Some(target.as_str()),
        RoutedResult::Refusal { target, .. } => target.as_deref(),
        RoutedResult::Unavailable => None,
    };
    context.end(Ending {
        target,
        answered: paid.as_ref().map(|paid| paid.answered(false)).into_iter().collect(),
        ..Ending::of(routed.halt, &routed.attempts, &routed.excluded, routed.upstream)
    });
    Ok(served(Outcome::Routed { routed: Box::new(routed), guardrails }))
}

/// The key's monthly budget and the operator's cap on its tenant (issue 32), from memory: the
/// month's spend as last flushed by every process plus this process's unflushed spend. A
/// spent `block` budget refuses the call before any upstream; `warn` (and 80 % of `block`)
/// only marks the answer.
fn check_budgets(
    state: &ProxyState,
    caller: &shield_core::snapshot::ApiKeyRecord,
    tenant: Option<&TenantConfig>,
) -> Result<BudgetWarnings, ProxyError> {
    use shield_core::key_access::Standing;
    let tenant_cap = tenant.and_then(|t| t.snapshot.budget);
    if caller.budget.is_none() && tenant_cap.is_none() {
        return Ok(BudgetWarnings::default());
    }
    // The unflushed spend first: a flush releases what it took only after the cached totals
    // hold it, so a check racing it counts that spend twice (for a moment) rather than not at
    // all, which would let a call pass a spent budget.
    let unflushed = state.usage.unflushed_key_and_tenant(&caller.tenant, &caller.key_id);
    let flushed = state.caches.key_and_tenant_spend(&caller.tenant, &caller.key_id);
    let (key_spend, tenant_spend) = (flushed.0 + unflushed.0, flushed.1 + unflushed.1);
    let mut warnings = BudgetWarnings::default();
    for (scope, budget, spent) in [("tenant", tenant_cap, tenant_spend), ("key", caller.budget, key_spend)] {
        let Some(budget) = budget else { continue };
        match budget.standing(spent) {
            Standing::Within => {}
            Standing::Warn if scope == "key" => warnings.key = true,
            Standing::Warn => warnings.tenant = true,
            Standing::Blocked => {
                let retry_after_s = crate::calendar::seconds_to_month_end(crate::calendar::unix_now());
                let exceeded = crate::error::BudgetExceeded { scope, monthly: budget.monthly, retry_after_s };
                return Err(ProxyError::BudgetExceeded(exceeded));
            }
        }
    }
    Ok(warnings)
}

/// A request no target of the route can serve: it carries what only `anthropic` targets read
/// (a document, say) and the route has none eligible for it. The caller's to change, so a 400
/// (never a 5xx a client would retry), naming what needs such a target.
fn unservable(routed: &Routed, request: &ChatRequest) -> Option<ProxyError> {
    let needs = request.requires_anthropic();
    let only_unsupported = routed.attempts.is_empty()
        && !routed.excluded.is_empty()
        && routed.excluded.iter().all(|e| e.reason == Exclusion::UnsupportedField);
    (!needs.is_empty() && only_unsupported && matches!(routed.result, RoutedResult::Unavailable)).then(|| {
        ProxyError::BadRequest(format!(
            "route `{}` has no target that can read {}: only `anthropic` targets can",
            routed.route,
            needs.join(", ")
        ))
    })
}

/// A call refused before any upstream used no tokens.
fn settle_nothing(admission: Option<&Admission>) {
    if let Some(admission) = admission {
        admission.settle(0);
    }
}

/// What a non-streaming answer cost: the tokens the upstream reported (estimated at 4
/// characters a token when it reported none) times the answering target's price. Counted
/// whatever Shield then does with the answer: a blocked answer was still produced, and paid
/// for.
fn paid(config: &TenantConfig, request: &ChatRequest, routed: &Routed) -> Option<Paid> {
    let RoutedResult::Answer { target, body, usage, .. } = &routed.result else { return None };
    let (usage, estimated) = match usage {
        Some(usage) => (*usage, false),
        None => {
            let input = (request.prompt_chars() as u64).div_ceil(4);
            let output = (body.answer.text().len() as u64).div_ceil(4);
            (TokenUsage { input, output, ..TokenUsage::default() }, true)
        }
    };
    let price = config.target(target).and_then(|t| t.price.as_ref());
    Some(Paid::new(target, usage, price, estimated))
}

/// A stream past its commit point, before its response is written.
pub struct StreamStart {
    committed: Committed,
    health: std::sync::Arc<crate::health::Health>,
    context: RequestContext,
    output: StreamGuard,
    prompt_chars: usize,
    resumer: Option<Resumer>,
}

impl StreamStart {
    /// The committed stream's response: routing headers on the head, then the relayed events
    /// in `wire`'s shape.
    pub fn respond(self, wire: Box<dyn ClientWire>) -> Response {
        let StreamStart { committed, health, context, output, prompt_chars, resumer } = self;
        let failovers = committed.run.attempts.iter().filter(|a| a.outcome == "failed").count();
        let mut response = Response::ok();
        response
            .insert_header(("content-type", "text/event-stream"))
            .insert_header(("cache-control", "no-cache"))
            .insert_header(("x-accel-buffering", "no"))
            .insert_header((ROUTE_HEADER, committed.route.as_str()))
            .insert_header((TARGET_HEADER, committed.target.as_str()))
            .insert_header((FAILOVERS_HEADER, small_number(failovers)))
            .insert_header((BUDGET_HEADER, committed.budget.as_str()));
        if let Some(dropped) = dropped_value(&committed.dropped) {
            response.insert_header((DROPPED_HEADER, dropped));
        }
        response.streaming(crate::relay::relay(committed, health, context, output, wire, prompt_chars, resumer))
    }
}

/// A header value of a count: the usual small ones without allocating.
pub fn small_number(n: usize) -> HeaderValue {
    const SMALL: [HeaderValue; 4] = [
        HeaderValue::from_static("0"),
        HeaderValue::from_static("1"),
        HeaderValue::from_static("2"),
        HeaderValue::from_static("3"),
    ];
    SMALL.get(n).cloned().unwrap_or_else(|| HeaderValue::from(n))
}

/// `X-Shield-Hop` of the inbound request; at `SHIELD_MAX_HOPS` or more the call is refused.
pub fn inbound_hop(headers: &InboundHeaders, max_hops: u32) -> Result<u32, ProxyError> {
    let Some(value) = headers.get(HOP) else {
        return Ok(0);
    };
    let hop: u32 = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| ProxyError::BadRequest("X-Shield-Hop must be a non-negative integer".into()))?;
    if hop >= max_hops { Err(ProxyError::LoopDetected(hop)) } else { Ok(hop) }
}

pub fn with_routing_headers(mut response: ResponseBuilder, routed: &Routed, target: Option<&str>) -> ResponseBuilder {
    response.insert_header((ROUTE_HEADER, routed.route.as_str()));
    if let Some(target) = target {
        response.insert_header((TARGET_HEADER, target));
    }
    response.insert_header((FAILOVERS_HEADER, small_number(routed.failovers)));
    response.insert_header((BUDGET_HEADER, HeaderValue::from_static(routed.budget.as_str())));
    if let Some(dropped) = dropped_value(&routed.dropped) {
        response.insert_header((DROPPED_HEADER, dropped));
    }
    response
}

/// `X-Shield-Dropped-Fields`, when the answering target dropped anything.
fn dropped_value(dropped: &[String]) -> Option<HeaderValue> {
    (!dropped.is_empty()).then(|| HeaderValue::from_str(&dropped.join(", ")).ok()).flatten()
}

pub(crate) fn unavailable_message(routed: &Routed) -> (StatusCode, String) {
    let route = &routed.route;
    let tried = routed
        .attempts
        .iter()
        .map(|a| match (a.class, a.status) {
            (Some(class), Some(status)) => format!("{} ({} {status})", a.target, class.as_str()),
            (Some(class), None) => format!("{} ({})", a.target, class.as_str()),
            _ => a.target.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let excluded =
        routed.excluded.iter().map(|e| format!("{} ({})", e.target, e.reason.as_str())).collect::<Vec<_>>().join(", ");
    use shield_core::run::Halt;
    match routed.halt {
        Halt::Deadline => {
            (StatusCode::GATEWAY_TIMEOUT, format!("route `{route}` reached its deadline; tried: {tried}"))
        }
        Halt::NoEligibleTarget => {
            (StatusCode::BAD_GATEWAY, format!("no target of route `{route}` is eligible: {excluded}"))
        }
        Halt::AttemptBound => {
            (StatusCode::BAD_GATEWAY, format!("route `{route}` used all its attempts; tried: {tried}"))
        }
        _ => (StatusCode::BAD_GATEWAY, format!("every eligible target of route `{route}` failed: {tried}")),
    }
}

/// What an upstream said when it refused a request (a 4xx that does not fail over), read
/// from the error object both OpenAI's and Anthropic's dialects use (`{"error": {…}}`). A
/// 401/403 is the target's credential problem: its text is not relayed (providers echo parts
/// of keys there).
pub struct UpstreamRefusal {
    /// Names the target and the status, then what the upstream said.
    pub message: String,
    pub kind: Option<String>,
    pub param: Value,
    pub code: Value,
}

pub fn upstream_refusal(target: &str, status: StatusCode, body: Option<&[u8]>) -> UpstreamRefusal {
    let upstream: Value = body.and_then(|b| serde_json::from_slice(b).ok()).unwrap_or(Value::Null);
    let upstream = upstream.get("error").cloned().unwrap_or(upstream);
    let field = |key: &str| upstream.get(key).filter(|v| !v.is_null()).cloned();
    let code = status.as_u16();
    let message = if matches!(code, 401 | 403) {
        format!("target `{target}` refused the request ({code}): check the target's credential")
    } else {
        let said = field("message").and_then(|m| m.as_str().map(|s| s.chars().take(500).collect::<String>()));
        match said {
            Some(said) => format!("target `{target}` answered {code}: {said}"),
            None => format!("target `{target}` answered {code}"),
        }
    };
    UpstreamRefusal {
        message,
        kind: field("type").and_then(|t| t.as_str().map(str::to_string)),
        param: field("param").unwrap_or(Value::Null),
        code: field("code").unwrap_or(Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_limits() {
        let mut headers = InboundHeaders::new();
        assert_eq!(inbound_hop(&headers, 3).unwrap(), 0);
        headers.insert(HOP, HeaderValue::from_static("2"));
        assert_eq!(inbound_hop(&headers, 3).unwrap(), 2);
        headers.insert(HOP, HeaderValue::from_static("3"));
        assert!(matches!(inbound_hop(&headers, 3), Err(ProxyError::LoopDetected(3))));
        headers.insert(HOP, HeaderValue::from_static("x"));
        assert!(matches!(inbound_hop(&headers, 3), Err(ProxyError::BadRequest(_))));
    }
}
