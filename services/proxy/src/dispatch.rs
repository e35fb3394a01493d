//! The attempt loop: plan → for each step of the run, build the target's request (credential,
//! hop, body) → call → classify → record. Selection and halting are shield-core's pure
//! functions; this module only performs the calls, each bounded by the target's `timeout_s`
//! and the route's remaining deadline.

use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value};
use shield_core::outcome::Class;
use shield_core::plan::{Excluded, Facts, plan};
use shield_core::route::Route;
use shield_core::run::{Attempt, Halt, Run, Step};
use shield_core::target::{AuthMode, Target};

use crate::body::ChatRequest;
use crate::egress::{Answer, Egress};
use crate::tenant::{TenantConfig, auth_header};

pub const HOP_HEADER: &str = "x-shield-hop";

/// What a routed call came to.
pub struct Routed {
    pub route: String,
    pub attempts: Vec<Attempt>,
    pub excluded: Vec<Excluded>,
    pub halt: Halt,
    pub failovers: usize,
    pub result: RoutedResult,
}

pub enum RoutedResult {
    /// A completion from `target`.
    Answer {
        target: String,
        model: String,
        body: Map<String, Value>,
    },
    /// A class that does not fail over, with the upstream's status and error body.
    Refused {
        target: String,
        status: u16,
        body: Option<Vec<u8>>,
    },
    /// Nothing usable: every attempt failed, none was possible, or the deadline passed.
    Unavailable,
}

pub struct Call<'a> {
    pub tenant: &'a TenantConfig,
    pub route: &'a Route,
    pub request: &'a ChatRequest,
    /// The caller's `X-Shield-Upstream-Key`, for passthrough targets only.
    pub upstream_key: Option<&'a str>,
    /// The hop count to send upstream.
    pub next_hop: u32,
}

pub async fn dispatch(egress: &Egress, call: Call<'_>) -> Routed {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(u64::from(call.route.failover.deadline_s));
    let facts = Facts {
        has_upstream_key: call.upstream_key.is_some(),
        vault_ready: call.tenant.vault_ready.clone(),
    };
    let planned = plan(call.route, &call.tenant.snapshot.targets, &facts);
    let mut run = Run::new(
        planned.order,
        call.route.failover.max_attempts,
        call.route.failover.on.clone(),
    );
    let mut last: Option<(String, String, Answer)> = None;
    let halt = loop {
        let id = match run.step(Instant::now() >= deadline) {
            Step::Try(id) => id,
            Step::Stop(halt) => break halt,
        };
        let Some(target) = call.tenant.target(&id) else {
            break Halt::NoEligibleTarget;
        };
        let attempt_started = Instant::now();
        let remaining = deadline.saturating_duration_since(attempt_started);
        let answer = attempt(egress, &call, target, remaining).await;
        let ms = attempt_started.elapsed().as_millis() as u64;
        let (result, status) = match &answer {
            Answer::Completion { status, .. } => (Ok(()), Some(*status)),
            Answer::Failed { class, status, .. } => (Err(*class), *status),
        };
        run.record(&target.model, result, status, ms);
        last = Some((id, target.model.clone(), answer));
    };
    let result = match (halt, last) {
        (Halt::Succeeded, Some((target, model, Answer::Completion { body, .. }))) => {
            RoutedResult::Answer {
                target,
                model,
                body,
            }
        }
        (
            Halt::IneligibleFailure,
            Some((
                target,
                _,
                Answer::Failed {
                    class: Class::ClientError | Class::ContextLength,
                    status: Some(status),
                    body,
                },
            )),
        ) => RoutedResult::Refused {
            target,
            status,
            body,
        },
        _ => RoutedResult::Unavailable,
    };
    Routed {
        route: call.route.name.clone(),
        failovers: run.failovers(),
        attempts: run.attempts,
        excluded: planned.excluded,
        halt,
        result,
    }
}

async fn attempt(egress: &Egress, call: &Call<'_>, target: &Target, remaining: Duration) -> Answer {
    let failed = |class| Answer::Failed {
        class,
        status: None,
        body: None,
    };
    let Ok(url) = call.tenant.endpoint(&target.id) else {
        return failed(Class::UnsafeUrl);
    };
    let Some(headers) = upstream_headers(call, target) else {
        return failed(Class::CredentialUnavailable);
    };
    let body = call
        .request
        .upstream_body(&target.model, target.extra_body.as_ref());
    let timeout = remaining.min(Duration::from_secs(u64::from(target.timeout_s)));
    egress
        .call(url, target.allow_private, headers, body, timeout)
        .await
}

/// Headers for one target, built from scratch: the hop count and this target's credential.
fn upstream_headers(call: &Call<'_>, target: &Target) -> Option<HeaderMap> {
    let mut headers = HeaderMap::with_capacity(3);
    headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
    headers.insert(
        HeaderName::from_static(HOP_HEADER),
        HeaderValue::from(call.next_hop),
    );
    let credential = match target.auth.mode {
        AuthMode::None => None,
        AuthMode::Vault => Some(call.tenant.vault_credential(&target.id)?.clone()),
        AuthMode::Passthrough => Some(auth_header(
            &target.auth.header,
            &target.auth.scheme,
            call.upstream_key?,
        )?),
    };
    if let Some((name, value)) = credential {
        headers.insert(name, value);
    }
    Some(headers)
}
