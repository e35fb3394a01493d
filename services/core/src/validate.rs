//! Validation of targets and routes: every field of seed §3.1/§3.2 plus ROUTING.md's
//! additions. Each problem names its field as a JSON path and says why. Decoding (unknown
//! fields, wrong types, values outside a closed set) is [`crate::parse::from_json`]'s job; this
//! module checks what types cannot express.

use std::collections::{BTreeMap, BTreeSet};

use crate::FieldError;
use crate::error::Problems;
use crate::guardrails::GUARDRAIL_NAMES;
use crate::names;
use crate::profile::{PROFILE_KEYS, Requirement};
use crate::route::{AtLimit, Route, Strategy};
use crate::target::{AuthMode, Flavor, SECRET_REF_SCHEME, Target, defaults};
use crate::url_safety;

/// The vault as validation sees it: secret name → the hosts it is bound to.
pub type SecretBindings = BTreeMap<String, Vec<String>>;

const MAX_TIMEOUT_S: u32 = 600;
const MAX_TEXT: usize = 200;
const MAX_RULES: usize = 50;
const MAX_ATTEMPTS: u32 = 10;
const MAX_EXTRA_BODY_BYTES: usize = 16 * 1024;
/// Body fields `extra_body` may not set: Shield owns them.
const RESERVED_BODY_FIELDS: [&str; 4] = ["model", "messages", "stream", "x_shield"];
/// Header names a credential may not be sent in: they frame the request itself.
const RESERVED_HEADERS: [&str; 6] =
    ["host", "content-length", "transfer-encoding", "connection", "content-type", "x-shield-hop"];

/// Checks a target about to be stored under `id`. `secrets` is the tenant's vault.
pub fn validate_target(id: &str, target: &mut Target, secrets: &SecretBindings) -> Result<(), Vec<FieldError>> {
    let mut p = Problems::default();
    if let Err(why) = names::check_target_id(id) {
        p.push("id", why);
    }
    if target.id.is_empty() {
        target.id = id.to_string();
    } else if target.id != id {
        p.push("id", format!("{:?} does not match the id in the path ({id:?})", target.id));
    }
    if target.name.is_empty() {
        target.name = id.to_string();
    }
    text_field(&mut p, "name", &target.name);
    text_field(&mut p, "model", &target.model);

    let host = match url_safety::parse_outbound_url(&target.base_url) {
        Ok(url) => {
            if let Some(why) = url_safety::url_private_reason(&url).filter(|_| !target.allow_private) {
                p.push("base_url", format!("host is {why}; set allow_private: true (needs registry:write) to use it"));
            }
            url_safety::binding_host(&url)
        }
        Err(why) => {
            p.push("base_url", why);
            None
        }
    };

    match (target.flavor, &target.azure) {
        (Flavor::Azure, Some(azure)) => {
            if azure.deployment.trim().is_empty() {
                p.push("azure.deployment", "is required for flavor azure");
            }
            if azure.api_version.trim().is_empty() {
                p.push("azure.api_version", "is required for flavor azure");
            }
        }
        (Flavor::Azure, None) => p.push("azure", "is required for flavor azure ({deployment, api_version})"),
        (_, Some(azure)) if !azure.deployment.is_empty() || !azure.api_version.is_empty() => {
            p.push("azure", "is only for flavor azure");
        }
        _ => {}
    }
    // Gemini's model is one segment of the URL path (`…/models/{model}:generateContent`).
    if target.flavor == Flavor::Gemini && target.model.contains(['/', '?', '#', ':']) {
        p.push("model", "must be a Gemini model id such as gemini-2.5-flash (no `/`, `?`, `#` or `:`)");
    }
    if target.flavor == Flavor::Vertex && (target.model.is_empty() || target.model.contains(['/', '?', '#', ':'])) {
        p.push("model", "must be the publisher's model id such as gemini-2.5-flash or claude-sonnet-4@20250514 (no `/`, `?`, `#` or `:`)");
    }
    if target.flavor == Flavor::Bedrock {
        if target.model.trim().is_empty() || target.model.len() > 2048 {
            p.push("model", "must be a Bedrock model id, inference profile or ARN (1 to 2048 characters)");
        }
        match target.bedrock.as_ref().and_then(|b| b.region.as_deref()) {
            Some(region) if !is_region(region) => p.push("bedrock.region", "must be an AWS region such as us-east-1"),
            Some(_) => {}
            None if target.bedrock_region().is_none() => p.push(
                "bedrock.region",
                "is required when the base_url's host does not name the region (bedrock-runtime.{region}.amazonaws.com)",
            ),
            None => {}
        }
    } else if target.bedrock.is_some() {
        p.push("bedrock", "is only for flavor bedrock");
    }
    if target.flavor != Flavor::Vertex && target.vertex.is_some() {
        p.push("vertex", "is only for flavor vertex");
    }
    match (target.flavor, &target.anthropic) {
        (Flavor::Anthropic, Some(options)) => {
            if options.version.is_empty() || !names::is_header_token(&options.version) {
                p.push("anthropic.version", "must be an API version such as 2023-06-01");
            }
        }
        (Flavor::Anthropic, None) => target.anthropic = Some(Default::default()),
        (_, Some(_)) => p.push("anthropic", "is only for flavor anthropic"),
        (_, None) => {}
    }
    // The credential's header follows the flavor unless the user named one; stored, so a read
    // shows where the key goes.
    let (header, scheme) = target.flavor.default_auth();
    target.auth.header.get_or_insert_with(|| header.to_string());
    target.auth.scheme.get_or_insert_with(|| scheme.to_string());

    check_auth(&mut p, target, host.as_deref(), secrets);

    // A default bounded by another field follows it; only values the user wrote are compared
    // (issue 14). `idle_timeout_s` bounds the gaps of a stream after its first event, which
    // `timeout_s` does not cover, so neither bounds the other.
    let first_byte_written = target.first_byte_timeout_s.is_some();
    let first_byte = *target.first_byte_timeout_s.get_or_insert(defaults::first_byte_timeout_s(target.timeout_s));
    for (field, value) in [
        ("timeout_s", target.timeout_s),
        ("first_byte_timeout_s", first_byte),
        ("idle_timeout_s", target.idle_timeout_s),
    ] {
        if !(1..=MAX_TIMEOUT_S).contains(&value) {
            p.push(field, format!("must be between 1 and {MAX_TIMEOUT_S} seconds"));
        }
    }
    if first_byte_written && first_byte > target.timeout_s {
        p.push("first_byte_timeout_s", "must not exceed timeout_s");
    }
    if let Some(breaker) = &target.breaker {
        for (field, value, max) in [
            ("breaker.failures", breaker.failures, 100),
            ("breaker.window_s", breaker.window_s, 3600),
            ("breaker.open_s", breaker.open_s, 3600),
            ("breaker.probe_interval_s", breaker.probe_interval_s, 3600),
        ] {
            if !(1..=max).contains(&value) {
                p.push(field, format!("must be between 1 and {max}"));
            }
        }
    }

    if let Some(price) = &target.price {
        if price.currency != "USD" {
            p.push("price.currency", "only USD is supported");
        }
        for (field, amount) in [
            ("price.input_per_mtok", Some(price.input_per_mtok)),
            ("price.output_per_mtok", Some(price.output_per_mtok)),
            ("price.cache_read_per_mtok", price.cache_read_per_mtok),
            ("price.cache_write_per_mtok", price.cache_write_per_mtok),
        ] {
            if amount.is_some_and(|a| a.micros() < 0) {
                p.push(field, "must not be negative");
            }
        }
    }
    if let Some(caps) = &target.capabilities {
        for (field, value) in [
            ("capabilities.context_window", caps.context_window),
            ("capabilities.max_output_tokens", caps.max_output_tokens),
        ] {
            if value == Some(0) {
                p.push(field, "must be positive (omit it when unknown)");
            }
        }
    }
    if let Some(profile) = &target.profile {
        for (key, value) in [
            ("region", &profile.region),
            ("retention_class", &profile.retention_class),
            ("moderation_profile", &profile.moderation_profile),
            ("tool_profile", &profile.tool_profile),
            ("log_profile", &profile.log_profile),
        ] {
            if let Some(value) = value
                && (value.trim().is_empty() || value.len() > 64)
            {
                p.push(format!("profile.{key}"), "must be 1-64 characters");
            }
        }
    }
    if let Some(extra) = &target.extra_body {
        for key in RESERVED_BODY_FIELDS {
            if extra.contains_key(key) {
                p.push(format!("extra_body.{key}"), "is set by Shield and may not be overridden");
            }
        }
        if serde_json::to_vec(extra).map(|v| v.len()).unwrap_or(usize::MAX) > MAX_EXTRA_BODY_BYTES {
            p.push("extra_body", format!("must be at most {MAX_EXTRA_BODY_BYTES} bytes of JSON"));
        }
    }
    p.into_result()
}

/// An AWS region name: lowercase letters, digits and dashes (`us-east-1`, `eu-central-2`).
fn is_region(region: &str) -> bool {
    (2..=32).contains(&region.len())
        && region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn check_auth(p: &mut Problems, target: &Target, host: Option<&str>, secrets: &SecretBindings) {
    let auth = &target.auth;
    let (header, scheme) = auth.header_and_scheme(target.flavor);
    if !names::is_header_token(header) {
        p.push("auth.header", format!("{header:?} is not a valid header name"));
    } else if RESERVED_HEADERS.contains(&header.to_ascii_lowercase().as_str()) {
        p.push("auth.header", format!("{header:?} cannot carry a credential"));
    }
    if !scheme.is_empty() && !names::is_header_token(scheme) {
        p.push(
            "auth.scheme",
            format!("{scheme:?} is not a valid auth scheme (a single token such as Bearer, or empty)"),
        );
    }
    match auth.mode {
        AuthMode::Vault => {
            let Some(reference) = &auth.secret_ref else {
                p.push("auth.secret_ref", format!("is required for mode vault ({SECRET_REF_SCHEME}<secret name>)"));
                return;
            };
            let Some(name) = auth.secret_name() else {
                p.push("auth.secret_ref", format!("{reference:?} must look like {SECRET_REF_SCHEME}<secret name>"));
                return;
            };
            match secrets.get(name) {
                None => p.push(
                    "auth.secret_ref",
                    format!("secret {name:?} does not exist; create it with PUT /v1/tenant/me/secrets/{name}"),
                ),
                Some(bindings) => {
                    if let Some(host) = host
                        && !bindings.iter().any(|b| b.eq_ignore_ascii_case(host))
                    {
                        let bound = bindings.join(", ");
                        p.push(
                            "auth.secret_ref",
                            format!("secret {name:?} is not bound to host {host:?} (bound to: {bound})"),
                        );
                    }
                }
            }
        }
        AuthMode::Passthrough | AuthMode::None => {
            if auth.secret_ref.is_some() {
                p.push("auth.secret_ref", "is only for mode vault");
            }
        }
    }
}

fn text_field(p: &mut Problems, field: &str, value: &str) {
    if value.trim().is_empty() {
        p.push(field, "is required");
    } else if value.len() > MAX_TEXT {
        p.push(field, format!("must be at most {MAX_TEXT} characters"));
    } else if value.chars().any(char::is_control) {
        p.push(field, "must not contain control characters");
    }
}

/// Checks a route about to be stored under `name` against the tenant's targets.
pub fn validate_route(
    name: &str,
    route: &mut Route,
    targets: &BTreeMap<String, Target>,
) -> Result<(), Vec<FieldError>> {
    let mut p = Problems::default();
    if let Err(why) = names::check_route_name(name) {
        p.push("name", why);
    }
    if route.name.is_empty() {
        route.name = name.to_string();
    } else if route.name != name {
        p.push("name", format!("{:?} does not match the name in the path ({name:?})", route.name));
    }

    if route.targets.is_empty() {
        p.push("targets", "must list at least one target");
    }
    if route.targets.len() > crate::MAX_TARGETS_PER_TENANT {
        p.push("targets", format!("must list at most {} targets", crate::MAX_TARGETS_PER_TENANT));
    }
    let mut seen = BTreeSet::new();
    for (i, id) in route.targets.iter().enumerate() {
        if !seen.insert(id.as_str()) {
            p.push(format!("targets[{i}]"), format!("{id:?} is listed twice"));
        } else if !targets.contains_key(id) {
            p.push(format!("targets[{i}]"), format!("target {id:?} does not exist"));
        }
    }
    let listed: BTreeSet<&str> = route.targets.iter().map(String::as_str).collect();

    match (&route.weights, route.strategy) {
        (Some(_), strategy) if strategy != Strategy::Weighted => p.push("weights", "are only for strategy weighted"),
        (None, Strategy::Weighted) => p.push("weights", "are required for strategy weighted"),
        (Some(weights), _) => {
            for (id, weight) in weights {
                if !listed.contains(id.as_str()) {
                    p.push(format!("weights.{id}"), "is not one of the route's targets");
                }
                if *weight > 10_000 {
                    p.push(format!("weights.{id}"), "must be at most 10000");
                }
            }
            if weights.values().all(|w| *w == 0) {
                p.push("weights", "at least one weight must be positive");
            }
        }
        (None, _) => {}
    }

    let failover = &route.failover;
    if !(1..=MAX_ATTEMPTS).contains(&failover.max_attempts) {
        p.push("failover.max_attempts", format!("must be between 1 and {MAX_ATTEMPTS}"));
    }
    if !(1..=MAX_TIMEOUT_S).contains(&failover.deadline_s) {
        p.push("failover.deadline_s", format!("must be between 1 and {MAX_TIMEOUT_S} seconds"));
    }
    let mut classes = BTreeSet::new();
    for (i, class) in failover.on.iter().enumerate() {
        if !classes.insert(class) {
            p.push(format!("failover.on[{i}]"), "is listed twice");
        }
    }
    let retry = &failover.retry;
    if retry.attempts > 3 {
        p.push("failover.retry.attempts", "must be between 0 and 3");
    }
    if retry.max_wait_s > 30 {
        p.push("failover.retry.max_wait_s", "must be between 0 and 30 seconds");
    }
    for (i, class) in retry.on.iter().enumerate() {
        use crate::route::FailoverOn::*;
        if !matches!(class, RateLimited | ServerError | Timeout | Connect) {
            p.push(format!("failover.retry.on[{i}]"), "must be one of 429, 5xx, timeout, connect");
        } else if retry.on.get(..i).is_some_and(|before| before.contains(class)) {
            p.push(format!("failover.retry.on[{i}]"), "is listed twice");
        }
    }

    if route.rules.len() > MAX_RULES {
        p.push("rules", format!("must have at most {MAX_RULES} rules"));
    }
    for (i, rule) in route.rules.iter().enumerate() {
        let at = format!("rules[{i}]");
        match (&rule.use_targets, &rule.deny) {
            (Some(_), Some(_)) => p.push(&at, "has both use and deny; a rule either narrows or refuses"),
            (None, None) if rule.when.location_required.is_none() => {
                p.push(&at, "needs use, deny or when.location_required; otherwise it does nothing")
            }
            _ => {}
        }
        if let Some(use_targets) = &rule.use_targets {
            if use_targets.is_empty() {
                p.push(format!("{at}.use"), "must list at least one target");
            }
            for (j, id) in use_targets.iter().enumerate() {
                if !listed.contains(id.as_str()) {
                    p.push(
                        format!("{at}.use[{j}]"),
                        format!("{id:?} is not one of the route's targets (use may only narrow)"),
                    );
                }
            }
        }
        if let Some(reason) = &rule.deny
            && (reason.trim().is_empty() || reason.len() > 500)
        {
            p.push(format!("{at}.deny"), "must be a reason of 1-500 characters");
        }
        let when = &rule.when;
        if let Some(flagged) = &when.flagged {
            for (j, name) in flagged.iter().enumerate() {
                if !GUARDRAIL_NAMES.contains(&name.as_str()) {
                    p.push(
                        format!("{at}.when.flagged[{j}]"),
                        format!("{name:?} is not a guardrail (one of: {})", GUARDRAIL_NAMES.join(", ")),
                    );
                }
            }
        }
        for (key, values) in
            [("flagged", &when.flagged), ("data_class", &when.data_class), ("agent", &when.agent), ("role", &when.role)]
        {
            if let Some(values) = values {
                if values.is_empty() {
                    p.push(format!("{at}.when.{key}"), "must list at least one value");
                }
                if values.iter().any(|v| v.trim().is_empty() || v.len() > 128) {
                    p.push(format!("{at}.when.{key}"), "values must be 1-128 characters");
                }
            }
        }
        if when.prompt_tokens_over == Some(0) {
            p.push(format!("{at}.when.prompt_tokens_over"), "must be positive");
        }
    }

    route.limits.check(&mut p, "limits");

    if let Some(budget) = &route.budget {
        if budget.monthly.micros() <= 0 {
            p.push("budget.monthly", "must be positive");
        }
        if budget.currency != "USD" {
            p.push("budget.currency", "only USD is supported");
        }
        for (i, id) in budget.fallback_targets.iter().enumerate() {
            if !listed.contains(id.as_str()) {
                p.push(format!("budget.fallback_targets[{i}]"), format!("{id:?} is not one of the route's targets"));
            }
        }
        if budget.at_limit == AtLimit::Fallback && budget.fallback_targets.is_empty() {
            p.push(
                "budget.fallback_targets",
                "are required for at_limit fallback (use at_limit block to refuse instead)",
            );
        }
    }

    if let Some(required) = &route.required_profile {
        for (key, requirement) in required {
            let field = format!("required_profile.{key}");
            if !PROFILE_KEYS.contains(&key.as_str()) {
                p.push(&field, format!("is not a profile key (one of: {})", PROFILE_KEYS.join(", ")));
                continue;
            }
            let shape_ok = match requirement {
                Requirement::Flag(_) => key == "zdr",
                Requirement::Exactly(_) => key != "zdr",
                Requirement::AnyOf(values) => key != "zdr" && !values.is_empty(),
            };
            if !shape_ok {
                let want = if key == "zdr" { "true or false" } else { "a value or a non-empty list of values" };
                p.push(&field, format!("must be {want}"));
            }
        }
        for id in &route.targets {
            let Some(target) = targets.get(id) else {
                continue;
            };
            let unmet = target.profile.clone().unwrap_or_default().unmet(required);
            for key in unmet {
                p.push(
                    format!("required_profile.{key}"),
                    format!("target {id:?} does not satisfy it (its profile {})", describe(target, key)),
                );
            }
        }
    }
    p.into_result()
}

fn describe(target: &Target, key: &str) -> String {
    let value = target
        .profile
        .as_ref()
        .and_then(|profile| serde_json::to_value(profile).ok())
        .and_then(|v| v.get(key).cloned());
    match value {
        Some(v) => format!("has {key} = {v}"),
        None => format!("does not declare {key}"),
    }
}

/// Routes whose envelope `target` (as it would be after a write) breaks, with the keys it
/// fails: a target write that breaks a route is refused (ROUTING.md, 409 naming the routes).
pub fn routes_broken_by<'r>(target: &Target, routes: &'r [Route]) -> Vec<(&'r str, Vec<String>)> {
    let profile = target.profile.clone().unwrap_or_default();
    routes
        .iter()
        .filter(|route| route.targets.iter().any(|t| t == &target.id))
        .filter_map(|route| {
            let required = route.required_profile.as_ref()?;
            let unmet: Vec<String> = profile.unmet(required).into_iter().map(str::to_string).collect();
            (!unmet.is_empty()).then_some((route.name.as_str(), unmet))
        })
        .collect()
}

/// Routes that list `target_id`.
pub fn routes_using<'r>(target_id: &str, routes: &'r [Route]) -> Vec<&'r str> {
    routes.iter().filter(|r| r.targets.iter().any(|t| t == target_id)).map(|r| r.name.as_str()).collect()
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
