//! Selection (ROUTING.md "Selection pipeline"): from a route, the tenant's targets and what is
//! known about this request, the eligible set in the order the strategy would try it, with the
//! reason for every excluded candidate. Pure: the proxy passes in everything it knows.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use rand::Rng;

use crate::route::{Route, Rule, Strategy};
use crate::run::Halt;
use crate::target::{AuthMode, Flavor, Target};
use crate::usage::{BudgetState, cost_micros};

/// Why a candidate is not eligible for this request (a closed set; also a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Exclusion {
    /// Not in the set the matched rule narrowed the route to.
    Rule,
    /// The monthly budget is at its limit and this target is not a fallback target.
    Budget,
    Disabled,
    /// This process's circuit breaker for the target is open (or its half-open probe is out).
    CircuitOpen,
    /// Parked after an exhaustion answer (quota, credits, rate window) until its reset.
    Exhausted,
    /// The target's profile does not satisfy the route's `required_profile` (seed 004).
    EnvelopeMismatch,
    /// The prompt plus the requested answer does not fit the declared window or output limit.
    ContextWindow,
    /// The request uses tools and the target declares it cannot.
    ToolsUnsupported,
    /// The request carries content the target's API cannot read (an Anthropic document,
    /// search results, server-tool history): never silently dropped.
    UnsupportedField,
    /// The route lists a target the snapshot does not have (defence in depth; writes refuse it).
    Unknown,
    CredentialUnavailable,
}

impl Exclusion {
    pub fn as_str(self) -> &'static str {
        match self {
            Exclusion::Rule => "rule",
            Exclusion::Budget => "budget",
            Exclusion::Disabled => "disabled",
            Exclusion::CircuitOpen => "circuit_open",
            Exclusion::Exhausted => "exhausted",
            Exclusion::EnvelopeMismatch => "envelope_mismatch",
            Exclusion::ContextWindow => "context_window",
            Exclusion::ToolsUnsupported => "tools_unsupported",
            Exclusion::UnsupportedField => "unsupported_field",
            Exclusion::Unknown => "unknown_target",
            Exclusion::CredentialUnavailable => "credential_unavailable",
        }
    }
}

/// What the proxy knows about the request and its own state, as plain data.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Guardrails that flagged the input but allowed it (monitor, warn).
    pub flagged: BTreeSet<String>,
    /// `X-Shield-Data-Class`.
    pub data_class: Option<String>,
    /// From the caller's API key, never from a header.
    pub agent: Option<String>,
    pub role: Option<String>,
    /// Characters of the prompt / 4.
    pub prompt_tokens: u64,
    /// The answer's expected size (`max_tokens`, else a default), for `lowest_cost`.
    pub expected_output_tokens: u64,
    /// The route's budget state (ROUTING.md step 3).
    pub budget: BudgetState,
    /// The caller sent `X-Shield-Upstream-Key` (for passthrough targets).
    pub has_upstream_key: bool,
    /// Targets whose vault secret is in the snapshot, decrypts, and is bound to their host.
    pub vault_ready: BTreeSet<String>,
    /// Targets this process's breaker does not admit now.
    pub circuit_open: BTreeSet<String>,
    /// Targets parked by an exhaustion cooldown.
    pub exhausted: BTreeSet<String>,
    /// The request declares `tools`.
    pub uses_tools: bool,
    /// The request's `max_tokens` / `max_completion_tokens`.
    pub max_tokens: Option<u64>,
    /// Only targets of this flavor can honour the request (it carries fields only that API
    /// has, e.g. Anthropic's `thinking`).
    pub requires_flavor: Option<Flavor>,
    /// This process's EWMA latency (ms) of successful attempts, per target.
    pub latency_ms: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Excluded {
    pub target: String,
    pub reason: Exclusion,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The index of the rule that decided (first match), if any.
    pub rule: Option<usize>,
    /// The call is refused with this halt (`denied` by a rule, `budget_blocked`) and reason:
    /// nothing is tried.
    pub refused: Option<(Halt, String)>,
    /// The eligible set in the order attempts will go.
    pub order: Vec<String>,
    pub excluded: Vec<Excluded>,
}

/// ROUTING.md steps 2, 4 and 5: the first matching rule narrows (or denies), admission
/// excludes with reasons, the strategy orders what is left. Nothing outside the rule's set is
/// ever in `order` (the narrowing invariant).
pub fn plan(route: &Route, targets: &BTreeMap<String, Target>, facts: &Facts, rng: &mut impl Rng) -> Plan {
    let mut out = Plan::default();
    let matched = route.rules.iter().position(|rule| matches(rule, facts));
    out.rule = matched;
    if let Some(reason) = matched.and_then(|i| route.rules.get(i)?.deny.clone()) {
        out.refused = Some((Halt::Denied, reason));
        return out;
    }
    // Step 3, after the rules ("As built"): `block` refuses; `fallback` narrows further.
    let fallback = match facts.budget {
        BudgetState::Block => {
            out.refused = Some((Halt::BudgetBlocked, BUDGET_SPENT.to_string()));
            return out;
        }
        BudgetState::Fallback => route.budget.as_ref().map(|b| b.fallback_targets.as_slice()),
        _ => None,
    };
    let mut narrowed_to_some = false;
    for id in &route.targets {
        if let Some(rule) = matched.and_then(|i| route.rules.get(i))
            && !selects(rule, id, targets)
        {
            out.excluded.push(Excluded { target: id.clone(), reason: Exclusion::Rule });
            continue;
        }
        if fallback.is_some_and(|allowed| !allowed.contains(id)) {
            out.excluded.push(Excluded { target: id.clone(), reason: Exclusion::Budget });
            continue;
        }
        narrowed_to_some = true;
        match admit(route, targets.get(id), facts) {
            Ok(()) => out.order.push(id.clone()),
            Err(reason) => out.excluded.push(Excluded { target: id.clone(), reason }),
        }
    }
    if fallback.is_some() && !narrowed_to_some {
        // Seed "As built": a fallback that leaves no target (after the rules) refuses the call.
        out.refused = Some((Halt::BudgetBlocked, BUDGET_SPENT.to_string()));
        return out;
    }
    out.order = order(route, targets, facts, out.order, rng);
    out
}

/// The refusal text of a spent budget (API.md).
pub const BUDGET_SPENT: &str = "This route's monthly budget is spent";

/// Seed §3.2: all present conditions hold; `location_required` is not a test ("As built").
pub fn matches(rule: &Rule, facts: &Facts) -> bool {
    let when = &rule.when;
    let one_of = |values: &Option<Vec<String>>, fact: Option<&str>| match values {
        None => true,
        Some(values) => fact.is_some_and(|f| values.iter().any(|v| v == f)),
    };
    when.flagged.as_ref().is_none_or(|names| names.iter().any(|n| facts.flagged.contains(n)))
        && one_of(&when.data_class, facts.data_class.as_deref())
        && one_of(&when.agent, facts.agent.as_deref())
        && one_of(&when.role, facts.role.as_deref())
        && when.prompt_tokens_over.is_none_or(|limit| facts.prompt_tokens > limit)
}

/// Whether a matched rule keeps `id`: in its `use` list (when it has one) and at its required
/// location (when it sets one).
fn selects(rule: &Rule, id: &str, targets: &BTreeMap<String, Target>) -> bool {
    let listed = rule.use_targets.as_ref().is_none_or(|use_targets| use_targets.iter().any(|t| t == id));
    let located =
        rule.when.location_required.is_none_or(|location| targets.get(id).is_some_and(|t| t.location == location));
    listed && located
}

/// Step 4: why a candidate cannot take this call, checked before anything is sent.
fn admit(route: &Route, target: Option<&Target>, facts: &Facts) -> Result<(), Exclusion> {
    let target = target.ok_or(Exclusion::Unknown)?;
    if !target.enabled {
        return Err(Exclusion::Disabled);
    }
    // Defence in depth (writes refuse it too): availability may degrade, the envelope may not.
    if let Some(required) = &route.required_profile
        && !target.profile.clone().unwrap_or_default().unmet(required).is_empty()
    {
        return Err(Exclusion::EnvelopeMismatch);
    }
    let credential_ready = match target.auth.mode {
        AuthMode::None => true,
        AuthMode::Passthrough => facts.has_upstream_key,
        AuthMode::Vault => facts.vault_ready.contains(&target.id),
    };
    if !credential_ready {
        return Err(Exclusion::CredentialUnavailable);
    }
    if facts.circuit_open.contains(&target.id) {
        return Err(Exclusion::CircuitOpen);
    }
    if facts.exhausted.contains(&target.id) {
        return Err(Exclusion::Exhausted);
    }
    if facts.requires_flavor.is_some_and(|flavor| !target.speaks(flavor)) {
        return Err(Exclusion::UnsupportedField);
    }
    // Capability admission (seed 001): undeclared capabilities admit.
    if let Some(caps) = &target.capabilities {
        let answer = facts.max_tokens.unwrap_or(0);
        let over_window = caps.context_window.is_some_and(|w| facts.prompt_tokens + answer > u64::from(w));
        let over_output =
            caps.max_output_tokens.zip(facts.max_tokens).is_some_and(|(limit, asked)| asked > u64::from(limit));
        if over_window || over_output {
            return Err(Exclusion::ContextWindow);
        }
        if facts.uses_tools && caps.tools == Some(false) {
            return Err(Exclusion::ToolsUnsupported);
        }
    }
    Ok(())
}

/// The strategy's order over the eligible set (ROUTING.md step 5).
fn order(
    route: &Route,
    targets: &BTreeMap<String, Target>,
    facts: &Facts,
    eligible: Vec<String>,
    rng: &mut impl Rng,
) -> Vec<String> {
    match route.strategy {
        Strategy::Priority => eligible,
        Strategy::LowestCost => {
            // The estimated cost of this request on each target; unpriced targets last, ties
            // (and the unpriced) in route order.
            let mut ordered = eligible;
            let estimate = |id: &String| {
                let price = targets.get(id).and_then(|t| t.price.as_ref())?;
                Some(cost_micros(Some(price), facts.prompt_tokens, facts.expected_output_tokens))
            };
            ordered.sort_by_key(|id| match estimate(id) {
                Some(cost) => (0, cost),
                None => (1, 0),
            });
            ordered
        }
        Strategy::LowestLatency => {
            // Untried targets first (in route order), so every target gets measured; then
            // the fastest. The sort is stable, so ties keep route order.
            let mut ordered = eligible;
            ordered.sort_by(|a, b| {
                let key = |id: &String| facts.latency_ms.get(id).copied();
                match (key(a), key(b)) {
                    (None, None) => std::cmp::Ordering::Equal,
                    (None, Some(_)) => std::cmp::Ordering::Less,
                    (Some(_), None) => std::cmp::Ordering::Greater,
                    (Some(x), Some(y)) => x.total_cmp(&y),
                }
            });
            ordered
        }
        Strategy::Weighted => {
            let weight = |id: &String| route.weights.as_ref().and_then(|w| w.get(id)).copied().unwrap_or(0);
            let (mut weighted, zero): (Vec<String>, Vec<String>) = eligible.into_iter().partition(|id| weight(id) > 0);
            // Weighted random without replacement: draw one in proportion to its weight, remove
            // it, repeat. Zero-weight targets follow in route order.
            let mut ordered = Vec::with_capacity(weighted.len() + zero.len());
            while !weighted.is_empty() {
                let total: u64 = weighted.iter().map(|id| u64::from(weight(id))).sum();
                let mut pick = rng.random_range(0..total);
                let index = weighted
                    .iter()
                    .position(|id| {
                        let w = u64::from(weight(id));
                        if pick < w {
                            true
                        } else {
                            pick -= w;
                            false
                        }
                    })
                    .unwrap_or(0);
                ordered.push(weighted.remove(index));
            }
            ordered.extend(zero);
            ordered
        }
    }
}

/// Exponentially weighted moving average of a target's successful attempt latency.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ewma(Option<f64>);

impl Ewma {
    const ALPHA: f64 = 0.3;

    pub fn observe(&mut self, ms: f64) {
        self.0 = Some(match self.0 {
            None => ms,
            Some(previous) => Self::ALPHA * ms + (1.0 - Self::ALPHA) * previous,
        });
    }

    pub fn value(&self) -> Option<f64> {
        self.0
    }
}

#[cfg(test)]
#[path = "narrowing_tests.rs"]
mod narrowing_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::from_json_field;

    fn target(id: &str, extra: serde_json::Value) -> Target {
        let mut body = serde_json::json!({"id": id, "base_url": "https://x.example.com/v1", "model": "m", "auth": {"mode": "none"}});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        from_json_field(body.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn priority_keeps_route_order_and_names_every_exclusion() {
        let targets: BTreeMap<String, Target> = [
            target("a", serde_json::json!({})),
            target("off", serde_json::json!({"enabled": false})),
            target("vault", serde_json::json!({"auth": {"mode": "vault", "secret_ref": "shield://s"}})),
            target("byok", serde_json::json!({"auth": {"mode": "passthrough"}})),
            target("b", serde_json::json!({})),
        ]
        .into_iter()
        .map(|t| (t.id.clone(), t))
        .collect();
        let route: Route =
            from_json_field(br#"{"name": "r", "targets": ["b", "off", "vault", "byok", "ghost", "a"]}"#).unwrap();
        let p = plan(&route, &targets, &Facts::default(), &mut rng());
        assert_eq!(p.order, vec!["b", "a"]);
        let reasons: Vec<(&str, Exclusion)> = p.excluded.iter().map(|e| (e.target.as_str(), e.reason)).collect();
        assert_eq!(
            reasons,
            vec![
                ("off", Exclusion::Disabled),
                ("vault", Exclusion::CredentialUnavailable),
                ("byok", Exclusion::CredentialUnavailable),
                ("ghost", Exclusion::Unknown)
            ]
        );
        let facts =
            Facts { has_upstream_key: true, vault_ready: BTreeSet::from(["vault".to_string()]), ..Facts::default() };
        assert_eq!(plan(&route, &targets, &facts, &mut rng()).order, vec!["b", "vault", "byok", "a"]);
        let facts = Facts { circuit_open: BTreeSet::from(["b".to_string()]), ..Facts::default() };
        let p = plan(&route, &targets, &facts, &mut rng());
        assert_eq!(p.order, vec!["a"]);
        assert_eq!(p.excluded[0], Excluded { target: "b".into(), reason: Exclusion::CircuitOpen });
    }

    fn rng() -> rand::rngs::SmallRng {
        rand::SeedableRng::seed_from_u64(7)
    }

    fn three() -> BTreeMap<String, Target> {
        ["a", "b", "c"].into_iter().map(|id| (id.to_string(), target(id, serde_json::json!({})))).collect()
    }

    #[test]
    fn lowest_latency_tries_untried_first_then_the_fastest() {
        let route: Route =
            from_json_field(br#"{"name": "r", "targets": ["a", "b", "c"], "strategy": "lowest_latency"}"#).unwrap();
        let facts = Facts {
            latency_ms: BTreeMap::from([("a".to_string(), 300.0), ("c".to_string(), 20.0)]),
            ..Facts::default()
        };
        assert_eq!(plan(&route, &three(), &facts, &mut rng()).order, vec!["b", "c", "a"]);
        let mut ewma = Ewma::default();
        ewma.observe(100.0);
        ewma.observe(200.0);
        assert_eq!(ewma.value(), Some(130.0));
    }

    #[test]
    fn weighted_draws_without_replacement_in_proportion() {
        let route: Route = from_json_field(
            br#"{"name": "r", "targets": ["a", "b", "c"], "strategy": "weighted", "weights": {"a": 70, "b": 30}}"#,
        )
        .unwrap();
        let mut rng = rng();
        let mut first_a = 0;
        for _ in 0..1000 {
            let order = plan(&route, &three(), &Facts::default(), &mut rng).order;
            assert_eq!(order.len(), 3, "every eligible target, once");
            assert_eq!(order[2], "c", "zero weight comes last");
            if order[0] == "a" {
                first_a += 1;
            }
        }
        assert!((650..=750).contains(&first_a), "70/30 within ±5 %: {first_a}/1000");
    }
}
