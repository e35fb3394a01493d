//! Webhooks end to end (seed §1's observable success, API.md "Webhooks"): a receiver on
//! localhost gets one correctly signed `budget_exceeded`, retried after a failure with every
//! attempt recorded; `gateway_target_down` is delivered too; creation is validated and the
//! signing secret is shown once.

use std::sync::{Arc, Mutex};

use hmac::{Hmac, Mac};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::Sha256;
use shield_e2e::eventually;
use shield_e2e::stack::{Stack, StackOptions, chat_body};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

#[derive(Debug, Clone)]
struct Received {
    headers: Vec<(String, String)>,
    body: String,
}

impl Received {
    fn header(&self, name: &str) -> &str {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).unwrap_or("")
    }
}

/// A minimal HTTP receiver: records each request; answers 500 to the first `failures`.
async fn receiver(failures: usize) -> (String, Arc<Mutex<Vec<Received>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log: Arc<Mutex<Vec<Received>>> = Arc::default();
    let seen = log.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                reader.read_line(&mut line).await.ok();
                let mut headers = Vec::new();
                loop {
                    line.clear();
                    if reader.read_line(&mut line).await.unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.trim_end().split_once(": ") {
                        headers.push((k.to_string(), v.to_string()));
                    }
                }
                let length: usize = headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0; length];
                reader.read_exact(&mut body).await.ok();
                let n = {
                    let mut log = seen.lock().unwrap();
                    log.push(Received { headers, body: String::from_utf8_lossy(&body).to_string() });
                    log.len()
                };
                let status = if n <= failures { "500 Internal Server Error" } else { "200 OK" };
                let _ = reader
                    .get_mut()
                    .write_all(
                        format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").as_bytes(),
                    )
                    .await;
            });
        }
    });
    (format!("http://{addr}/hook"), log)
}

fn signature(secret: &str, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    format!("sha256={}", hex(&mac.finalize().into_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

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
