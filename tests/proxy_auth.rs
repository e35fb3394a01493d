//! Caller authentication and credentials (seed §8 item 6): keys resolved from Redis and cached,
//! revocation within the cache interval, fail-closed 503 when a key cannot be verified; vault
//! keys only to bound hosts, passthrough keys only to passthrough targets, the caller's Shield
//! key never upstream.

use reqwest::StatusCode;
use serde_json::json;
use shield_e2e::eventually;
use shield_e2e::process::PrivateRedis;
use shield_e2e::stack::{Stack, StackOptions, chat_body};

#[tokio::test]
async fn keys_are_checked_and_revocation_takes_effect() {
    let stack = Stack::start().await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    let (key, id) = stack.key(None).await;

    let (status, _, body) = stack.chat("sk-shield-not-a-real-key", chat_body("smart"), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let response = stack
        .client
        .post(format!("http://{}/v1/chat/completions", stack.proxy))
        .json(&chat_body("smart"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let response = stack
        .client
        .post(format!("http://{}/v1/chat/completions", stack.proxy))
        .header("x-api-key", &key)
        .json(&chat_body("smart"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "x-api-key works too");
    assert_eq!(stack.chat(&key, chat_body("smart"), &[]).await.0, StatusCode::OK);

    let (status, _) = stack.admin_call(reqwest::Method::DELETE, &format!("/v1/tenant/me/keys/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    eventually(5, "the revoked key to be refused", || async {
        (stack.chat(&key, chat_body("smart"), &[]).await.0 == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
}

#[tokio::test]
async fn credentials_go_only_where_they_belong() {
    let stack = Stack::start().await;
    let provider_key = shield_e2e::unique("sk-provider-");
    stack.put_secret("prod", &provider_key, &["127.0.0.1"]).await;
    stack.mock_target("vaulted", "", json!({"auth": {"mode": "vault", "secret_ref": "shield://prod"}})).await;
    stack
        .mock_target(
            "byok",
            "status:503",
            json!({"auth": {"mode": "passthrough", "header": "X-Provider-Key", "scheme": ""}}),
        )
        .await;
    stack.mock_target("keyless", "", json!({})).await;
    stack.put_route("vault", json!({"targets": ["vaulted"]})).await;
    stack.put_route("byok", json!({"targets": ["byok", "keyless"]})).await;
    let (shield_key, _) = stack.key(None).await;
    let byo = shield_e2e::unique("sk-caller-own-");

    let (status, _, body) = stack.chat(&shield_key, chat_body("vault"), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let vaulted = stack.received("vaulted").await;
    assert_eq!(
        vaulted[0]["headers"]["authorization"],
        format!("Bearer {provider_key}"),
        "the vault key goes to its bound host"
    );

    let (status, _, body) = stack.chat(&shield_key, chat_body("byok"), &[("x-shield-upstream-key", &byo)]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let byok = stack.received("byok").await;
    assert_eq!(byok[0]["headers"]["x-provider-key"], byo, "passthrough: the caller's key to the passthrough target");
    let keyless = stack.received("keyless").await;
    assert_eq!(keyless.len(), 1);
    assert!(!keyless[0].to_string().contains(&byo), "a failover to a target in another mode does not receive it");

    // Without the caller's key, the passthrough target is not eligible.
    let (status, _, body) = stack.chat(&shield_key, chat_body("byok"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["x_shield"]["routing"]["excluded"],
        json!([{"target": "byok", "reason": "credential_unavailable"}])
    );

    // The caller's Shield key never reaches any upstream, in any header or body.
    for request in stack.received_all().await {
        assert!(!request.to_string().contains(&shield_key), "Shield key forwarded: {request}");
        assert!(request["headers"].get("x-shield-upstream-key").is_none());
    }
    let logs = stack.all_logs();
    assert!(!logs.contains(&provider_key) && !logs.contains(&byo) && !logs.contains(&shield_key), "no key in any log");
}

#[tokio::test]
async fn redis_down_fails_closed_for_unknown_keys_and_keeps_serving_cached_ones() {
    let mut redis = PrivateRedis::start();
    let stack =
        Stack::start_with(StackOptions { redis_url: redis.url(), default_upstream: true, ..Default::default() }).await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    let (cached, _) = stack.key(None).await;
    let (never_used, _) = stack.key(None).await;
    assert_eq!(stack.chat(&cached, chat_body("smart"), &[]).await.0, StatusCode::OK);
    // Another tenant whose key is cached (a refused request verified it) but whose
    // configuration was never loaded.
    let other = stack.other_tenant_key().await;
    let (status, _, _) = stack.chat(&other, json!({"messages": []}), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    redis.stop();
    let (status, _, body) = stack.chat(&never_used, chat_body("smart"), &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "auth_unavailable");
    let (status, headers, _) = stack.chat(&cached, chat_body("smart"), &[]).await;
    assert_eq!(status, StatusCode::OK, "a cached key and snapshot keep serving through the outage");
    assert_eq!(headers.get("x-shield-route").unwrap(), "smart");
    // Seed §7: a cold configuration with the store down takes the default path, logged.
    let (status, headers, _) = stack.chat(&other, chat_body("smart"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("x-shield-route").is_none());
    assert_eq!(stack.received("default").await.len(), 1);
    assert!(stack.all_logs().contains("routing configuration unavailable; calls take the default path"));

    redis.restart();
    // Redis came back empty: the admin republishes, and the unknown key works again.
    eventually(20, "the key to verify again", || async {
        (stack.chat(&never_used, chat_body("smart"), &[]).await.0 == StatusCode::OK).then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_proxy_starts_without_redis_and_becomes_ready_when_it_arrives() {
    let mut redis = PrivateRedis::start();
    redis.stop();
    let stack =
        Stack::start_with(StackOptions { redis_url: redis.url(), start_admin: false, ..Default::default() }).await;
    let ready = format!("http://{}/readyz", stack.proxy);
    assert_eq!(reqwest::get(&ready).await.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    let (status, _, body) = stack.chat("sk-shield-anything", chat_body("smart"), &[]).await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::SERVICE_UNAVAILABLE, json!("auth_unavailable")));
    redis.restart();
    eventually(20, "/readyz to turn 200", || async {
        reqwest::get(&ready).await.ok().filter(|r| r.status().is_success()).map(|_| ())
    })
    .await;
    let (status, _, _) = stack.chat("sk-shield-anything", chat_body("smart"), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "now the key can be checked, and it is unknown");
    assert!(stack.all_logs().contains("Redis is not reachable"), "says so once");
}
