//! Table tests: one row per validation rule, each naming the field it must report.

use super::*;
use crate::parse::from_json_field as from_json;
use crate::route::Route;
use crate::target::Target;
use serde_json::{Value, json};

fn secrets() -> SecretBindings {
    BTreeMap::from([("openai_prod".to_string(), vec!["api.openai.com".to_string()])])
}

fn base_target() -> Value {
    json!({
        "base_url": "https://api.openai.com/v1", "model": "gpt-4o",
        "auth": {"mode": "vault", "secret_ref": "shield://openai_prod"},
        "price": {"input_per_mtok": 2.5, "output_per_mtok": 10.0},
    })
}

fn with(mut base: Value, patch: Value) -> Value {
    for (k, v) in patch.as_object().unwrap() {
        if v.is_null() {
            base.as_object_mut().unwrap().remove(k);
        } else {
            base[k] = v.clone();
        }
    }
    base
}

/// Decodes and validates; returns the fields reported (decode errors included).
fn target_fields(body: &Value) -> Vec<String> {
    match from_json::<Target>(body.to_string().as_bytes()) {
        Err(e) => vec![e.field],
        Ok(mut t) => match validate_target("openai-4o", &mut t, &secrets()) {
            Ok(()) => vec![],
            Err(errors) => errors.into_iter().map(|e| e.field).collect(),
        },
    }
}

#[test]
fn a_good_target_passes_and_gets_defaults() {
    let mut t: Target = from_json(base_target().to_string().as_bytes()).unwrap();
    validate_target("openai-4o", &mut t, &secrets()).unwrap();
    assert_eq!(t.id, "openai-4o");
    assert_eq!((t.timeout_s, t.first_byte_timeout_s, t.idle_timeout_s), (60, Some(20), 15));
    assert_eq!(t.auth.header_and_scheme(t.flavor), ("Authorization", "Bearer"));
    assert_eq!((t.auth.header.as_deref(), t.auth.scheme.as_deref()), (Some("Authorization"), Some("Bearer")));
    assert!(t.enabled);
}

/// Issue 14: a default bounded by another field follows what the user set there, and only
/// what the user wrote is reported.
#[test]
fn defaults_never_contradict_what_the_user_set() {
    let stored = |patch: Value| -> Result<Target, Vec<String>> {
        let mut t: Target = from_json(with(base_target(), patch).to_string().as_bytes()).unwrap();
        match validate_target("openai-4o", &mut t, &secrets()) {
            Ok(()) => Ok(t),
            Err(errors) => Err(errors.into_iter().map(|e| format!("{}: {}", e.field, e.message)).collect()),
        }
    };
    // first_byte_timeout_s: min(20, timeout_s) when omitted, stored so reads show it.
    let t = stored(json!({"timeout_s": 5})).unwrap();
    assert_eq!((t.timeout_s, t.first_byte_timeout_s, t.first_byte_timeout_s()), (5, Some(5), 5));
    assert_eq!(serde_json::to_value(&t).unwrap()["first_byte_timeout_s"], 5, "the effective value is stored");
    assert_eq!(stored(json!({"timeout_s": 300})).unwrap().first_byte_timeout_s, Some(20));
    assert_eq!(stored(json!({"timeout_s": 1})).unwrap().first_byte_timeout_s, Some(1));
    // Written by the user and contradictory: reported, naming the field.
    assert_eq!(
        stored(json!({"timeout_s": 5, "first_byte_timeout_s": 6})).unwrap_err(),
        vec!["first_byte_timeout_s: must not exceed timeout_s"]
    );
    // A bad timeout_s is reported once, on itself, not on the default derived from it.
    assert_eq!(stored(json!({"timeout_s": 0})).unwrap_err(), vec!["timeout_s: must be between 1 and 600 seconds"]);
    assert_eq!(stored(json!({"timeout_s": 601})).unwrap_err(), vec!["timeout_s: must be between 1 and 600 seconds"]);
    // idle_timeout_s bounds a stream's gaps after its first event, which timeout_s does not
    // cover: its default stands beside any timeout_s, and so does a value the user wrote.
    assert_eq!(stored(json!({"timeout_s": 5})).unwrap().idle_timeout_s, 15);
    assert_eq!(stored(json!({"timeout_s": 5, "idle_timeout_s": 60})).unwrap().idle_timeout_s, 60);
    // A target read back (first_byte present) stores unchanged.
    let again = stored(serde_json::to_value(stored(json!({"timeout_s": 5})).unwrap()).unwrap()).unwrap();
    assert_eq!(again.first_byte_timeout_s, Some(5));
}

#[test]
fn target_rules() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("id mismatch", json!({"id": "other"}), "id"),
        ("unknown top-level field", json!({"colour": "red"}), "colour"),
        ("missing model", json!({"model": null}), "model"),
        ("empty model", json!({"model": " "}), "model"),
        ("bad URL", json!({"base_url": "not a url"}), "base_url"),
        ("bad scheme", json!({"base_url": "ftp://api.openai.com"}), "base_url"),
        ("credentials in URL", json!({"base_url": "https://u:p@api.openai.com/v1"}), "base_url"),
        (
            "loopback without allow_private",
            json!({"base_url": "http://127.0.0.1:9100/v1", "auth": {"mode": "none"}}),
            "base_url",
        ),
        ("metadata address", json!({"base_url": "http://169.254.169.254/v1", "auth": {"mode": "none"}}), "base_url"),
        ("private range", json!({"base_url": "http://10.0.0.5/v1", "auth": {"mode": "none"}}), "base_url"),
        ("unknown flavor", json!({"flavor": "watsonx"}), "flavor"),
        ("bedrock without a region", json!({"flavor": "bedrock"}), "bedrock.region"),
        ("bedrock region malformed", json!({"flavor": "bedrock", "bedrock": {"region": "US East"}}), "bedrock.region"),
        ("bedrock options on openai", json!({"bedrock": {"region": "us-east-1"}}), "bedrock"),
        ("unknown bedrock option", json!({"flavor": "bedrock", "bedrock": {"zone": "a"}}), "bedrock.zone"),
        ("vertex options on openai", json!({"vertex": {"publisher": "google"}}), "vertex"),
        ("unknown vertex publisher", json!({"flavor": "vertex", "vertex": {"publisher": "meta"}}), "vertex.publisher"),
        ("vertex model with a slash", json!({"flavor": "vertex", "model": "a/b"}), "model"),
        (
            "azure without deployment",
            json!({"flavor": "azure", "azure": {"api_version": "2024-06-01"}}),
            "azure.deployment",
        ),
        ("azure block missing", json!({"flavor": "azure"}), "azure"),
        ("azure settings on openai", json!({"azure": {"deployment": "d"}}), "azure"),
        ("gemini model with a path", json!({"flavor": "gemini", "model": "models/../x"}), "model"),
        (
            "gemini model with a method",
            json!({"flavor": "gemini", "model": "gemini-2.5-flash:generateContent"}),
            "model",
        ),
        ("unknown auth mode", json!({"auth": {"mode": "key"}}), "auth.mode"),
        ("vault without ref", json!({"auth": {"mode": "vault"}}), "auth.secret_ref"),
        (
            "vault ref wrong scheme",
            json!({"auth": {"mode": "vault", "secret_ref": "vault://openai_prod"}}),
            "auth.secret_ref",
        ),
        (
            "vault ref to missing secret",
            json!({"auth": {"mode": "vault", "secret_ref": "shield://nope"}}),
            "auth.secret_ref",
        ),
        ("vault ref not bound to host", json!({"base_url": "https://evil.example.com/v1"}), "auth.secret_ref"),
        (
            "ref on passthrough",
            json!({"auth": {"mode": "passthrough", "secret_ref": "shield://openai_prod"}}),
            "auth.secret_ref",
        ),
        ("passthrough header not a token", json!({"auth": {"mode": "passthrough", "header": "X Key"}}), "auth.header"),
        ("header with CRLF", json!({"auth": {"mode": "passthrough", "header": "X-Key\r\nHost"}}), "auth.header"),
        ("reserved header", json!({"auth": {"mode": "passthrough", "header": "Host"}}), "auth.header"),
        ("scheme with space", json!({"auth": {"mode": "none", "scheme": "Bearer x"}}), "auth.scheme"),
        ("unknown auth field", json!({"auth": {"mode": "none", "key": "sk-1"}}), "auth.key"),
        ("location closed set", json!({"location": "moon"}), "location"),
        ("zero timeout", json!({"timeout_s": 0}), "timeout_s"),
        ("huge timeout", json!({"timeout_s": 100000}), "timeout_s"),
        ("negative timeout", json!({"timeout_s": -1}), "timeout_s"),
        ("first byte after timeout", json!({"timeout_s": 10, "first_byte_timeout_s": 20}), "first_byte_timeout_s"),
        ("breaker threshold zero", json!({"breaker": {"failures": 0}}), "breaker.failures"),
        ("breaker probe interval too long", json!({"breaker": {"probe_interval_s": 7200}}), "breaker.probe_interval_s"),
        ("breaker unknown field", json!({"breaker": {"cooldown": 1}}), "breaker.cooldown"),
        ("zero idle", json!({"idle_timeout_s": 0}), "idle_timeout_s"),
        ("negative price", json!({"price": {"input_per_mtok": -1, "output_per_mtok": 1}}), "price.input_per_mtok"),
        (
            "sub-micro price",
            json!({"price": {"input_per_mtok": 0.0000001, "output_per_mtok": 1}}),
            "price.input_per_mtok",
        ),
        (
            "price currency",
            json!({"price": {"input_per_mtok": 1, "output_per_mtok": 1, "currency": "EUR"}}),
            "price.currency",
        ),
        ("price as string", json!({"price": {"input_per_mtok": "1", "output_per_mtok": 1}}), "price.input_per_mtok"),
        ("zero context window", json!({"capabilities": {"context_window": 0}}), "capabilities.context_window"),
        ("unknown capability", json!({"capabilities": {"vision": true}}), "capabilities.vision"),
        ("unknown profile key", json!({"profile": {"colour": "red"}}), "profile.colour"),
        ("empty profile value", json!({"profile": {"region": ""}}), "profile.region"),
        ("extra_body sets model", json!({"extra_body": {"model": "x"}}), "extra_body.model"),
        ("extra_body sets stream", json!({"extra_body": {"stream": true}}), "extra_body.stream"),
        ("extra_body not an object", json!({"extra_body": [1]}), "extra_body"),
        ("enabled not a bool", json!({"enabled": "yes"}), "enabled"),
    ];
    for (what, patch, field) in cases {
        let fields = target_fields(&with(base_target(), patch));
        assert!(fields.contains(&field.to_string()), "{what}: expected {field:?}, got {fields:?}");
    }
}

#[test]
fn private_hosts_pass_with_allow_private_and_bound_vault_refs() {
    let body =
        json!({"base_url": "http://127.0.0.1:9100/v1", "model": "m", "allow_private": true, "auth": {"mode": "none"}});
    assert_eq!(target_fields(&body), Vec::<String>::new());
    let mut s = secrets();
    s.insert("local".into(), vec!["127.0.0.1".into()]);
    let mut t: Target = from_json(
        json!({"base_url": "http://127.0.0.1:9100/v1", "model": "m", "allow_private": true,
        "auth": {"mode": "vault", "secret_ref": "shield://local"}})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    validate_target("local", &mut t, &s).unwrap();
}

#[test]
fn errors_say_why() {
    let mut t: Target =
        from_json(with(base_target(), json!({"base_url": "https://evil.example.com/v1"})).to_string().as_bytes())
            .unwrap();
    let errors = validate_target("x", &mut t, &secrets()).unwrap_err();
    assert!(errors[0].message.contains("not bound to host \"evil.example.com\""), "{}", errors[0].message);
    assert!(!errors[0].message.is_empty());
}

fn targets() -> BTreeMap<String, Target> {
    let mut out = BTreeMap::new();
    for (id, region) in [("openai-4o", "us"), ("azure-4o", "eu"), ("onprem-qwen", "eu")] {
        let mut t: Target = from_json(
            json!({"base_url": "https://api.openai.com/v1", "model": "m", "auth": {"mode": "none"},
            "profile": {"region": region, "zdr": true}})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        t.id = id.into();
        out.insert(id.to_string(), t);
    }
    out
}

fn base_route() -> Value {
    json!({
        "targets": ["openai-4o", "azure-4o", "onprem-qwen"],
        "rules": [
            {"when": {"flagged": ["pii_detection"]}, "use": ["onprem-qwen"]},
            {"when": {"role": ["contractor"]}, "deny": "Contractors cannot use this model"},
            {"when": {"location_required": "on_prem"}},
        ],
        "budget": {"monthly": 500.0, "at_limit": "fallback", "fallback_targets": ["onprem-qwen"]},
    })
}

fn route_fields(body: &Value) -> Vec<String> {
    match from_json::<Route>(body.to_string().as_bytes()) {
        Err(e) => vec![e.field],
        Ok(mut r) => match validate_route("smart", &mut r, &targets()) {
            Ok(()) => vec![],
            Err(errors) => errors.into_iter().map(|e| e.field).collect(),
        },
    }
}

/// Issue 14, routes: the defaults bounded by other fields stand beside any value the user set
/// there. `deadline_s` caps each attempt at what remains (a target's longer `timeout_s` is cut
/// short, not refused); `max_attempts` caps tries over the eligible set, which may be smaller.
#[test]
fn route_defaults_never_contradict_the_targets() {
    let mut slow = targets();
    for t in slow.values_mut() {
        t.timeout_s = 600;
    }
    let check = |body: Value, targets: &BTreeMap<String, Target>| -> Result<Route, Vec<String>> {
        let mut r: Route = from_json(body.to_string().as_bytes()).unwrap();
        validate_route("smart", &mut r, targets).map(|()| r).map_err(|e| e.into_iter().map(|e| e.field).collect())
    };
    let r = check(json!({"targets": ["openai-4o", "azure-4o"]}), &slow).unwrap();
    assert_eq!(r.failover.deadline_s, 120, "the default deadline stands beside 600 s target timeouts");
    let r = check(json!({"targets": ["openai-4o"]}), &targets()).unwrap();
    assert_eq!(r.failover.max_attempts, 3, "three attempts over one target: the run stops when none is left");
    let r = check(json!({"targets": ["openai-4o"], "failover": {"max_attempts": 10, "deadline_s": 1}}), &slow);
    assert!(r.is_ok(), "values the user wrote are not compared with other objects' fields: {r:?}");
    let r = check(json!({"targets": ["openai-4o"], "failover": {"deadline_s": 30}}), &targets()).unwrap();
    assert_eq!(
        (r.failover.max_attempts, r.failover.deadline_s),
        (3, 30),
        "a written deadline keeps the default attempts"
    );
}

#[test]
fn a_good_route_passes_and_gets_defaults() {
    let mut r: Route = from_json(base_route().to_string().as_bytes()).unwrap();
    validate_route("smart", &mut r, &targets()).unwrap();
    assert_eq!(r.name, "smart");
    assert_eq!(r.failover.max_attempts, 3);
    assert_eq!(r.failover.deadline_s, 120);
    assert_eq!(r.failover.on.len(), 4);
}

#[test]
fn route_rules() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("name mismatch", json!({"name": "other"}), "name"),
        ("unknown field", json!({"fallback": "x"}), "fallback"),
        ("no targets", json!({"targets": []}), "targets"),
        ("unknown target", json!({"targets": ["openai-4o", "ghost"]}), "targets[1]"),
        ("duplicate target", json!({"targets": ["openai-4o", "openai-4o"]}), "targets[1]"),
        ("unknown strategy", json!({"strategy": "random"}), "strategy"),
        ("too many retries", json!({"failover": {"retry": {"attempts": 4}}}), "failover.retry.attempts"),
        (
            "retry wait too long",
            json!({"failover": {"retry": {"attempts": 1, "max_wait_s": 31}}}),
            "failover.retry.max_wait_s",
        ),
        ("retry on 402", json!({"failover": {"retry": {"attempts": 1, "on": ["402"]}}}), "failover.retry.on[0]"),
        ("weights without weighted", json!({"weights": {"openai-4o": 1}}), "weights"),
        ("weighted without weights", json!({"strategy": "weighted"}), "weights"),
        (
            "weight for unlisted target",
            json!({"strategy": "weighted", "weights": {"ghost": 1, "openai-4o": 1}}),
            "weights.ghost",
        ),
        ("all weights zero", json!({"strategy": "weighted", "weights": {"openai-4o": 0}}), "weights"),
        ("failover class outside the set", json!({"failover": {"on": ["timeout", "4xx"]}}), "failover.on[1]"),
        ("failover class twice", json!({"failover": {"on": ["timeout", "timeout"]}}), "failover.on[1]"),
        ("zero attempts", json!({"failover": {"max_attempts": 0}}), "failover.max_attempts"),
        ("too many attempts", json!({"failover": {"max_attempts": 11}}), "failover.max_attempts"),
        ("zero deadline", json!({"failover": {"deadline_s": 0}}), "failover.deadline_s"),
        ("unknown failover field", json!({"failover": {"retries": 2}}), "failover.retries"),
        ("use outside targets", json!({"rules": [{"when": {}, "use": ["ghost"]}]}), "rules[0].use[0]"),
        ("empty use", json!({"rules": [{"when": {}, "use": []}]}), "rules[0].use"),
        ("use and deny", json!({"rules": [{"when": {}, "use": ["openai-4o"], "deny": "no"}]}), "rules[0]"),
        ("rule that does nothing", json!({"rules": [{"when": {"role": ["x"]}}]}), "rules[0]"),
        ("empty deny", json!({"rules": [{"when": {}, "deny": " "}]}), "rules[0].deny"),
        (
            "unknown guardrail",
            json!({"rules": [{"when": {"flagged": ["toxicity"]}, "use": ["openai-4o"]}]}),
            "rules[0].when.flagged[0]",
        ),
        (
            "unknown condition",
            json!({"rules": [{"when": {"country": ["de"]}, "use": ["openai-4o"]}]}),
            "rules[0].when.country",
        ),
        (
            "empty data_class",
            json!({"rules": [{"when": {"data_class": []}, "use": ["openai-4o"]}]}),
            "rules[0].when.data_class",
        ),
        (
            "bad location",
            json!({"rules": [{"when": {"location_required": "moon"}}]}),
            "rules[0].when.location_required",
        ),
        (
            "zero token threshold",
            json!({"rules": [{"when": {"prompt_tokens_over": 0}, "use": ["openai-4o"]}]}),
            "rules[0].when.prompt_tokens_over",
        ),
        (
            "fallback target outside",
            json!({"budget": {"monthly": 1, "at_limit": "fallback", "fallback_targets": ["ghost"]}}),
            "budget.fallback_targets[0]",
        ),
        (
            "fallback without targets",
            json!({"budget": {"monthly": 1, "at_limit": "fallback"}}),
            "budget.fallback_targets",
        ),
        ("zero budget", json!({"budget": {"monthly": 0}}), "budget.monthly"),
        ("budget currency", json!({"budget": {"monthly": 5, "currency": "EUR"}}), "budget.currency"),
        ("unknown at_limit", json!({"budget": {"monthly": 5, "at_limit": "panic"}}), "budget.at_limit"),
        ("profile key unknown", json!({"required_profile": {"colour": "red"}}), "required_profile.colour"),
        ("profile not met", json!({"required_profile": {"region": "eu"}}), "required_profile.region"),
        ("zdr as string", json!({"required_profile": {"zdr": "yes"}}), "required_profile.zdr"),
    ];
    for (what, patch, field) in cases {
        let fields = route_fields(&with(base_route(), patch));
        assert!(fields.contains(&field.to_string()), "{what}: expected {field:?}, got {fields:?}");
    }
}

#[test]
fn route_names() {
    let mut r: Route = from_json(base_route().to_string().as_bytes()).unwrap();
    assert!(validate_route("shield/cheap", &mut r.clone(), &targets()).is_ok());
    let errors = validate_route("bad name", &mut r, &targets()).unwrap_err();
    assert_eq!(errors[0].field, "name");
}

#[test]
fn envelope_met_by_every_target_passes_and_names_the_offender_otherwise() {
    let body = with(
        base_route(),
        json!({"targets": ["azure-4o", "onprem-qwen"], "rules": [], "budget": null,
        "required_profile": {"region": ["eu"], "zdr": true}}),
    );
    assert_eq!(route_fields(&body), Vec::<String>::new());
    let mut r: Route =
        from_json(with(base_route(), json!({"required_profile": {"region": "eu"}})).to_string().as_bytes()).unwrap();
    let errors = validate_route("smart", &mut r, &targets()).unwrap_err();
    assert!(
        errors.iter().any(|e| e.message.contains("\"openai-4o\"") && e.message.contains("region = \"us\"")),
        "{errors:?}"
    );
}

#[test]
fn target_changes_that_break_a_route_envelope_are_found() {
    let mut r: Route = from_json(
        with(
            base_route(),
            json!({"targets": ["azure-4o"], "rules": [], "budget": null,
        "required_profile": {"region": "eu"}}),
        )
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    r.name = "eu-only".into();
    let mut t = targets()["azure-4o"].clone();
    assert!(routes_broken_by(&t, std::slice::from_ref(&r)).is_empty());
    t.profile.as_mut().unwrap().region = Some("us".into());
    assert_eq!(routes_broken_by(&t, std::slice::from_ref(&r)), vec![("eu-only", vec!["region".to_string()])]);
    assert_eq!(routes_using("azure-4o", std::slice::from_ref(&r)), vec!["eu-only"]);
    assert!(routes_using("openai-4o", &[r]).is_empty());
}
