//! Rules (seed §8 item 2) and the narrowing invariant (item 3): table tests for each condition,
//! first match, `use`, `deny` and `location_required`; and a property test over random routes,
//! rules, request facts and failure sequences that no attempt ever leaves the eligible set.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use crate::outcome::Class;
use crate::parse::from_json_field;
use crate::plan::{Exclusion, Facts, plan};
use crate::route::Route;
use crate::run::{Run, Step};
use crate::target::{Location, Target};

fn target(id: &str, location: &str) -> Target {
    let body = serde_json::json!({"id": id, "base_url": "https://x.example.com/v1", "model": "m", "auth": {"mode": "none"}, "location": location});
    from_json_field(body.to_string().as_bytes()).unwrap()
}

fn targets() -> BTreeMap<String, Target> {
    [target("openai-4o", "cloud"), target("azure-4o", "cloud"), target("onprem-qwen", "on_prem")]
        .into_iter()
        .map(|t| (t.id.clone(), t))
        .collect()
}

/// Seed §3.2's example route.
fn smart() -> Route {
    from_json_field(
        br#"{"name": "smart", "targets": ["openai-4o", "azure-4o", "onprem-qwen"], "rules": [
            {"when": {"flagged": ["pii_detection", "secrets_detection"]}, "use": ["onprem-qwen"]},
            {"when": {"data_class": ["restricted"]}, "use": ["onprem-qwen"]},
            {"when": {"role": ["contractor"]}, "deny": "Contractors cannot use this model"},
            {"when": {"agent": ["batch"], "location_required": "cloud"}},
            {"when": {"prompt_tokens_over": 60000}, "use": ["azure-4o"]}
        ]}"#,
    )
    .unwrap()
}

fn rng() -> rand::rngs::SmallRng {
    rand::SeedableRng::seed_from_u64(1)
}

#[test]
fn each_condition_first_match_use_and_deny() {
    let facts = |f: fn(&mut Facts)| {
        let mut facts = Facts::default();
        f(&mut facts);
        facts
    };
    type Row = (&'static str, Facts, Option<usize>, Vec<&'static str>, Option<&'static str>);
    let cases: Vec<Row> = vec![
        ("no rule matches", Facts::default(), None, vec!["openai-4o", "azure-4o", "onprem-qwen"], None),
        (
            "flagged by pii",
            facts(|f| {
                f.flagged.insert("pii_detection".into());
            }),
            Some(0),
            vec!["onprem-qwen"],
            None,
        ),
        (
            "flagged by secrets",
            facts(|f| {
                f.flagged.insert("secrets_detection".into());
            }),
            Some(0),
            vec!["onprem-qwen"],
            None,
        ),
        ("data class", facts(|f| f.data_class = Some("restricted".into())), Some(1), vec!["onprem-qwen"], None),
        (
            "other data class",
            facts(|f| f.data_class = Some("public".into())),
            None,
            vec!["openai-4o", "azure-4o", "onprem-qwen"],
            None,
        ),
        (
            "role denies",
            facts(|f| f.role = Some("contractor".into())),
            Some(2),
            vec![],
            Some("Contractors cannot use this model"),
        ),
        (
            "agent with location",
            facts(|f| f.agent = Some("batch".into())),
            Some(3),
            vec!["openai-4o", "azure-4o"],
            None,
        ),
        ("long prompt", facts(|f| f.prompt_tokens = 60_001), Some(4), vec!["azure-4o"], None),
        (
            "exactly at the threshold",
            facts(|f| f.prompt_tokens = 60_000),
            None,
            vec!["openai-4o", "azure-4o", "onprem-qwen"],
            None,
        ),
        (
            "first match wins over a later deny",
            facts(|f| {
                f.flagged.insert("pii_detection".into());
                f.role = Some("contractor".into());
            }),
            Some(0),
            vec!["onprem-qwen"],
            None,
        ),
    ];
    for (what, facts, rule, order, denied) in cases {
        let p = plan(&smart(), &targets(), &facts, &mut rng());
        assert_eq!(p.rule, rule, "{what}");
        assert_eq!(p.order, order, "{what}");
        assert_eq!(p.refused.map(|(_, reason)| reason).as_deref(), denied, "{what}");
        for excluded in p.excluded.iter().filter(|e| e.reason == Exclusion::Rule) {
            assert!(!p.order.contains(&excluded.target), "{what}");
        }
    }
}

#[test]
fn all_conditions_of_a_rule_must_hold_and_location_alone_always_applies() {
    let route: Route = from_json_field(
        br#"{"name": "r", "targets": ["openai-4o", "onprem-qwen"], "rules": [
            {"when": {"role": ["analyst"], "data_class": ["internal"]}, "use": ["openai-4o"]},
            {"when": {"location_required": "on_prem"}}
        ]}"#,
    )
    .unwrap();
    let only_role = Facts { role: Some("analyst".into()), ..Facts::default() };
    let p = plan(&route, &targets(), &only_role, &mut rng());
    assert_eq!(
        (p.rule, p.order),
        (Some(1), vec!["onprem-qwen".to_string()]),
        "one condition is not enough; the location rule catches it"
    );
    let both = Facts { role: Some("analyst".into()), data_class: Some("internal".into()), ..Facts::default() };
    assert_eq!(plan(&route, &targets(), &both, &mut rng()).order, vec!["openai-4o"]);
}

#[test]
fn budgets_apply_after_the_rules() {
    use crate::run::Halt;
    use crate::usage::BudgetState;
    let route: Route = from_json_field(
        br#"{"name": "r", "targets": ["openai-4o", "azure-4o", "onprem-qwen"],
            "rules": [{"when": {"role": ["cloud-only"]}, "use": ["openai-4o", "azure-4o"]}],
            "budget": {"monthly": 10, "at_limit": "fallback", "fallback_targets": ["onprem-qwen"]}}"#,
    )
    .unwrap();
    let facts = |budget, role: Option<&str>| Facts { budget, role: role.map(str::to_string), ..Facts::default() };
    let p = plan(&route, &targets(), &facts(BudgetState::Warn, None), &mut rng());
    assert_eq!(p.order.len(), 3, "warn only warns");
    let p = plan(&route, &targets(), &facts(BudgetState::Fallback, None), &mut rng());
    assert_eq!(p.order, vec!["onprem-qwen"]);
    assert_eq!(p.excluded.iter().filter(|e| e.reason == Exclusion::Budget).count(), 2);
    let p = plan(&route, &targets(), &facts(BudgetState::Fallback, Some("cloud-only")), &mut rng());
    assert_eq!(p.refused.map(|(h, _)| h), Some(Halt::BudgetBlocked), "fallback ∩ the rule's set is empty: refused");
    let p = plan(&route, &targets(), &facts(BudgetState::Block, None), &mut rng());
    assert_eq!(p.refused, Some((Halt::BudgetBlocked, "This route's monthly budget is spent".into())));
    assert!(p.order.is_empty());
}

#[test]
fn lowest_cost_orders_by_this_requests_estimated_cost_unpriced_last() {
    let mut targets = targets();
    let price = |input: &str, output: &str| {
        Some(
            from_json_field(format!(r#"{{"input_per_mtok": {input}, "output_per_mtok": {output}}}"#).as_bytes())
                .unwrap(),
        )
    };
    targets.get_mut("openai-4o").unwrap().price = price("2.5", "10");
    targets.get_mut("azure-4o").unwrap().price = price("5", "1");
    let route: Route = from_json_field(
        br#"{"name": "r", "targets": ["onprem-qwen", "openai-4o", "azure-4o"], "strategy": "lowest_cost"}"#,
    )
    .unwrap();
    let long_prompt = Facts { prompt_tokens: 10_000, expected_output_tokens: 100, ..Facts::default() };
    assert_eq!(plan(&route, &targets, &long_prompt, &mut rng()).order, vec!["openai-4o", "azure-4o", "onprem-qwen"]);
    let long_answer = Facts { prompt_tokens: 10, expected_output_tokens: 4_000, ..Facts::default() };
    assert_eq!(plan(&route, &targets, &long_answer, &mut rng()).order, vec!["azure-4o", "openai-4o", "onprem-qwen"]);
}

#[test]
fn admission_excludes_with_a_reason_before_anything_is_sent() {
    let mut targets = targets();
    let caps = |json: &str| Some(from_json_field(json.as_bytes()).unwrap());
    targets.get_mut("openai-4o").unwrap().capabilities =
        caps(r#"{"context_window": 8000, "max_output_tokens": 1000, "tools": false}"#);
    targets.get_mut("azure-4o").unwrap().capabilities = caps(r#"{"context_window": 128000}"#);
    let route: Route =
        from_json_field(br#"{"name": "r", "targets": ["openai-4o", "azure-4o", "onprem-qwen"]}"#).unwrap();
    let reasons = |facts: &Facts| {
        let p = plan(&route, &targets, facts, &mut rng());
        p.excluded.iter().map(|e| (e.target.clone(), e.reason)).collect::<Vec<_>>()
    };
    let big = Facts { prompt_tokens: 7_900, max_tokens: Some(200), ..Facts::default() };
    assert_eq!(reasons(&big), vec![("openai-4o".to_string(), Exclusion::ContextWindow)], "7,900 + 200 > 8,000");
    let long_answer = Facts { max_tokens: Some(2_000), ..Facts::default() };
    assert_eq!(reasons(&long_answer), vec![("openai-4o".to_string(), Exclusion::ContextWindow)]);
    let tools = Facts { uses_tools: true, ..Facts::default() };
    assert_eq!(
        reasons(&tools),
        vec![("openai-4o".to_string(), Exclusion::ToolsUnsupported)],
        "undeclared (azure, onprem) admits"
    );
    let parked = Facts { exhausted: BTreeSet::from(["azure-4o".to_string()]), ..Facts::default() };
    assert_eq!(reasons(&parked), vec![("azure-4o".to_string(), Exclusion::Exhausted)]);
    // Fields only Anthropic's API honours (thinking, documents) exclude every other flavor.
    let mut with_claude = targets.clone();
    with_claude.get_mut("onprem-qwen").unwrap().flavor = crate::target::Flavor::Anthropic;
    let thinking = Facts { requires_flavor: Some(crate::target::Flavor::Anthropic), ..Facts::default() };
    let p = plan(&route, &with_claude, &thinking, &mut rng());
    assert_eq!(p.order, vec!["onprem-qwen"]);
    let excluded: Vec<_> = p.excluded.iter().map(|e| (e.target.as_str(), e.reason)).collect();
    assert_eq!(excluded, vec![("openai-4o", Exclusion::UnsupportedField), ("azure-4o", Exclusion::UnsupportedField)]);
    // Claude on Vertex AI takes the Messages body, so it honours them too; Gemini on Vertex does not.
    let mut on_vertex = with_claude.clone();
    let azure = on_vertex.get_mut("azure-4o").unwrap();
    azure.flavor = crate::target::Flavor::Vertex;
    azure.vertex = Some(crate::target::Vertex { publisher: crate::target::Publisher::Anthropic });
    let p = plan(&route, &on_vertex, &thinking, &mut rng());
    assert_eq!(p.order.len(), 2, "{:?}", p.order);
    on_vertex.get_mut("azure-4o").unwrap().vertex = None;
    assert_eq!(plan(&route, &on_vertex, &thinking, &mut rng()).order, vec!["onprem-qwen"]);
    // A route envelope the stored targets no longer meet (defence in depth at run time).
    let mut envelope: Route = from_json_field(
        br#"{"name": "eu", "targets": ["openai-4o", "onprem-qwen"], "required_profile": {"region": "eu"}}"#,
    )
    .unwrap();
    targets.get_mut("onprem-qwen").unwrap().profile = Some(from_json_field(br#"{"region": "eu"}"#).unwrap());
    let p = plan(&envelope, &targets, &Facts::default(), &mut rng());
    assert_eq!(p.order, vec!["onprem-qwen"]);
    assert_eq!(p.excluded[0].reason, Exclusion::EnvelopeMismatch);
    envelope.required_profile = None;
    assert_eq!(plan(&envelope, &targets, &Facts::default(), &mut rng()).order.len(), 2);
}

#[test]
fn rules_describe_themselves_in_plain_words() {
    let route = smart();
    assert_eq!(
        route.rules[0].describe(),
        "If the prompt is flagged by PII detection or secrets detection → only onprem-qwen"
    );
    assert_eq!(route.rules[2].describe(), "If the role is contractor → refuse: \"Contractors cannot use this model\"");
    assert_eq!(route.rules[3].describe(), "If the agent is batch → any target, cloud only");
}

/// A route, its targets, the request's facts and a failure sequence.
type Case = (Route, BTreeMap<String, Target>, Facts, Vec<u8>);

fn arbitrary_case() -> impl Strategy<Value = Case> {
    let n = 1usize..7;
    n.prop_flat_map(|n| {
        let ids: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
        let locations = proptest::collection::vec(any::<bool>(), n);
        let rule = (
            proptest::option::of(proptest::sample::subsequence(ids.clone(), 1..=n)),
            any::<bool>(),
            proptest::option::of(any::<bool>()),
            proptest::option::of(prop_oneof![Just("pii_detection"), Just("secrets_detection")]),
            proptest::option::of(prop_oneof![Just("restricted"), Just("public")]),
            proptest::option::of(prop_oneof![Just("contractor"), Just("staff")]),
        );
        let rules = proptest::collection::vec(rule, 0..4);
        let facts = (any::<bool>(), any::<bool>(), proptest::option::of(prop_oneof![Just("restricted"), Just("public")]),
            proptest::option::of(prop_oneof![Just("contractor"), Just("staff")]));
        let failures = proptest::collection::vec(0u8..5, 0..8);
        let max_attempts = 1u32..5;
        (Just(ids), locations, rules, facts, failures, max_attempts)
    })
    .prop_map(|(ids, locations, rules, facts, failures, max_attempts)| {
        let targets: BTreeMap<String, Target> = ids
            .iter()
            .zip(&locations)
            .map(|(id, on_prem)| (id.clone(), target(id, if *on_prem { "on_prem" } else { "cloud" })))
            .collect();
        let rules: Vec<serde_json::Value> = rules
            .into_iter()
            .map(|(use_targets, deny, location, flagged, data_class, role)| {
                let mut when = serde_json::Map::new();
                if let Some(f) = flagged {
                    when.insert("flagged".into(), serde_json::json!([f]));
                }
                if let Some(d) = data_class {
                    when.insert("data_class".into(), serde_json::json!([d]));
                }
                if let Some(r) = role {
                    when.insert("role".into(), serde_json::json!([r]));
                }
                if let Some(on_prem) = location {
                    when.insert("location_required".into(), serde_json::json!(if on_prem { "on_prem" } else { "cloud" }));
                }
                let mut rule = serde_json::json!({"when": when});
                if deny {
                    rule["deny"] = serde_json::json!("no");
                } else {
                    rule["use"] = serde_json::json!(use_targets.unwrap_or_else(|| ids.clone()));
                }
                rule
            })
            .collect();
        let route: Route = from_json_field(
            serde_json::json!({"name": "r", "targets": ids, "rules": rules, "failover": {"max_attempts": max_attempts}}).to_string().as_bytes(),
        )
        .unwrap();
        let (pii, secrets, data_class, role) = facts;
        let mut flagged = BTreeSet::new();
        if pii {
            flagged.insert("pii_detection".to_string());
        }
        if secrets {
            flagged.insert("secrets_detection".to_string());
        }
        let facts = Facts { flagged, data_class: data_class.map(str::to_string), role: role.map(str::to_string), ..Facts::default() };
        (route, targets, facts, failures)
    })
}

proptest! {
    /// The narrowing invariant: whatever the rules, facts and failures, every attempt goes to a
    /// target the first matching rule allows (its `use` list and its location), never to a target
    /// twice, never beyond `max_attempts`; a deny tries nothing.
    #[test]
    fn no_attempt_ever_leaves_the_eligible_set((route, targets, facts, failures) in arbitrary_case()) {
        let p = plan(&route, &targets, &facts, &mut rng());
        // An oracle written from the spec, not from `plan`: the first rule whose conditions hold.
        let first = route.rules.iter().position(|rule| {
            let w = &rule.when;
            w.flagged.as_ref().is_none_or(|f| f.iter().any(|n| facts.flagged.contains(n)))
                && w.data_class.as_ref().is_none_or(|d| facts.data_class.as_ref().is_some_and(|c| d.contains(c)))
                && w.role.as_ref().is_none_or(|r| facts.role.as_ref().is_some_and(|c| r.contains(c)))
        });
        prop_assert_eq!(p.rule, first);
        let allowed = |id: &str| match first.map(|i| &route.rules[i]) {
            None => route.targets.iter().any(|t| t == id),
            Some(rule) => {
                let listed = rule.use_targets.as_ref().is_none_or(|u| u.iter().any(|t| t == id));
                let located = rule.when.location_required.is_none_or(|l: Location| targets[id].location == l);
                listed && located
            }
        };
        let mut run = Run::new(p.order.clone(), route.failover.max_attempts, route.failover.on.clone());
        let mut tried = BTreeSet::new();
        let mut outcomes = failures.iter();
        while let Step::Try(id) = run.step(false) {
            prop_assert!(p.refused.is_none(), "a refused call tries nothing");
            prop_assert!(allowed(&id), "{} is outside the eligible set", id);
            prop_assert!(tried.insert(id.clone()), "{} tried twice", id);
            let result = match outcomes.next().copied().unwrap_or(0) {
                0 => Ok(()),
                1 => Err(Class::ServerError),
                2 => Err(Class::Timeout),
                3 => Err(Class::RateLimited),
                _ => Err(Class::Connect),
            };
            run.record("m", result, None, 1);
        }
        prop_assert!(run.attempts.len() as u32 <= route.failover.max_attempts);
    }
}

proptest! {
    /// An exhausted or open target is never in the plan, so never called inside its window;
    /// and a parked cooldown holds for its whole window, however later hints arrive.
    #[test]
    fn exhausted_and_open_targets_are_never_called_inside_their_window(
        (route, targets, facts, _) in arbitrary_case(),
        parked in proptest::collection::vec(any::<bool>(), 7),
        open in proptest::collection::vec(any::<bool>(), 7),
        hints in proptest::collection::vec(proptest::option::of(0u64..5_000_000), 1..5),
        probe in 0u64..4_000_000,
    ) {
        let ids: Vec<String> = route.targets.clone();
        let pick = |flags: &[bool]| ids.iter().zip(flags).filter(|(_, f)| **f).map(|(id, _)| id.clone()).collect::<BTreeSet<String>>();
        let facts = Facts { exhausted: pick(&parked), circuit_open: pick(&open), ..facts };
        let p = plan(&route, &targets, &facts, &mut rng());
        for id in &p.order {
            prop_assert!(!facts.exhausted.contains(id) && !facts.circuit_open.contains(id), "{} planned inside its window", id);
        }

        let mut cooldown = crate::breaker::Cooldown::default();
        let mut longest = 0;
        for (i, hint) in hints.iter().enumerate() {
            let now = i as u64 * 1_000;
            cooldown.park(now, *hint);
            longest = longest.max(now + hint.unwrap_or(crate::breaker::DEFAULT_COOLDOWN_MS).min(crate::breaker::MAX_COOLDOWN_MS));
        }
        prop_assert_eq!(cooldown.is_parked(probe), probe < longest);
    }
}
