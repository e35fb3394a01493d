//! Exhaustion-aware fallback and admission end to end (seed 002 fixtures 1–5, 7, 8, 10, 13,
//! 15, 17; seed 001 capabilities): a quota answer parks the target for its reset window and it
//! is skipped, not hammered, until the window passes or an operator resets it; `402` and
//! `context_length` are opt-in and move on only where it can help; capabilities exclude
//! targets before anything is sent; OpenRouter routing preferences survive every attempt.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_e2e::eventually;
use shield_e2e::stack::{Stack, chat_body};

#[tokio::test]
async fn a_quota_answer_parks_the_target_until_reset() {
    let stack = Stack::start().await;
    stack.mock_target("direct", "seq:429-200;err:insufficient_quota;retry-after:120", json!({})).await;
    stack.mock_target("openrouter", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["direct", "openrouter"]})).await;
    let (key, _) = stack.key(None).await;

    let (status, headers, body) = stack.chat(&key, chat_body("smart"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-shield-target"], "openrouter");
    assert_eq!(body["x_shield"]["routing"]["attempts"][0]["class"], "quota_exhausted");
    for _ in 0..3 {
        let (_, headers, body) = stack.chat(&key, chat_body("smart"), &[]).await;
        assert_eq!(headers["x-shield-failovers"], "0");
        assert_eq!(body["x_shield"]["routing"]["excluded"], json!([{"target": "direct", "reason": "exhausted"}]));
    }
    assert_eq!(stack.received("direct").await.len(), 1, "parked for Retry-After: not hammered");

    // The health view shows it; an operator reset brings it back at once.
    let health = eventually(10, "the exhausted state in health", || async {
        let (_, body) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/health", None).await;
        body["targets"].as_array()?.iter().find(|t| t["target"] == "direct" && t["state"] == "exhausted").cloned()
    })
    .await;
    assert_eq!(health["last_error"], "quota_exhausted");
    let (status, _) = stack.admin_call(Method::POST, "/v1/tenant/me/gateway/targets/direct/reset", None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    eventually(10, "the reset to reach the proxy", || async {
        let (_, headers, _) = stack.chat(&key, chat_body("smart"), &[]).await;
        (headers["x-shield-target"] == "direct").then_some(())
    })
    .await;
    assert_eq!(stack.received("direct").await.len(), 2);
    let (status, _) = stack.admin_call(Method::POST, "/v1/tenant/me/gateway/targets/ghost/reset", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Issue 14: `402` is opt-in (the default `on` does not rescue a route from it) and a 429 whose
/// body says the quota is spent follows `429`; either way the target is parked. Issue 27: the
/// 402 that does not fail over reaches the caller as a 402 naming the target, in its own shape
/// (an OpenAI error; Anthropic's `billing_error`), not as a 502 that SDKs retry.
#[tokio::test]
async fn payment_required_is_opt_in_and_a_spent_quota_follows_429() {
    let stack = Stack::start().await;
    stack.mock_target("credits", "status:402", json!({})).await;
    stack.mock_target("credits-m", "status:402", json!({})).await;
    stack.mock_target("quota", "status:429;err:insufficient_quota", json!({})).await;
    stack.mock_target("backup-a", "", json!({})).await;
    stack.mock_target("backup-b", "", json!({})).await;
    stack.mock_target("backup-m", "", json!({})).await;
    stack.put_route("default-on", json!({"targets": ["credits", "backup-a"]})).await;
    stack.put_route("default-on-m", json!({"targets": ["credits-m", "backup-m"]})).await;
    stack
        .put_route(
            "no-429",
            json!({"targets": ["quota", "backup-b"], "failover": {"on": ["timeout", "connect", "5xx", "402"]}}),
        )
        .await;
    let (key, _) = stack.key(None).await;
    let (code, headers, body) = stack.chat(&key, chat_body("default-on"), &[]).await;
    assert_eq!(code, StatusCode::PAYMENT_REQUIRED, "relayed as the payment error it is: {body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("target `credits` answered 402"), "{body}");
    assert_eq!(headers["x-shield-target"], "credits");
    assert_eq!(body["x_shield"]["routing"]["halt"], "ineligible_failure", "{body}");
    let attempts = body["x_shield"]["routing"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{body}");
    assert_eq!(attempts[0]["class"], "quota_exhausted");
    // The same through /v1/messages: Anthropic's `billing_error`.
    let response = stack
        .client
        .post(format!("http://{}/v1/messages", stack.proxy))
        .header("x-api-key", &key)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "default-on-m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        (body["type"].as_str(), body["error"]["type"].as_str()),
        (Some("error"), Some("billing_error")),
        "{body}"
    );
    assert!(body["error"]["message"].as_str().unwrap().contains("credits-m"), "{body}");

    let (code, _, body) = stack.chat(&key, chat_body("no-429"), &[]).await;
    assert_eq!(code, StatusCode::BAD_GATEWAY, "not rescued: {body}");
    assert_eq!(body["error"]["code"], "ineligible_failure", "{body}");
    let attempts = body["error"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{body}");
    assert_eq!(
        (attempts[0]["target"].as_str(), attempts[0]["class"].as_str()),
        (Some("quota"), Some("quota_exhausted"))
    );
    assert_eq!(attempts[0]["status"], 429);
    for (route, failed) in [("default-on", "credits"), ("default-on-m", "credits-m"), ("no-429", "quota")] {
        // Parked regardless: the next call skips it and the backup answers.
        let (code, headers, body) = stack.chat(&key, chat_body(route), &[]).await;
        assert_eq!(code, StatusCode::OK, "{route}: {body}");
        assert_eq!(body["x_shield"]["routing"]["excluded"], json!([{"target": failed, "reason": "exhausted"}]));
        assert_eq!(headers["x-shield-failovers"], "0");
        assert_eq!(stack.received(failed).await.len(), 1, "{route}: parked, not called again");
    }
    assert_eq!(stack.received("backup-a").await.len(), 1);
    assert_eq!(stack.received("backup-b").await.len(), 1);
}

#[tokio::test]
async fn payment_required_fails_over_and_auth_errors_do_not() {
    let stack = Stack::start().await;
    stack.mock_target("credits", "status:402", json!({})).await;
    stack.mock_target("forbidden", "status:403", json!({})).await;
    stack.mock_target("backup", "", json!({})).await;
    stack
        .put_route(
            "credits",
            json!({"targets": ["credits", "backup"], "failover": {"on": ["timeout", "connect", "5xx", "402"]}}),
        )
        .await;
    stack.put_route("forbidden", json!({"targets": ["forbidden", "backup"], "failover": {"on": ["timeout", "connect", "429", "5xx", "402"]}})).await;
    let (key, _) = stack.key(None).await;
    let (_, headers, body) = stack.chat(&key, chat_body("credits"), &[]).await;
    assert_eq!(headers["x-shield-target"], "backup");
    assert_eq!(body["x_shield"]["routing"]["attempts"][0]["class"], "quota_exhausted");
    let (status, _, _) = stack.chat(&key, chat_body("forbidden"), &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a 403 is never exhaustion unless the body proves it");
    assert_eq!(stack.received("backup").await.len(), 1);
}

#[tokio::test]
async fn context_overflow_moves_only_to_a_larger_window_when_opted_in() {
    let stack = Stack::start().await;
    let small = json!({"capabilities": {"context_window": 4096}});
    stack.mock_target("small", "status:400;err:context_length_exceeded", small.clone()).await;
    stack.mock_target("same", "", small).await;
    stack.mock_target("large", "", json!({"capabilities": {"context_window": 128000}})).await;
    stack.put_route("opt-in", json!({"targets": ["small", "same", "large"], "failover": {"on": ["timeout", "connect", "429", "5xx", "context_length"]}})).await;
    stack.put_route("default", json!({"targets": ["small", "large"]})).await;
    let (key, _) = stack.key(None).await;
    let (status, headers, body) = stack.chat(&key, chat_body("opt-in"), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers["x-shield-target"], "large");
    assert!(
        body["x_shield"]["routing"]["excluded"]
            .as_array()
            .unwrap()
            .contains(&json!({"target": "same", "reason": "context_window"}))
    );
    assert_eq!(stack.received("same").await.len(), 0, "a window no larger cannot help");
    let (status, _, _) = stack.chat(&key, chat_body("default"), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "without the opt-in a context overflow is the caller's error");
}

#[tokio::test]
async fn capabilities_exclude_targets_before_anything_is_sent() {
    let stack = Stack::start().await;
    stack.mock_target("tiny", "", json!({"capabilities": {"context_window": 50, "tools": false}})).await;
    stack.mock_target("roomy", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["tiny", "roomy"]})).await;
    let (key, _) = stack.key(None).await;
    let long = json!({"model": "smart", "messages": [{"role": "user", "content": "x".repeat(400)}]});
    let (_, headers, body) = stack.chat(&key, long, &[]).await;
    assert_eq!(headers["x-shield-target"], "roomy");
    assert_eq!(body["x_shield"]["routing"]["excluded"], json!([{"target": "tiny", "reason": "context_window"}]));
    let tools = json!({"model": "smart", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]});
    let (_, _, body) = stack.chat(&key, tools, &[]).await;
    assert_eq!(body["x_shield"]["routing"]["excluded"], json!([{"target": "tiny", "reason": "tools_unsupported"}]));
    let (_, headers, _) = stack.chat(&key, chat_body("smart"), &[]).await;
    assert_eq!(headers["x-shield-target"], "tiny", "a request that fits goes to the first target");
    assert_eq!(stack.received("tiny").await.len(), 1);
}

#[tokio::test]
async fn openrouter_preferences_survive_every_attempt_and_keys_stay_home() {
    let stack = Stack::start().await;
    let provider = json!({"order": ["anthropic", "openai"], "only": ["anthropic", "openai"], "allow_fallbacks": false,
        "quantizations": ["fp16", "bf16"], "data_collection": "deny", "zdr": true, "max_price": {"prompt": 1, "completion": 2}});
    stack
        .mock_target(
            "direct",
            "status:429;err:insufficient_quota",
            json!({"auth": {"mode": "passthrough", "header": "X-Direct-Key", "scheme": ""}}),
        )
        .await;
    stack.mock_target("openrouter", "status:503", json!({"extra_body": {"provider": provider}})).await;
    stack.mock_target("openrouter-2", "", json!({"extra_body": {"provider": provider}})).await;
    stack.put_route("smart", json!({"targets": ["direct", "openrouter", "openrouter-2"]})).await;
    let (key, _) = stack.key(None).await;
    let (status, _, body) =
        stack.chat(&key, chat_body("smart"), &[("x-shield-upstream-key", "sk-caller-direct-key-0001")]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["x_shield"]["routing"]["attempts"].as_array().unwrap().len(),
        3,
        "one logical request, three attempts"
    );
    for id in ["openrouter", "openrouter-2"] {
        let received = stack.received(id).await;
        let sent: Value = serde_json::from_str(received[0]["body"].as_str().unwrap()).unwrap();
        assert_eq!(sent["provider"], provider, "{id}: the routing policy is passed intact");
        assert!(
            !received[0].to_string().contains("sk-caller-direct-key"),
            "{id}: the caller's direct key never reaches it"
        );
    }
}
