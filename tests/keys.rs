//! Keys a team can hand out (issue 32), end to end from the official SDKs: a route allow-list
//! (403 in the caller's shape that never reveals which routes exist, `/v1/models` filtered, the
//! default path counted as a route name), expiry (401 that says so), rotation with grace, a
//! change published to every proxy within a second, per-key budgets that block and warn with
//! two proxies under concurrent load and spend exact to the micro-unit, the key-scoped
//! `budget_exceeded` event exactly once, usage per key, and the operator's cap on a tenant.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_e2e::stack::{Stack, StackOptions, chat_body};

/// Runs `ops` (`{sdk, op, key, model?}`) through the official SDKs (tests/sdk/keys.py): what
/// each SDK made of each call, one JSON value per op.
async fn sdk(stack: &Stack, ops: Value) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/keys.py");
    let out = tokio::process::Command::new("python3")
        .args([script, &format!("http://{}", stack.proxy), &ops.to_string()])
        .output()
        .await
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the SDK script failed (are openai and anthropic installed?): {stderr}");
    let lines: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), ops.as_array().unwrap().len(), "{lines:?} {stderr}");
    lines
}

fn chat(sdk: &str, key: &str, model: &str) -> Value {
    json!({"sdk": sdk, "op": "chat", "key": key, "model": model})
}

fn models(sdk: &str, key: &str) -> Value {
    json!({"sdk": sdk, "op": "models", "key": key})
}

/// The `budget_exceeded` events' data on the stack's `gw_events`.
async fn budget_events(stack: &Stack) -> Vec<Value> {
    let mut conn = shield_e2e::redis_conn(&shield_e2e::redis_url()).await;
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(format!("{}gw_events", stack.prefix))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    entries
        .iter()
        .filter(|(_, fields)| fields.iter().any(|(k, v)| k == "type" && v == "budget_exceeded"))
        .map(|(_, fields)| serde_json::from_str(&fields.iter().find(|(k, _)| k == "data").unwrap().1).unwrap())
        .collect()
}

/// The status of one chat call to `proxy` with `key`.
async fn status_on(client: &reqwest::Client, proxy: &str, key: &str, model: &str) -> StatusCode {
    let url = format!("http://{proxy}/v1/chat/completions");
    client.post(url).bearer_auth(key).json(&chat_body(model)).send().await.unwrap().status()
}

/// Every proxy answers `want` within a second from now.
async fn within_a_second(client: &reqwest::Client, proxies: &[String], key: &str, model: &str, want: StatusCode) {
    let written = Instant::now();
    for proxy in proxies {
        while status_on(client, proxy, key, model).await != want {
            assert!(written.elapsed() < Duration::from_secs(1), "{proxy} does not answer {want} for {model} yet");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn month() -> String {
    chrono::Utc::now().format("%Y%m").to_string()
}

/// 10 prompt + 20 completion tokens at 2.5 / 10 USD per million: 225 micro-USD a call.
async fn priced(stack: &Stack, id: &str) {
    stack.mock_target(id, "usage:10-20", json!({"price": {"input_per_mtok": 2.5, "output_per_mtok": 10}})).await;
}

#[tokio::test]
async fn an_allow_list_limits_routes_models_and_the_default_path_without_revealing_routes() {
    let stack = Stack::start_with(StackOptions { default_upstream: true, ..Default::default() }).await;
    stack.mock_target("a", "", json!({})).await;
    for route in ["team-a", "team-b", "smart"] {
        stack.put_route(route, json!({"targets": ["a"]})).await;
    }
    let (limited, _) = stack.key_with(json!({"name": "team key", "routes": ["team-*"]})).await;
    let (open, _) = stack.key(None).await;
    let lines = sdk(
        &stack,
        json!([
            chat("openai", &limited, "team-a"),
            chat("anthropic", &limited, "team-b"),
            chat("openai", &limited, "smart"),
            chat("openai", &limited, "no-such-route"),
            chat("anthropic", &limited, "smart"),
            chat("openai", &limited, "gpt-4o-mini"),
            models("openai", &limited),
            models("anthropic", &limited),
            chat("openai", &open, "gpt-4o-mini"),
            chat("openai", &open, "smart"),
        ]),
    )
    .await;
    assert_eq!((lines[0]["ok"].clone(), lines[1]["ok"].clone()), (json!(true), json!(true)), "{lines:?}");
    // A route that exists and one that does not are refused alike.
    for (line, model) in [(&lines[2], "smart"), (&lines[3], "no-such-route"), (&lines[5], "gpt-4o-mini")] {
        assert_eq!(line["error"], "PermissionDeniedError", "{line}");
        assert_eq!((line["status"].as_u64(), line["code"].as_str()), (Some(403), Some("permission_denied")), "{line}");
        let message = line["message"].as_str().unwrap();
        assert!(message.contains(&format!("model `{model}`")) && message.contains("allow-list"), "{message}");
        assert!(!message.contains("team-a") && !message.contains("exist"), "reveals nothing of the routes: {message}");
    }
    assert_eq!(
        (lines[4]["error"].as_str(), lines[4]["status"].as_u64(), lines[4]["type"].as_str()),
        (Some("PermissionDeniedError"), Some(403), Some("permission_error")),
        "Anthropic's shape: {}",
        lines[4]
    );
    assert_eq!(lines[6]["models"], json!(["team-a", "team-b"]), "OpenAI's list, filtered");
    assert_eq!(lines[7]["models"], json!(["team-a", "team-b"]), "Anthropic's list, filtered");
    assert_eq!(lines[8]["ok"], true, "a key without an allow-list reaches the default path: {}", lines[8]);
    assert_eq!(lines[9]["ok"], true);
    assert_eq!(stack.received("a").await.len(), 3, "refused calls reach no upstream");
    let default_chats = stack
        .received("default")
        .await
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap().ends_with("/chat/completions"))
        .count();
    assert_eq!(default_chats, 1, "only the open key's call took the default path");
}

#[tokio::test]
async fn expiry_and_rotation_with_grace() {
    let stack = Stack::start().await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    // Calls before the expiry and during the grace go straight over HTTP (an SDK run starts
    // a Python process, seconds on a loaded machine); what the SDKs make of the refusals after
    // is checked through them.
    let expires_at = chrono::Utc::now() + chrono::Duration::seconds(4);
    let (expiring, _) = stack.key_with(json!({"name": "short", "expires_at": expires_at.to_rfc3339()})).await;
    let (rotated, id) = stack.key_with(json!({"name": "ci", "budget": {"monthly": 5}, "limits": {"rpm": 600}})).await;
    for key in [&expiring, &rotated] {
        assert_eq!(status_on(&stack.client, &stack.proxy, key, "smart").await, StatusCode::OK);
    }

    let (fresh, answer) = stack.rotate_key(&id, 3).await;
    assert_eq!(answer["id"], id.as_str(), "the key keeps its id");
    assert_eq!((answer["budget"]["monthly"].as_f64(), answer["limits"]["rpm"].as_u64()), (Some(5.0), Some(600)));
    assert!(answer["previous_until"].is_string(), "{answer}");
    for key in [&rotated, &fresh] {
        assert_eq!(
            status_on(&stack.client, &stack.proxy, key, "smart").await,
            StatusCode::OK,
            "both work in the grace"
        );
    }

    let grace_end: chrono::DateTime<chrono::Utc> = answer["previous_until"].as_str().unwrap().parse().unwrap();
    let until = expires_at.max(grace_end) + chrono::Duration::milliseconds(500);
    tokio::time::sleep(until.signed_duration_since(chrono::Utc::now()).to_std().unwrap_or_default()).await;
    let after = sdk(
        &stack,
        json!([
            chat("openai", &expiring, "smart"),
            chat("anthropic", &expiring, "smart"),
            chat("openai", &rotated, "smart"),
            chat("openai", &fresh, "smart"),
            chat("openai", "sk-shield-unknownunknownunknownunknownunknown1234", "smart"),
        ]),
    )
    .await;
    assert_eq!((after[0]["error"].as_str(), after[0]["status"].as_u64()), (Some("AuthenticationError"), Some(401)));
    assert_eq!(after[0]["code"], "expired_api_key");
    assert!(after[0]["message"].as_str().unwrap().contains("expired at"), "{}", after[0]);
    assert_eq!((after[1]["status"].as_u64(), after[1]["type"].as_str()), (Some(401), Some("authentication_error")));
    assert!(after[2]["message"].as_str().unwrap().contains("rotated"), "the old secret stopped: {}", after[2]);
    assert_eq!(after[3]["ok"], true, "the new secret works: {}", after[3]);
    assert_eq!(after[4]["code"], "invalid_api_key", "an unknown key reads differently: {}", after[4]);
    assert_eq!(stack.received("a").await.len(), 5);

    let (_, list) = stack.admin_call(Method::GET, "/v1/tenant/me/keys", None).await;
    let key = list["keys"].as_array().unwrap().iter().find(|k| k["id"] == id.as_str()).unwrap().clone();
    assert_eq!(key["prefix"].as_str(), Some(&fresh[..14]), "the list shows the new secret's prefix: {key}");
    let (_, audit) = stack.admin_call(Method::GET, "/v1/tenant/me/audit", None).await;
    let rotation = audit["entries"].as_array().unwrap().iter().find(|e| e["action"] == "key_rotated").unwrap();
    assert_eq!((rotation["object"].as_str(), rotation["details"]["grace_s"].as_i64()), (Some(id.as_str()), Some(3)));
}

/// A change is published at once: with caches refreshed only every 5 minutes, both proxies see
/// a shrunk allow-list, a passed expiry and a revocation within a second of the write.
#[tokio::test]
async fn every_change_reaches_every_proxy_within_a_second() {
    let mut stack = Stack::start_with(StackOptions { cache_s: 300, ..Default::default() }).await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("team-a", json!({"targets": ["a"]})).await;
    stack.put_route("team-b", json!({"targets": ["a"]})).await;
    let second = stack.extra_proxy().await;
    let (key, id) = stack.key_with(json!({"name": "dev", "metadata": {"owner": "alice", "team": "ml"}})).await;
    let proxies = [stack.proxy.clone(), second.clone()];
    for proxy in &proxies {
        assert_eq!(status_on(&stack.client, proxy, &key, "team-a").await, StatusCode::OK, "cached on {proxy}");
    }
    let path = format!("/v1/tenant/me/keys/{id}");
    let client = stack.client.clone();
    let within_a_second = |model: &'static str, want: StatusCode| {
        let (client, proxies, key) = (client.clone(), proxies.clone(), key.clone());
        async move { within_a_second(&client, &proxies, &key, model, want).await }
    };
    let (status, body) = stack.admin_call(Method::PATCH, &path, Some(json!({"routes": ["team-b"]}))).await;
    assert_eq!((status, body["routes"].clone()), (StatusCode::OK, json!(["team-b"])), "{body}");
    within_a_second("team-a", StatusCode::FORBIDDEN).await;
    within_a_second("team-b", StatusCode::OK).await;

    let soon = (chrono::Utc::now() + chrono::Duration::milliseconds(1500)).to_rfc3339();
    let (status, body) = stack.admin_call(Method::PATCH, &path, Some(json!({"expires_at": soon}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    within_a_second("team-b", StatusCode::UNAUTHORIZED).await;
    let (status, _) = stack.admin_call(Method::PATCH, &path, Some(json!({"expires_at": null}))).await;
    assert_eq!(status, StatusCode::OK);
    within_a_second("team-b", StatusCode::OK).await;

    let (status, _) = stack.admin_call(Method::DELETE, &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    within_a_second("team-b", StatusCode::UNAUTHORIZED).await;

    let (_, audit) = stack.admin_call(Method::GET, "/v1/tenant/me/audit", None).await;
    let updates: Vec<&Value> =
        audit["entries"].as_array().unwrap().iter().filter(|e| e["action"] == "key_updated").collect();
    assert_eq!(updates.len(), 3, "every change audited: {audit}");
    assert_eq!(updates[0]["details"]["metadata"], json!({"owner": "alice", "team": "ml"}));
    assert!(updates.iter().all(|e| e["before_digest"] != e["after_digest"]));
}

#[tokio::test]
async fn bad_key_settings_are_refused_naming_the_field() {
    let stack = Stack::start().await;
    let (_, id) = stack.key(None).await;
    let past = (chrono::Utc::now() - chrono::Duration::seconds(5)).to_rfc3339();
    let cases = [
        (json!({"name": "k", "colour": "red"}), "colour"),
        (json!({"name": "k", "routes": ["ok-*", "bad name"]}), "routes[1]"),
        (json!({"name": "k", "routes": ["a**"]}), "routes[0]"),
        (json!({"name": "k", "expires_at": past}), "expires_at"),
        (json!({"name": "k", "expires_at": "tomorrow"}), "expires_at"),
        (json!({"name": "k", "budget": {"monthly": -1}}), "budget.monthly"),
        (json!({"name": "k", "budget": {"monthly": "ten"}}), "budget.monthly"),
        (json!({"name": "k", "budget": {"monthly": 1, "action": "stop"}}), "budget.action"),
        (json!({"name": "k", "metadata": {"no spaces": "x"}}), "metadata.no spaces"),
    ];
    for (body, field) in cases {
        let (status, answer) = stack.admin_call(Method::POST, "/v1/tenant/me/keys", Some(body.clone())).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{body}: {answer}");
        let mut patch = body.clone();
        patch.as_object_mut().unwrap().remove("name");
        let (status, answer) =
            stack.admin_call(Method::PATCH, &format!("/v1/tenant/me/keys/{id}"), Some(patch.clone())).await;
        assert_eq!(
            (status, answer["error"]["field"].clone()),
            (StatusCode::UNPROCESSABLE_ENTITY, json!(field)),
            "{patch}"
        );
    }
    for grace in [json!(-1), json!(604_801), json!("a day")] {
        let path = format!("/v1/tenant/me/keys/{id}/rotate");
        let (status, answer) = stack.admin_call(Method::POST, &path, Some(json!({"grace_s": grace}))).await;
        assert_eq!(
            (status, answer["error"]["field"].clone()),
            (StatusCode::UNPROCESSABLE_ENTITY, json!("grace_s")),
            "{answer}"
        );
    }
    let (_, list) = stack.admin_call(Method::GET, "/v1/tenant/me/keys", None).await;
    assert_eq!(list["keys"].as_array().unwrap().len(), 1, "nothing made: {list}");
    assert_eq!(list["keys"][0]["routes"], Value::Null, "nothing changed: {list}");
}

/// Two proxies, 60 concurrent calls of a key whose budget is 20 calls: calls are refused once
/// the flushed spend reaches the budget; every answered call is counted, to the micro-USD, in
/// the key's spend and its usage rows; the key-scoped event is written exactly once; a `warn`
/// key is marked from 80 % and never refused.
#[tokio::test]
async fn key_budgets_block_and_warn_with_two_proxies_under_load() {
    let mut stack = Stack::start().await;
    let (hook_url, delivered) = shield_e2e::webhook::receiver(0).await;
    let hook = json!({"url": hook_url, "events": ["budget_exceeded"], "allow_private": true});
    let hook = stack.create_webhook(hook).await;
    let hook_secret = hook["secret"].as_str().unwrap().to_string();
    priced(&stack, "a").await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    let second = stack.extra_proxy().await;
    let (blocked, blocked_id) = stack
        .key_with(json!({"name": "ci", "budget": {"monthly": 0.0045, "action": "block"}, "metadata": {"team": "ci"}}))
        .await;
    let (warned, warned_id) =
        stack.key_with(json!({"name": "dev", "budget": {"monthly": 0.0009, "action": "warn"}})).await;

    let calls = (0..60).map(|i| {
        let proxy = if i % 2 == 0 { stack.proxy.clone() } else { second.clone() };
        let (client, key) = (stack.client.clone(), blocked.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(50 * (i / 4))).await; // 4 at a time, over 750 ms
            let url = format!("http://{proxy}/v1/chat/completions");
            let response = client.post(url).bearer_auth(key).json(&chat_body("smart")).send().await.unwrap();
            let status = response.status();
            let cost = response.json::<Value>().await.unwrap()["x_shield"]["routing"]["cost_micros"].as_i64();
            (status, cost)
        }
    });
    let results = futures_util::future::join_all(calls).await;
    let answered: Vec<i64> = results.iter().filter(|(s, _)| *s == StatusCode::OK).map(|(_, c)| c.unwrap()).collect();
    let refused = results.iter().filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS).count();
    assert_eq!(answered.len() + refused, 60, "{results:?}");
    assert!(answered.len() >= 20, "the budget's 20 calls were answered: {}", answered.len());
    assert!(refused > 0, "calls past the budget were refused");
    assert_eq!(stack.received("a").await.len(), answered.len(), "a refused call reaches no upstream");

    let mut conn = shield_e2e::redis_conn(&shield_e2e::redis_url()).await;
    let key_spend = format!("{}gw_key_spend:{{{}}}:{}", stack.prefix, stack.tenant, month());
    let want: i64 = answered.iter().sum();
    assert_eq!(want, 225 * answered.len() as i64);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let spent: Option<i64> =
            redis::cmd("HGET").arg(&key_spend).arg(&blocked_id).query_async(&mut conn).await.unwrap();
        if spent == Some(want) {
            break;
        }
        assert!(Instant::now() < deadline, "the key's flushed spend {spent:?} is not {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let lines = sdk(&stack, json!([chat("openai", &blocked, "smart"), chat("anthropic", &blocked, "smart")])).await;
    assert_eq!((lines[0]["error"].as_str(), lines[0]["status"].as_u64()), (Some("RateLimitError"), Some(429)));
    assert_eq!(lines[0]["code"], "budget_exceeded");
    assert!(lines[0]["message"].as_str().unwrap().contains("this API key reached its monthly budget of 0.0045 USD"));
    let retry: u64 = lines[0]["headers"]["retry-after"].as_str().unwrap().parse().unwrap();
    let month_end = chrono::Utc::now().date_naive().with_day(1).unwrap() + chrono::Months::new(1);
    let to_end = (month_end.and_hms_opt(0, 0, 0).unwrap().and_utc() - chrono::Utc::now()).num_seconds() as u64;
    assert!(retry.abs_diff(to_end) <= 5, "Retry-After is the month's end: {retry} vs {to_end}");
    assert_eq!(lines[0]["headers"]["x-should-retry"], "false");
    assert_eq!((lines[1]["status"].as_u64(), lines[1]["type"].as_str()), (Some(429), Some("rate_limit_error")));

    // `warn`: 225 a call against 900; from the call that starts at 900 × 80 % = 720 spent.
    let ops: Vec<Value> =
        (0..6).map(|i| chat(if i % 2 == 0 { "openai" } else { "anthropic" }, &warned, "smart")).collect();
    let lines = sdk(&stack, json!(ops)).await;
    let marks: Vec<bool> = lines.iter().map(|l| l["headers"]["x-shield-key-budget"] == "warn").collect();
    assert!(lines.iter().all(|l| l["ok"] == true), "warn never refuses: {lines:?}");
    assert_eq!(marks, [false, false, false, false, true, true], "{lines:?}");

    // Exactly one key-scoped event per key and month, whatever the two processes flushed.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let events = budget_events(&stack).await;
    for (id, limit) in [(&blocked_id, 0.0045), (&warned_id, 0.0009)] {
        let mine: Vec<&Value> = events.iter().filter(|e| e["key_id"] == id.as_str()).collect();
        assert_eq!(mine.len(), 1, "once per key and month: {events:?}");
        assert_eq!((mine[0]["scope"].as_str(), mine[0]["limit"].as_f64()), (Some("key"), Some(limit)));
        assert_eq!(mine[0]["month"], month());
    }
    // And the signed webhook: one delivery per key, with its scope and id.
    let bodies = shield_e2e::eventually(20, "both key-scoped webhooks", || async {
        let got = delivered.lock().unwrap().clone();
        (got.len() >= 2).then_some(got)
    })
    .await;
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    for id in [&blocked_id, &warned_id] {
        let mine: Vec<_> = bodies.iter().filter(|r| r.body.contains(id.as_str())).collect();
        assert_eq!(mine.len(), 1, "{bodies:?}");
        let body: Value = serde_json::from_str(&mine[0].body).unwrap();
        assert_eq!((body["type"].as_str(), body["data"]["scope"].as_str()), (Some("budget_exceeded"), Some("key")));
        assert_eq!(body["data"]["key_id"], id.as_str());
        let signed = mine[0].header("x-shield-signature");
        assert_eq!(signed, shield_e2e::webhook::signature(&hook_secret, &mine[0].body), "signed");
    }

    let path = "/v1/tenant/me/gateway/usage?group_by=key";
    let (status, usage) = stack.admin_call(Method::GET, path, None).await;
    assert_eq!(status, StatusCode::OK, "{usage}");
    let row = usage["rows"].as_array().unwrap().iter().find(|r| r["key_id"] == blocked_id.as_str()).unwrap();
    assert_eq!(
        (row["calls"].as_u64(), row["cost_micros"].as_i64()),
        (Some(answered.len() as u64), Some(want)),
        "{row}"
    );
    assert_eq!((row["key_name"].as_str(), row["route"].as_str()), (Some("ci"), Some("smart")));
    assert_eq!(row["metadata"], json!({"team": "ci"}));
    let (_, only) = stack.admin_call(Method::GET, &format!("{path}&key={warned_id}"), None).await;
    assert_eq!(only["rows"].as_array().unwrap().len(), 1, "{only}");
    assert_eq!((only["rows"][0]["calls"].as_u64(), only["rows"][0]["cost_micros"].as_i64()), (Some(6), Some(1350)));
    let (_, keys) = stack.admin_call(Method::GET, "/v1/tenant/me/keys", None).await;
    let listed = keys["keys"].as_array().unwrap().iter().find(|k| k["id"] == blocked_id.as_str()).unwrap();
    assert_eq!(listed["month_spend_micros"].as_i64(), Some(want), "the list shows the month's spend: {listed}");
}

use chrono::Datelike;

/// The operator's cap on a tenant: only the operator sets it; it blocks every key of the
/// tenant once the month's spend over all routes reaches it, and alerts once with `scope:
/// "tenant"`.
#[tokio::test]
async fn the_operator_caps_a_tenants_monthly_spend() {
    let stack = Stack::start().await;
    priced(&stack, "a").await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    stack.put_route("cheap", json!({"targets": ["a"]})).await;
    let (one, _) = stack.key(None).await;
    let (two, _) = stack.key(None).await;
    let path = format!("/v1/admin/tenants/{}/budget", stack.tenant);
    let cap = json!({"monthly": 0.0009, "action": "block"});
    let (status, _) = stack.admin_call(Method::PUT, &path, Some(cap.clone())).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a tenant's own admin cannot lift its cap");
    for (bad, field) in [(json!({"monthly": 0}), "monthly"), (json!({"monthly": 1, "x": 1}), "x")] {
        let (status, answer) = stack.operator_call(Method::PUT, &path, Some(bad)).await;
        assert_eq!((status, answer["error"]["field"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!(field)));
    }
    let (status, answer) = stack.operator_call(Method::PUT, &path, Some(cap.clone())).await;
    assert_eq!((status, answer.clone()), (StatusCode::OK, cap.clone()), "{answer}");
    let (_, read) = stack.operator_call(Method::GET, &path, None).await;
    assert_eq!(read, cap);
    tokio::time::sleep(Duration::from_millis(300)).await; // the snapshot reaches the proxy

    // 225 a call against 900, over two keys and two routes: the fifth call is refused.
    let mut statuses = Vec::new();
    for (key, route) in [(&one, "smart"), (&two, "cheap"), (&one, "cheap"), (&two, "smart"), (&one, "smart")] {
        let (status, headers, _) = stack.chat(key, chat_body(route), &[]).await;
        statuses.push((status.as_u16(), headers.get("x-shield-tenant-budget").is_some()));
    }
    assert_eq!(statuses, [(200, false), (200, false), (200, false), (200, false), (429, false)]);
    let (status, _, body) = stack.chat(&two, chat_body("cheap"), &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body["error"]["message"].as_str().unwrap().contains("monthly spend cap its platform operator set"));

    let events = shield_e2e::eventually(10, "the tenant-scoped event", || async {
        let events: Vec<Value> = budget_events(&stack).await.into_iter().filter(|e| e["scope"] == "tenant").collect();
        (!events.is_empty()).then_some(events)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // another flush claims nothing more
    let again: Vec<Value> = budget_events(&stack).await.into_iter().filter(|e| e["scope"] == "tenant").collect();
    assert_eq!((events.len(), again.len()), (1, 1), "{again:?}");
    assert_eq!((events[0]["limit"].as_f64(), events[0]["spend"].as_f64()), (Some(0.0009), Some(0.0009)));

    let (status, _) = stack.operator_call(Method::DELETE, &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(stack.operator_call(Method::GET, &path, None).await.1, Value::Null, "lifted");
    let lifted = shield_e2e::eventually(5, "the lifted cap to reach the proxy", || async {
        let (status, _, _) = stack.chat(&one, chat_body("smart"), &[]).await;
        (status == StatusCode::OK).then_some(status)
    })
    .await;
    assert_eq!(lifted, StatusCode::OK);
    let (_, audit) = stack.admin_call(Method::GET, "/v1/tenant/me/audit", None).await;
    let set: Vec<&Value> =
        audit["entries"].as_array().unwrap().iter().filter(|e| e["action"] == "tenant_budget_set").collect();
    assert_eq!(set.len(), 2, "{audit}");
    assert_eq!(set[1]["actor"], "operator-test");
}

/// Publishes that overlap land in any order (a PATCH's publish late after a revocation's, a
/// background republish from an older read): a key record of an earlier config version never
/// replaces a later one, so a revoked key stays revoked.
#[tokio::test]
async fn a_late_publish_of_an_older_version_cannot_undo_a_revocation() {
    let stack = Stack::start().await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    let (key, id) = stack.key(None).await;
    let (status, _) =
        stack.admin_call(Method::PATCH, &format!("/v1/tenant/me/keys/{id}"), Some(json!({"routes": ["smart"]}))).await;
    assert_eq!(status, StatusCode::OK);
    let gw_key = format!("{}gw_key:{}", stack.prefix, shield_core::snapshot::key_hash(&key));
    let mut conn = shield_e2e::redis_conn(&shield_e2e::redis_url()).await;
    let patched = read_record(&mut conn, &gw_key).await;
    let (status, _) = stack.admin_call(Method::DELETE, &format!("/v1/tenant/me/keys/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let revoked = read_record(&mut conn, &gw_key).await;
    assert!(revoked.revoked && revoked.version > patched.version, "{revoked:?} after {patched:?}");

    // The PATCH's publish, arriving late.
    let db = sqlx::PgPool::connect(&stack.db.url).await.unwrap();
    let redis = shield_store::Pool::open(&shield_e2e::redis_url(), 1).unwrap();
    let publisher =
        shield_admin::publish::Publisher::new(db, redis, shield_core::keys::RedisKeys::new(stack.prefix.clone()));
    let hash = shield_core::snapshot::key_hash(&key);
    publisher.set_records(vec![(hash, patched.clone())]).await.unwrap();
    assert_eq!(read_record(&mut conn, &gw_key).await, revoked, "the older record did not replace the revocation");
    let (status, _, _) = stack.chat(&key, chat_body("smart"), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

async fn read_record(conn: &mut shield_store::Connection, gw_key: &str) -> shield_core::snapshot::ApiKeyRecord {
    let text: String = redis::cmd("GET").arg(gw_key).query_async(conn).await.unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The tenant's month total (what the operator's cap reads) starts from the route spend the
/// month already had when totals began to be kept: the first flush seeds it from `gw_spend`.
#[tokio::test]
async fn the_tenant_total_starts_from_the_months_route_spend() {
    let stack = Stack::start().await;
    priced(&stack, "a").await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    let (key, _) = stack.key(None).await;
    let mut conn = shield_e2e::redis_conn(&shield_e2e::redis_url()).await;
    let spend = format!("{}gw_spend:{{{}}}:{}", stack.prefix, stack.tenant, month());
    let total = format!("{}gw_tenant_spend:{{{}}}:{}", stack.prefix, stack.tenant, month());
    // Spend flushed before this release kept totals: route spend only.
    let _: () = redis::cmd("HSET").arg(&spend).arg("earlier").arg(1_000).query_async(&mut conn).await.unwrap();
    let (status, _, _) = stack.chat(&key, chat_body("smart"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let flushed: Option<i64> = redis::cmd("HGET").arg(&total).arg("total").query_async(&mut conn).await.unwrap();
        if let Some(flushed) = flushed {
            assert_eq!(flushed, 1_225, "the month's earlier route spend, then this call's 225");
            break;
        }
        assert!(Instant::now() < deadline, "the first flush of a total");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _, _) = stack.chat(&key, chat_body("smart"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis::cmd("HGET").arg(&total).arg("total").query_async::<i64>(&mut conn).await.unwrap() != 1_450 {
        assert!(Instant::now() < deadline, "the next flush adds to the total, seeding nothing again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
