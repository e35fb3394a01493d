//! Webhooks end to end (seed §1's observable success, API.md "Webhooks"): a receiver on
//! localhost gets one correctly signed `budget_exceeded`, retried after a failure with every
//! attempt recorded; `gateway_target_down` is delivered too; creation is validated and the
//! signing secret is shown once.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_e2e::eventually;
use shield_e2e::stack::{Stack, StackOptions, chat_body};
use shield_e2e::webhook::{receiver, signature};

#[tokio::test]
async fn a_signed_budget_exceeded_reaches_localhost_once_after_a_retry() {
    budget_exceeded_delivered(StackOptions::default()).await;
}

/// The same on a Redis Cluster (issue 20): the deliverer's consumer group (XGROUP,
/// XREADGROUP, XACK) on the `gw_events` stream's node.
#[tokio::test]
async fn a_signed_budget_exceeded_is_delivered_from_a_redis_cluster() {
    budget_exceeded_delivered(StackOptions::on_cluster()).await;
}

async fn budget_exceeded_delivered(options: StackOptions) {
    let stack = Stack::start_with(options).await;
    let (url, received) = receiver(1).await;
    let (status, hook) = stack
        .admin_call(
            Method::POST,
            "/v1/tenant/me/webhooks",
            Some(json!({"url": url, "events": ["budget_exceeded", "gateway_target_down"], "allow_private": true})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{hook}");
    let secret = hook["secret"].as_str().unwrap().to_string();
    let (_, list) = stack.admin_call(Method::GET, "/v1/tenant/me/webhooks", None).await;
    assert!(!list.to_string().contains(&secret), "the secret is shown only at creation");

    stack.mock_target("a", "usage:10-20", json!({"price": {"input_per_mtok": 2.5, "output_per_mtok": 10}})).await;
    stack.put_route("capped", json!({"targets": ["a"], "budget": {"monthly": 0.0005, "at_limit": "block"}})).await;
    let (key, _) = stack.key(None).await;
    for _ in 0..5 {
        assert_eq!(stack.chat(&key, chat_body("capped"), &[]).await.0, StatusCode::OK);
    }
    // The first attempt is answered 500; the retry one second later is delivered.
    let deliveries = eventually(20, "a delivered attempt", || async {
        let (_, body) = stack
            .admin_call(
                Method::GET,
                &format!("/v1/tenant/me/webhooks/{}/deliveries", hook["id"].as_str().unwrap()),
                None,
            )
            .await;
        let deliveries = body["deliveries"].as_array()?.clone();
        deliveries.iter().any(|d| d["outcome"] == "delivered").then_some(deliveries)
    })
    .await;
    assert_eq!(deliveries.len(), 2, "{deliveries:?}");
    assert_eq!(
        (deliveries[1]["attempt"].as_i64(), deliveries[1]["status"].as_i64(), deliveries[1]["outcome"].as_str()),
        (Some(1), Some(500), Some("retrying"))
    );
    assert_eq!((deliveries[0]["attempt"].as_i64(), deliveries[0]["status"].as_i64()), (Some(2), Some(200)));

    let got = received.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "one event, two attempts");
    let (first, second) = (&got[0], &got[1]);
    assert_eq!(
        first.header("x-shield-delivery"),
        second.header("x-shield-delivery"),
        "the same idempotency id on every attempt"
    );
    assert_eq!(second.header("x-shield-event"), "budget_exceeded");
    assert_eq!(
        second.header("x-shield-signature"),
        signature(&secret, &second.body),
        "signed with the webhook's secret"
    );
    let body: Value = serde_json::from_str(&second.body).unwrap();
    assert_eq!(
        (body["type"].as_str(), body["tenant"].as_str()),
        (Some("budget_exceeded"), Some(stack.tenant.as_str()))
    );
    assert_eq!(body["data"]["route"], "capped");
    assert_eq!(body["data"]["limit"], 0.0005);
    assert!(body["created_at"].as_str().unwrap().starts_with("20"));
}

#[tokio::test]
async fn gateway_target_down_is_delivered_and_creation_is_validated() {
    let stack = Stack::start().await;
    let (url, received) = receiver(0).await;
    let (status, _) = stack
        .admin_call(
            Method::POST,
            "/v1/tenant/me/webhooks",
            Some(json!({"url": url, "events": ["gateway_target_down"], "allow_private": true})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    for (body, field) in [
        (json!({"url": url, "events": ["gateway_target_down"]}), "url"),
        (json!({"url": "https://hooks.example.com/x", "events": ["everything"]}), "events[0]"),
        (json!({"url": "https://hooks.example.com/x", "events": []}), "events"),
        (json!({"url": "ftp://hooks.example.com/x", "events": ["budget_exceeded"]}), "url"),
    ] {
        let (status, response) = stack.admin_call(Method::POST, "/v1/tenant/me/webhooks", Some(body)).await;
        assert_eq!(
            (status, response["error"]["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(field)),
            "{response}"
        );
    }

    stack.mock_target("flaky", "status:503", json!({})).await;
    stack.mock_target("steady", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["flaky", "steady"]})).await;
    let (key, _) = stack.key(None).await;
    for _ in 0..5 {
        stack.chat(&key, chat_body("smart"), &[]).await;
    }
    let event = eventually(15, "gateway_target_down", || async { received.lock().unwrap().first().cloned() }).await;
    assert_eq!(event.header("x-shield-event"), "gateway_target_down");
    let body: Value = serde_json::from_str(&event.body).unwrap();
    assert_eq!((body["data"]["target"].as_str(), body["data"]["failures"].as_u64()), (Some("flaky"), Some(5)));
}
